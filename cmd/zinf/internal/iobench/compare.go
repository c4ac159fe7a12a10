package iobench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/metrics/stats"
)

// CompareOptions describe a zinf-versus-fio comparison on one file.
type CompareOptions struct {
	Dir        string
	SizeBytes  int64 // default 1 GiB
	BlockSize  int   // default 1 MiB
	QueueDepth int   // default aio.DefaultQueueDepth
	Rounds     int   // interleaved rounds; default 5
	FioPath    string
	Progress   io.Writer
	// Logger receives engine warnings (default slog.Default()).
	Logger *slog.Logger
}

// Pair is one line of the comparison: zinf's backend against fio's engine
// for one op, with the per-round figures and their medians (GB/s).
type Pair struct {
	Op        string
	Zinf, Fio string // "uring" vs "io_uring", ...; Fio empty for contrast rows
	ZinfGBps  []float64
	FioGBps   []float64
}

// Ratio is median(zinf) / median(fio).
func (p Pair) Ratio() float64 {
	f := stats.Median(p.FioGBps)
	if f == 0 {
		return 0
	}
	return stats.Median(p.ZinfGBps) / f
}

// CompareResult holds every pair.
type CompareResult struct {
	Opts  CompareOptions
	Pairs []*Pair
	When  time.Time
}

// FioBandwidth runs one fio job on file and returns its bandwidth in GB/s.
func FioBandwidth(ctx context.Context, fio, file string, op, engine string, size int64, bs, qd int) (float64, error) {
	args := []string{"--name=zinf-compare", "--filename=" + file, "--size=" + strconv.FormatInt(size, 10),
		"--rw=" + op, "--bs=" + strconv.Itoa(bs), "--iodepth=" + strconv.Itoa(qd), "--direct=1",
		"--ioengine=" + engine, "--numjobs=1"}
	rep, err := RunFio(ctx, fio, args)
	if err != nil {
		return 0, err
	}
	bw := rep.Read.BwBytes
	if op == "write" {
		bw = rep.Write.BwBytes
	}
	return bw / 1e9, nil
}

// Compare interleaves zinf and fio runs on the same file: per round, per
// backend pair (uring/io_uring, libaio/libaio), per op, zinf and fio (zinf
// first in odd rounds, fio first in even ones); then
// zinf posix and naive Go for contrast.
func Compare(ctx context.Context, o CompareOptions) (*CompareResult, error) {
	if o.SizeBytes == 0 {
		o.SizeBytes = 1 << 30
	}
	if o.BlockSize == 0 {
		o.BlockSize = 1 << 20
	}
	if o.QueueDepth == 0 {
		o.QueueDepth = aio.DefaultQueueDepth
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.Rounds < 0 {
		return nil, fmt.Errorf("--rounds %d is invalid: it must be at least 1", o.Rounds)
	}
	if o.FioPath == "" {
		p, err := exec.LookPath("fio")
		if err != nil {
			return nil, fmt.Errorf("fio not found on PATH (apt-get install -y fio): %w", err)
		}
		o.FioPath = p
	} else if p, err := exec.LookPath(o.FioPath); err != nil {
		return nil, fmt.Errorf("--fio %q: %w", o.FioPath, err)
	} else {
		o.FioPath = p
	}
	// Everything is checked before the first byte is written.
	check := Options{Dir: o.Dir, SizeBytes: o.SizeBytes, Op: "write",
		Engine: aio.Options{Backend: aio.BackendPosix, BlockSizeBytes: o.BlockSize, QueueDepth: o.QueueDepth, Direct: aio.DirectRequired}}
	if err := check.Check(); err != nil {
		return nil, err
	}
	// Both tools rewrite the file many times, so it lives in a directory
	// only this user can enter, created (and removed) by this run: a name
	// planted in a shared --path can never be written through.
	rd, err := privateDir(o.Dir, "compare", o.Logger)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	pdir := rd.Path()
	name := fmt.Sprintf("zinf-compare-%d.dat", o.SizeBytes)
	file := filepath.Join(pdir, name)
	res := &CompareResult{Opts: o, When: time.Now()}
	pairs := map[string]*Pair{}
	get := func(op, z, f string) *Pair {
		k := op + z + f
		if p, ok := pairs[k]; ok {
			return p
		}
		p := &Pair{Op: op, Zinf: z, Fio: f}
		pairs[k] = p
		res.Pairs = append(res.Pairs, p)
		return p
	}
	zinf := func(op, backend string, naive bool) (float64, error) {
		r, err := Run(ctx, Options{Dir: pdir, private: true, SizeBytes: o.SizeBytes, Op: op, Loops: 1, Warmup: 0, Keep: true, FileName: name, Naive: naive, Logger: o.Logger,
			Engine: aio.Options{Backend: backend, BlockSizeBytes: o.BlockSize, QueueDepth: o.QueueDepth, Direct: aio.DirectRequired}})
		if err != nil {
			return 0, err
		}
		return r.GBpsMedian, nil
	}
	// Lay the file out once, untimed, so that no tool's first write pays
	// for block allocation (O_DIRECT writes that extend a file or fill
	// unwritten extents are serialized by the filesystem).
	if _, err := zinf("write", aio.BackendAuto, false); err != nil {
		return nil, err
	}
	var engines [][2]string
	for _, e := range [][2]string{{aio.BackendUring, "io_uring"}, {aio.BackendLibaio, "libaio"}} {
		if err := aio.Available(e[0]); err != nil {
			// A kernel or sandbox without the backend still gets the rest.
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "skipping %s: %v\n", e[0], err)
			}
			continue
		}
		engines = append(engines, e)
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, op := range []string{"write", "read"} {
			for _, e := range engines {
				// Alternate who goes first: on a virtual disk the host's
				// cache and burst credits favour whichever run follows a
				// warm-up, so a fixed order would bias the ratio.
				var z, f float64
				var err error
				runZinf := func() { z, err = zinf(op, e[0], false) }
				runFio := func() {
					f, err = FioBandwidth(ctx, o.FioPath, file, op, e[1], o.SizeBytes, o.BlockSize, o.QueueDepth)
				}
				first, second := runZinf, runFio
				if round%2 == 0 {
					first, second = runFio, runZinf
				}
				if first(); err != nil {
					return nil, err
				}
				if second(); err != nil {
					return nil, err
				}
				p := get(op, e[0], e[1])
				p.ZinfGBps = append(p.ZinfGBps, z)
				p.FioGBps = append(p.FioGBps, f)
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "round %d/%d %-5s zinf %-6s %.3f GB/s   fio %-8s %.3f GB/s\n", round, o.Rounds, op, e[0], z, e[1], f)
				}
			}
			for _, c := range []struct {
				name  string
				naive bool
			}{{aio.BackendPosix, false}, {"naive-go", true}} {
				z, err := zinf(op, aio.BackendPosix, c.naive)
				if err != nil {
					return nil, err
				}
				p := get(op, c.name, "")
				p.ZinfGBps = append(p.ZinfGBps, z)
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "round %d/%d %-5s %-12s %.3f GB/s\n", round, o.Rounds, op, c.name, z)
				}
			}
		}
	}
	return res, nil
}

// WriteTable prints medians, min..max and ratios.
func (r *CompareResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "file %s x %d interleaved rounds, block %d, queue depth %d, O_DIRECT; GB = 1e9 bytes\n",
		filepath.Join(r.Opts.Dir, "zinf-compare-*", "zinf-compare-*.dat"), r.Opts.Rounds, r.Opts.BlockSize, r.Opts.QueueDepth)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "op\tzinf\tmedian GB/s\t(min..max)\tfio\tmedian GB/s\t(min..max)\tzinf/fio")
	for _, p := range r.Pairs {
		zmin, zmax := stats.MinMax(p.ZinfGBps)
		if p.Fio == "" {
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t(%.3f..%.3f)\t-\t-\t-\t-\n", p.Op, p.Zinf, stats.Median(p.ZinfGBps), zmin, zmax)
			continue
		}
		fmin, fmax := stats.MinMax(p.FioGBps)
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t(%.3f..%.3f)\t%s\t%.3f\t(%.3f..%.3f)\t%.3f\n", p.Op, p.Zinf, stats.Median(p.ZinfGBps), zmin, zmax, p.Fio, stats.Median(p.FioGBps), fmin, fmax, p.Ratio())
	}
	return tw.Flush()
}
