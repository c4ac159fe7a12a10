package iobench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/zinfio/zinf/aio"
)

// MixedOptions describe a measurement of the disk under reads and writes
// at once, as a training step loads it: one stream reading a file and one
// writing another, each keeping InFlight requests of ChunkBytes in flight
// through one engine, for Duration. The separate read and write probes
// (Run) measure each direction alone for well under a second on a small
// file; a disk behind a write-back cache (a virtual disk on a host that
// buffers writes) can give far less to a sustained mix than the sum of
// those says, and a step's disk-bound time is the mix's.
type MixedOptions struct {
	// Dir is a directory the measurement creates its two files in (each
	// SizeBytes, created exclusively and removed at the end). Required.
	Dir string
	// SizeBytes is each file's size; the streams wrap around it. Required,
	// a multiple of ChunkBytes.
	SizeBytes int64
	// ChunkBytes is one request's size. Default 16 MiB, or the whole file
	// when smaller, or 1 MiB when 16 MiB does not divide the file.
	ChunkBytes int64
	// InFlight is the requests each stream keeps in flight. Default: 32
	// MiB in flight per stream (2 of 16 MiB, 32 of 1 MiB), at most the
	// file's chunks, 2..64.
	InFlight int
	// Duration is how long the streams run after both files are laid out.
	// Default 10 s.
	Duration time.Duration
	// Engine configures the aio engine, as Options.Engine.
	Engine aio.Options
	// Logger receives engine warnings.
	Logger *slog.Logger
}

// MixedResult is what the mixed load moved. GB is 1e9 bytes.
type MixedResult struct {
	ReadGBps  float64 `json:"read_gbps"`
	WriteGBps float64 `json:"write_gbps"`
	// GBps is ReadGBps + WriteGBps: the disk's rate for a mixed load.
	GBps    float64 `json:"gbps"`
	Seconds float64 `json:"seconds"`
	// SizeBytes, ChunkBytes and InFlight are the load as run (defaults
	// filled): each file, one request, requests in flight per stream.
	SizeBytes  int64 `json:"size_bytes"`
	ChunkBytes int64 `json:"chunk_bytes"`
	InFlight   int   `json:"in_flight"`
}

func (o *MixedOptions) fill() {
	if o.ChunkBytes == 0 {
		switch {
		case o.SizeBytes <= 16<<20:
			o.ChunkBytes = o.SizeBytes
		case o.SizeBytes%(16<<20) == 0:
			o.ChunkBytes = 16 << 20
		default:
			o.ChunkBytes = 1 << 20
		}
	}
	if o.InFlight == 0 {
		o.InFlight = int(max(2, min(64, (32<<20)/o.ChunkBytes, o.SizeBytes/o.ChunkBytes)))
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Engine.EnsureDefaults()
	if o.Engine.Logger == nil {
		o.Engine.Logger = o.Logger
	}
}

// Check reports every invalid field at once.
func (o *MixedOptions) Check() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("mixed probe: a directory is required"))
	}
	if o.SizeBytes <= 0 {
		errs = append(errs, fmt.Errorf("mixed probe: size %d must be positive", o.SizeBytes))
	}
	if o.ChunkBytes < 0 || (o.ChunkBytes > 0 && o.SizeBytes > 0 && o.SizeBytes%o.ChunkBytes != 0) {
		errs = append(errs, fmt.Errorf("mixed probe: chunk %d must be positive and divide the size %d", o.ChunkBytes, o.SizeBytes))
	}
	if o.InFlight < 0 || o.InFlight > 64 {
		errs = append(errs, fmt.Errorf("mixed probe: in flight %d must be 1..64 (0: 2)", o.InFlight))
	}
	if o.Duration < 0 {
		errs = append(errs, fmt.Errorf("mixed probe: duration %v must not be negative", o.Duration))
	}
	return errors.Join(errs...)
}

// RunMixed lays out two files, then reads one and writes the other at once
// for o.Duration, and reports the rate each direction got.
func RunMixed(ctx context.Context, o MixedOptions) (*MixedResult, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	o.fill()
	e, err := aio.New(o.Engine)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	data, _, release, err := stagingBuffer(ctx, e, int64(2*o.InFlight)*o.ChunkBytes, o.Logger)
	if err != nil {
		return nil, err
	}
	defer release()
	chunk := func(i int) []byte { return data[int64(i)*o.ChunkBytes : int64(i+1)*o.ChunkBytes] }
	var files [2]*aio.File
	for i, name := range []string{"zinf-mixed-read.dat", "zinf-mixed-write.dat"} {
		path := filepath.Join(o.Dir, name)
		df, err := claimDataFile(path, "write", o.SizeBytes, false, false)
		if err != nil {
			return nil, err
		}
		defer df.remove()
		f, err := df.openEngine(e)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		// Lay the file out: the reads read written blocks and the writes
		// overwrite them, as a step after the first does.
		for off := int64(0); off < o.SizeBytes; off += o.ChunkBytes {
			if _, err := e.WriteAt(ctx, f, chunk(0), off); err != nil {
				return nil, fmt.Errorf("mixed probe: laying out %s: %w", path, err)
			}
		}
		files[i] = f
	}
	stop := time.Now().Add(o.Duration)
	// A stream that fails stops the other.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var moved [2]int64
	var errs [2]error
	var wg sync.WaitGroup
	start := time.Now()
	for s := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := aio.OpRead
			if s == 1 {
				op = aio.OpWrite
			}
			moved[s], errs[s] = stream(sctx, e, files[s], op, o, func(i int) []byte { return chunk(s*o.InFlight + i) }, stop)
			if errs[s] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for s, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, fmt.Errorf("mixed probe: %s %s: %w", []string{"reading", "writing"}[s], files[s].Path(), err)
		}
	}
	r := &MixedResult{ReadGBps: float64(moved[0]) / el / 1e9, WriteGBps: float64(moved[1]) / el / 1e9, Seconds: el,
		SizeBytes: o.SizeBytes, ChunkBytes: o.ChunkBytes, InFlight: o.InFlight}
	r.GBps = r.ReadGBps + r.WriteGBps
	return r, nil
}

// stream keeps o.InFlight requests of op on f in flight, walking the file
// in chunks and wrapping around, until stop; it returns the bytes moved.
func stream(ctx context.Context, e aio.Engine, f *aio.File, op aio.Op, o MixedOptions, buf func(int) []byte, stop time.Time) (int64, error) {
	var next int64
	offset := func() int64 {
		off := next
		if next += o.ChunkBytes; next >= o.SizeBytes {
			next = 0
		}
		return off
	}
	reqs := make([]*aio.Request, o.InFlight)
	for i := range reqs {
		reqs[i] = &aio.Request{Op: op, File: f, Offset: offset(), Buf: buf(i)}
		if err := e.Submit(reqs[i]); err != nil {
			// Wait for the ones already submitted: their buffers are ours.
			for _, r := range reqs[:i] {
				_, _ = r.Wait()
			}
			return 0, err
		}
	}
	var moved int64
	var firstErr error
	live := len(reqs)
	for i := 0; live > 0; i = (i + 1) % len(reqs) {
		r := reqs[i]
		if r == nil {
			continue
		}
		// Wait, not WaitContext: the buffer is ours again only once the
		// request is done. A cancelled ctx stops the resubmitting.
		n, err := r.Wait()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		moved += n
		if firstErr == nil {
			firstErr = ctx.Err()
		}
		if firstErr == nil && time.Now().Before(stop) {
			r.Offset = offset()
			if err := e.Submit(r); err == nil {
				continue
			} else if firstErr == nil {
				firstErr = err
			}
		}
		reqs[i] = nil
		live--
	}
	return moved, firstErr
}
