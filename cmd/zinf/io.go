package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
)

func init() {
	register("io", "measure read or write bandwidth on a path (like DeepNVMe's ds_io)", runIO)
}

func runIO(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("io", stderr)
	var (
		o      iobench.Options
		ef     engineFlags
		asJSON bool
		g      gpuFlags
	)
	fs.StringVar(&o.Dir, "path", "", "directory on the device to measure (required)")
	sizeVar(fs, &o.SizeBytes, "size", 1<<30, "file and buffer size (e.g. 1GiB, 64MiB)")
	fs.StringVar(&o.Op, "op", "read", "read or write")
	fs.IntVar(&o.Loops, "loops", 5, "timed passes")
	fs.IntVar(&o.Warmup, "warmup", 1, "untimed passes before them")
	fs.BoolVar(&o.Keep, "keep", false, "keep the data file (reads reuse it)")
	fs.BoolVar(&o.Overwrite, "overwrite", false, "with --op write: rewrite a data file already there (a regular file of yours, never a link), as ds_io does; it is kept")
	fs.StringVar(&o.FileName, "file", "", "file name inside --path (default zinf-io-<size>.dat)")
	fs.BoolVar(&o.Naive, "naive", false, "plain os.File I/O (+fsync; reads after dropping the page cache) for contrast")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object")
	ef.register(fs)
	g.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	eo, err := ef.options()
	if err != nil {
		return err
	}
	o.Engine = eo
	if o.Loops <= 0 {
		return fmt.Errorf("--loops %d is invalid: it must be at least 1", o.Loops)
	}
	if err := noExplicitZero(fs, "bounce-block"); err != nil {
		return err
	}
	if g.gds {
		g.gpu = true // GPUDirect Storage moves data into device memory
	}
	if err := ioResources(o, g); err != nil {
		return err
	}
	o.Logger = cliLogger(stderr)
	if !asJSON {
		o.Progress = stderr
	}
	if !g.gpu {
		if err := g.hostOnly(fs); err != nil {
			return err
		}
	} else {
		return runIOGPU(ctx, iobench.GPUOptions{Options: o, Device: g.device, GDS: g.gds, BounceBlockBytes: g.bounceBlock, Verify: g.verify},
			asJSON, stdout)
	}
	res, err := iobench.Run(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "%s %s: %d bytes x %d loops, backend %s, block %d, qd %d, parallel %d, O_DIRECT %v (align %d), pinned %v, registered %v\n",
		res.Op, res.Path, res.Bytes, res.Loops, res.Backend, res.BlockSize, res.QueueDepth, res.Parallel, res.Direct, res.AlignBytes, res.Pinned, res.Registered)
	fmt.Fprintf(stdout, "GB/s: median %.3f  min %.3f  max %.3f\n", res.GBpsMedian, res.GBpsMin, res.GBpsMax)
	if res.CacheNote != "" {
		fmt.Fprintln(stdout, "note:", res.CacheNote)
	}
	return nil
}

// gpuFlags select a device measurement (ds_io's --gpu and --use_gds).
type gpuFlags struct {
	gpu, gds, verify bool
	device           string
	bounceBlock      int64
}

func (g *gpuFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&g.gpu, "gpu", false, "move the bytes to and from device memory: NVMe -> pinned host buffer -> device and back (the bounce path)")
	fs.BoolVar(&g.gds, "gds", false, "with --gpu: GPUDirect Storage (cuFile), NVMe <-> device directly; fails if it is unavailable here (implies --gpu)")
	fs.StringVar(&g.device, "device", iobench.DeviceAuto, "with --gpu: auto (CUDA when a GPU works, else the simulated device), sim, or cuda")
	sizeVar(fs, &g.bounceBlock, "bounce-block", 0, "with --gpu: bounce staging piece size (default block-size x queue-depth, at most --size)")
	fs.BoolVar(&g.verify, "verify", false, "with --gpu: check the bytes after the loops (writes: file and a read back into the cleared buffer; reads: device vs file)")
}

// hostOnly rejects the device flags without --gpu.
func (g *gpuFlags) hostOnly(fs *flag.FlagSet) error {
	var set []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "device", "bounce-block", "verify":
			set = append(set, "--"+f.Name)
		}
	})
	if len(set) > 0 {
		return fmt.Errorf("%s apply to device measurements: add --gpu", strings.Join(set, ", "))
	}
	return nil
}

func runIOGPU(ctx context.Context, o iobench.GPUOptions, asJSON bool, stdout io.Writer) error {
	res, err := iobench.RunGPU(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	dev := res.Device + " (" + res.DeviceName + ")"
	if res.Device == iobench.DeviceSim {
		dev = "sim (SIMULATED in host memory, not a GPU)"
	}
	path := "bounce (NVMe -> pinned host buffer -> device)"
	if res.Mode == "gds" {
		path = "gds (GPUDirect Storage: NVMe <-> device, no host copy)"
	}
	fmt.Fprintf(stdout, "%s %s: %d bytes x %d loops, device %s, mode %s\n", res.Op, res.Path, res.Bytes, res.Loops, dev, path)
	if res.Mode == "gds" {
		fmt.Fprintf(stdout, "cuFile: block %d, parallel %d, O_DIRECT %v (align %d)\n", res.BlockSize, res.Parallel, res.Direct, res.AlignBytes)
	} else {
		fmt.Fprintf(stdout, "backend %s, block %d, qd %d, parallel %d, O_DIRECT %v (align %d), staging %d x %d bytes, pinned %v\n",
			res.Backend, res.BlockSize, res.QueueDepth, res.Parallel, res.Direct, res.AlignBytes, 2*res.BouncePar, res.BounceBlock, res.Pinned)
	}
	fmt.Fprintf(stdout, "GB/s: median %.3f  min %.3f  max %.3f\n", res.GBpsMedian, res.GBpsMin, res.GBpsMax)
	if res.DeviceNote != "" {
		fmt.Fprintln(stdout, "note:", res.DeviceNote)
	}
	if res.CacheNote != "" {
		fmt.Fprintln(stdout, "note:", res.CacheNote)
	}
	if res.Verified != nil {
		fmt.Fprintln(stdout, "verified: the bytes on the device match the file")
	}
	return nil
}

// ioResources checks --size against the memory the measurement holds and
// the disk space its file takes, before anything is allocated or written.
func ioResources(o iobench.Options, g gpuFlags) error {
	if o.SizeBytes <= 0 {
		return nil // Check names the flag and the allowed values
	}
	var need int64
	var what string
	switch {
	case g.gpu && g.device == iobench.DeviceCUDA:
		// The buffer lives in device memory; the host holds staging
		// pieces only.
	case g.gpu:
		need, what = o.SizeBytes, "the device buffer (the simulated device lives in host memory)"
	case o.Naive:
		need, what = o.SizeBytes, "its buffer"
	default:
		// One pinned buffer of the whole size, in a pool rounded up to a
		// power of two.
		need, what = nextPow2(max(o.SizeBytes, 1<<20)), "its buffer (one pinned buffer of --size, in a pool rounded up to a power of two)"
	}
	if need > 0 {
		if err := checkMemory("--size", o.SizeBytes, need, what); err != nil {
			return err
		}
	}
	if o.Op == "read" {
		// A read reuses a file of that name holding --size bytes; only a
		// missing one is created and filled.
		name := o.FileName
		if name == "" {
			name = fmt.Sprintf("zinf-io-%d.dat", o.SizeBytes)
		}
		if st, err := os.Lstat(filepath.Join(o.Dir, name)); err == nil && st.Mode().IsRegular() && st.Size() >= o.SizeBytes {
			return nil
		}
	}
	if o.Op == "write" && o.Overwrite {
		// Rewritten in place: only what the file lacks is new space.
		name := o.FileName
		if name == "" {
			name = fmt.Sprintf("zinf-io-%d.dat", o.SizeBytes)
		}
		if st, err := os.Lstat(filepath.Join(o.Dir, name)); err == nil && st.Mode().IsRegular() {
			if grow := o.SizeBytes - st.Size(); grow > 0 {
				return checkDisk("--size", o.SizeBytes, grow, o.Dir)
			}
			return nil
		}
	}
	return checkDisk("--size", o.SizeBytes, o.SizeBytes, o.Dir)
}
