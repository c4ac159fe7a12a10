package iobench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"path/filepath"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
)

// Devices for GPUOptions.Device.
const (
	DeviceAuto = "auto" // CUDA when it opens, else the simulated device
	DeviceSim  = "sim"  // host memory standing in for a GPU
	DeviceCUDA = "cuda" // a real NVIDIA GPU, or an error saying what is missing
)

// verifyChunkBytes is the unit Verify compares in, so checking a 1 GiB
// transfer holds two 8 MiB host buffers, not two copies of the transfer.
const verifyChunkBytes = 8 << 20

// patternChunkBytes is the unit of the reproducible fill pattern: chunk k is
// ChaCha8 output seeded with k, so any range can be regenerated alone.
const patternChunkBytes = 1 << 20

// GPUOptions describe a device measurement, DeepSpeed ds_io's --gpu mode: a
// device buffer of SizeBytes moved to or from one file, either through the
// bounce path (NVMe -> pinned host buffer -> device, and back) or, with GDS,
// by GPUDirect Storage (cuFile) straight between NVMe and device memory.
//
// Options (the embedded measurement) is read as Run reads it: Dir,
// SizeBytes, Op, Loops, Warmup, FileName, Keep, Progress and Logger, and
// Engine for the aio engine of the bounce path and the piece size and
// parallelism of both paths. Naive does not apply.
type GPUOptions struct {
	Options
	// Device is "auto" (CUDA when a GPU opens, else the simulated device;
	// the result says which, and why), "sim" or "cuda". Default "auto".
	Device string
	// GDS uses GPUDirect Storage (cuFile) instead of the bounce path. It
	// needs a CUDA device; when gds.Available reports that GPUDirect Storage
	// cannot run, RunGPU fails with that error.
	GDS bool
	// BounceBlockBytes is the bounce path's staging piece: each of
	// Engine.IntraOpParallelism slots holds two staging buffers of it, one
	// filling from the file while the other copies to the device. Default
	// Engine.BlockSizeBytes x Engine.QueueDepth (so the aio engine keeps
	// QueueDepth blocks in flight per piece), capped at SizeBytes rounded up
	// to a multiple of 4096, at most 1 GiB.
	BounceBlockBytes int64
	// Verify checks the bytes after the timed loops: for writes, the file
	// must hold the pattern the device buffer held, and after clearing the
	// device buffer and reading the file back into it, the device must hold
	// it again (a full write + read round trip); for reads, the device must
	// hold exactly the file's bytes. A mismatch is an error naming the first
	// differing offset.
	Verify bool
	// CUDA selects the CUDA driver library and device (tests point it at a
	// stand-in library). Its CapacityBytes is ignored: the buffer's size is
	// what the run needs.
	CUDA cuda.Options
	// GDSLibrary is the cuFile library (default gds.DefaultLibrary, or
	// $ZINF_CUFILE_LIBRARY).
	GDSLibrary string
}

// GPUResult is one device measurement: Result's fields (JSON as `zinf io
// --json`) plus what was measured.
type GPUResult struct {
	Result
	// Device is "sim" or "cuda": the device the buffer lived on.
	Device string `json:"device"`
	// DeviceName is the device's own name ("sim", "cuda:0 NVIDIA H100...").
	DeviceName string `json:"device_name"`
	// DeviceNote says why the device is simulated when Device was "auto".
	DeviceNote string `json:"device_note,omitempty"`
	// Mode is "bounce" or "gds" (gds.DeviceIO.Mode).
	Mode string `json:"mode"`
	// BounceBlock and BouncePar are the bounce path's staging piece size and
	// slot count (0 for gds).
	BounceBlock int64 `json:"bounce_block_size,omitempty"`
	BouncePar   int   `json:"bounce_parallel,omitempty"`
	// Verified reports the Verify check (absent when not asked for).
	Verified *bool `json:"verified,omitempty"`
}

// Check validates o: every problem at once, before anything is opened.
func (o *GPUOptions) Check() error {
	var errs []error
	if err := o.Options.Check(); err != nil {
		errs = append(errs, err)
	}
	if o.Naive {
		errs = append(errs, errors.New("--naive measures plain host file I/O and cannot be combined with --gpu"))
	}
	switch o.Device {
	case DeviceAuto, DeviceSim, DeviceCUDA:
	default:
		errs = append(errs, fmt.Errorf("--device %q is invalid (allowed: auto, sim, cuda)", o.Device))
	}
	if o.GDS && o.Device == DeviceSim {
		errs = append(errs, errors.New("--gds needs a CUDA device: GPUDirect Storage moves data into GPU memory, and --device sim has none (use --device auto or cuda)"))
	}
	if o.BounceBlockBytes < 0 || o.BounceBlockBytes%4096 != 0 || o.BounceBlockBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("--bounce-block %d is invalid (allowed: 0 for the default, or a multiple of 4096 up to 1GiB)", o.BounceBlockBytes))
	}
	return errors.Join(errs...)
}

// RunGPU performs a device measurement (see GPUOptions).
func RunGPU(ctx context.Context, o GPUOptions) (*GPUResult, error) {
	if o.Loops == 0 {
		o.Loops = 5
	}
	if o.Device == "" {
		o.Device = DeviceAuto
	}
	if err := o.Check(); err != nil {
		return nil, err
	}
	o.fill()
	gopts := gds.Options{BlockSizeBytes: int64(o.Engine.BlockSizeBytes), Parallelism: min(o.Engine.IntraOpParallelism, gds.MaxParallelism),
		Library: o.GDSLibrary, Direct: o.Engine.Direct, CUDA: o.CUDA, Paths: []string{o.Dir}, Logger: o.Logger}
	if o.GDS {
		// Say what is missing before touching anything else.
		if err := gds.Available(gopts); err != nil {
			return nil, err
		}
	}
	dev, res, err := openBenchDevice(o)
	if err != nil {
		return nil, err
	}
	defer dev.Close()

	var dio gds.DeviceIO
	var pool *buffers.Pool
	if o.GDS {
		cd, ok := dev.(*cuda.Device)
		if !ok {
			return nil, fmt.Errorf("--gds needs a CUDA device; the device is %s", dev.Name())
		}
		e, err := gds.Open(cd, gopts)
		if err != nil {
			return nil, err
		}
		dio = e
		res.Backend = "cufile"
	} else {
		eng, err := aio.New(o.Engine)
		if err != nil {
			return nil, err
		}
		defer eng.Close()
		block := o.bounceBlock()
		par := min(o.Engine.IntraOpParallelism, gds.MaxParallelism)
		pool, err = buffers.NewPool(buffers.Options{CapacityBytes: 2 * int64(par) * nextPow2(block), Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		b, err := gds.NewBounce(dev, eng, pool, gds.BounceOptions{BlockSizeBytes: block, Parallelism: par, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		dio = b
		res.Backend = eng.Name()
		res.BounceBlock, res.BouncePar, res.Pinned = block, par, pool.Pinned()
	}
	// Close the DeviceIO (deregistering buffers and handles) before the
	// engine, pool and device deferred above.
	defer dio.Close()
	res.Mode = dio.Mode()

	m, err := dev.Alloc(o.SizeBytes)
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes on %s: %w", o.SizeBytes, dev.Name(), err)
	}
	defer dev.Free(m)
	if e, ok := dio.(*gds.Engine); ok {
		if err := e.RegisterBuffer(m); err != nil {
			return nil, err
		}
		defer e.DeregisterBuffer(m)
	}
	if err := fillDevice(dev, m, o.SizeBytes); err != nil {
		return nil, err
	}

	path := filepath.Join(o.Dir, o.FileName)
	df, err := claimDataFile(path, o.Op, o.SizeBytes, o.private, o.Overwrite)
	if err != nil {
		return nil, err
	}
	if !o.Keep {
		defer df.remove()
	}
	f, err := dio.OpenFile(path, df.openFlags(), 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := df.check(f.AIO().Fd()); err != nil {
		return nil, err
	}
	res.Op, res.Bytes, res.Loops, res.Path = o.Op, o.SizeBytes, o.Loops, path
	res.BlockSize, res.QueueDepth, res.Parallel = o.Engine.BlockSizeBytes, o.Engine.QueueDepth, o.Engine.IntraOpParallelism
	res.SingleSub, res.Overlap = o.Engine.SingleSubmit, !o.Engine.SerialEvents
	res.Direct, res.AlignBytes = f.Direct(), f.Alignment()
	if o.GDS {
		res.QueueDepth, res.SingleSub, res.Overlap = 0, false, false // aio knobs; cuFile has none of them
	}
	err = measure(ctx, o.Options, &res.Result, res.Mode+" ", f.AIO(), transfer{
		read:  func(ctx context.Context) (int64, error) { return dio.ReadToDevice(ctx, f, m, 0, 0, o.SizeBytes) },
		write: func(ctx context.Context) (int64, error) { return dio.WriteFromDevice(ctx, f, m, 0, 0, o.SizeBytes) },
	})
	if err != nil {
		return nil, err
	}

	if o.Verify {
		if err := verifyGPU(ctx, o, dev, dio, f, m, df); err != nil {
			return nil, err
		}
		ok := true
		res.Verified = &ok
	}
	return res, nil
}

// bounceBlock is the bounce path's staging piece (see BounceBlockBytes).
func (o *GPUOptions) bounceBlock() int64 {
	if o.BounceBlockBytes > 0 {
		return o.BounceBlockBytes
	}
	b := int64(o.Engine.BlockSizeBytes) * int64(max(o.Engine.QueueDepth, 1))
	b = min(b, (o.SizeBytes+4095)/4096*4096, 1<<30)
	return max((b+4095)/4096*4096, 4096)
}

func nextPow2(n int64) int64 { return int64(1) << bits.Len64(uint64(n-1)) }

// openBenchDevice opens the device o asks for, with room for the buffer,
// and starts the result with what it is.
func openBenchDevice(o GPUOptions) (accel.Device, *GPUResult, error) {
	res := &GPUResult{}
	if o.Device != DeviceSim {
		co := o.CUDA
		co.CapacityBytes = 0
		d, err := cuda.Open(co)
		if err == nil {
			res.Device, res.DeviceName = DeviceCUDA, d.Name()
			return d, res, nil
		}
		if o.Device == DeviceCUDA || o.GDS {
			return nil, nil, fmt.Errorf("--device %s: %w", o.Device, err)
		}
		res.DeviceNote = "no usable GPU, so the device is simulated in host memory (host-to-device copies are memcpy): " + err.Error()
	}
	s, err := accel.NewSim(accel.SimOptions{CapacityBytes: o.SizeBytes, Name: DeviceSim})
	if err != nil {
		return nil, nil, err
	}
	res.Device, res.DeviceName = DeviceSim, s.Name()
	return s, res, nil
}

// fillPattern writes the reproducible pattern for bytes [off, off+len(b))
// into b; off must be a multiple of patternChunkBytes unless b ends within
// the chunk off lies in.
func fillPattern(b []byte, off int64) {
	for len(b) > 0 {
		k := off / patternChunkBytes
		skip := off % patternChunkBytes
		n := min(int64(len(b)), patternChunkBytes-skip)
		r := rand.NewChaCha8([32]byte{byte(k), byte(k >> 8), byte(k >> 16), byte(k >> 24), 'z', 'i', 'n', 'f'})
		if skip > 0 {
			io.CopyN(io.Discard, r, skip)
		}
		r.Read(b[:n])
		b, off = b[n:], off+n
	}
}

// fillDevice fills m's first size bytes with the pattern.
func fillDevice(dev accel.Device, m accel.Mem, size int64) error {
	return chunked(dev, size, func(st accel.Stream, buf []byte, off int64) error {
		fillPattern(buf, off)
		return dev.CopyToDevice(st, m, off, buf)
	})
}

// clearDevice zeroes m's first size bytes.
func clearDevice(dev accel.Device, m accel.Mem, size int64) error {
	return chunked(dev, size, func(st accel.Stream, buf []byte, off int64) error {
		clear(buf)
		return dev.CopyToDevice(st, m, off, buf)
	})
}

// chunked calls fn for each verifyChunkBytes piece of [0, size) with a host
// buffer of the piece's length, synchronizing the stream after each so the
// buffer can be reused.
func chunked(dev accel.Device, size int64, fn func(st accel.Stream, buf []byte, off int64) error) error {
	st, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer st.Close()
	buf := make([]byte, min(size, verifyChunkBytes))
	for off := int64(0); off < size; off += verifyChunkBytes {
		b := buf[:min(verifyChunkBytes, size-off)]
		if err := fn(st, b, off); err != nil {
			return err
		}
		if err := st.Synchronize(); err != nil {
			return err
		}
	}
	return nil
}

// verifyGPU checks the bytes (see GPUOptions.Verify).
func verifyGPU(ctx context.Context, o GPUOptions, dev accel.Device, dio gds.DeviceIO, f *gds.File, m accel.Mem, df *dataFile) error {
	size := o.SizeBytes
	if o.Op == "write" {
		// The file holds what the device held ...
		if err := compareFile(df, size); err != nil {
			return fmt.Errorf("verify: after writing from the device: %w", err)
		}
		// ... and reading it back into the cleared buffer restores it.
		if err := clearDevice(dev, m, size); err != nil {
			return err
		}
		if _, err := dio.ReadToDevice(ctx, f, m, 0, 0, size); err != nil {
			return fmt.Errorf("verify: reading back: %w", err)
		}
	}
	return compareDevice(dev, m, df, size)
}

// compareFile checks that the data file starts with the pattern.
func compareFile(df *dataFile, size int64) error {
	path := df.path
	file, err := df.openRead()
	if err != nil {
		return err
	}
	defer file.Close()
	got := make([]byte, min(size, verifyChunkBytes))
	want := make([]byte, len(got))
	for off := int64(0); off < size; off += verifyChunkBytes {
		n := min(verifyChunkBytes, size-off)
		if _, err := file.ReadAt(got[:n], off); err != nil {
			return fmt.Errorf("reading %s at %d: %w", path, off, err)
		}
		fillPattern(want[:n], off)
		if i := firstDiff(got[:n], want[:n]); i >= 0 {
			return fmt.Errorf("%s differs from the bytes written at offset %d (got %#x, want %#x)", path, off+int64(i), got[i], want[i])
		}
	}
	return nil
}

// compareDevice checks that m's first size bytes equal the file's.
func compareDevice(dev accel.Device, m accel.Mem, df *dataFile, size int64) error {
	path := df.path
	file, err := df.openRead()
	if err != nil {
		return err
	}
	defer file.Close()
	want := make([]byte, min(size, verifyChunkBytes))
	return chunked(dev, size, func(st accel.Stream, got []byte, off int64) error {
		if err := dev.CopyFromDevice(st, got, m, off); err != nil {
			return err
		}
		if err := st.Synchronize(); err != nil {
			return err
		}
		w := want[:len(got)]
		if _, err := file.ReadAt(w, off); err != nil {
			return fmt.Errorf("verify: reading %s at %d: %w", path, off, err)
		}
		if i := firstDiff(got, w); i >= 0 {
			return fmt.Errorf("verify: device bytes differ from %s at offset %d (device %#x, file %#x)", path, off+int64(i), got[i], w[i])
		}
		return nil
	})
}

// firstDiff returns the first index where a and b (equal lengths) differ,
// or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
