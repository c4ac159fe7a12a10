// Package iobench measures zinf's I/O engine on a path the way DeepNVMe's
// ds_io does: one pinned buffer, one file, a whole-file read or write per
// loop through the aio engine, bandwidth per loop and its median, min and
// max. It backs `zinf io` and `zinf tune`; the naive mode (os.File writes +
// fsync, reads after dropping the page cache) is there for contrast.
package iobench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/metrics/stats"
)

// Options describe one measurement.
type Options struct {
	// Dir is the directory the file lives in. Required: it must exist and be
	// writable.
	Dir string
	// SizeBytes is the file and buffer size. Required, > 0.
	SizeBytes int64
	// Op is "read" or "write".
	Op string
	// Engine configures the aio engine (backend, block size, queue depth,
	// parallelism, submit/overlap modes, O_DIRECT policy).
	Engine aio.Options
	// Loops is how many timed passes to run (default 5); Warmup untimed
	// passes before them (default 1).
	Loops, Warmup int
	// FileName defaults to zinf-io-<size>.dat. Run creates it exclusively
	// and never follows a link of that name; a regular file already there
	// is reused for reads only (read-only, if it holds SizeBytes), and is
	// an error for writes: Run writes and removes only files it created.
	FileName string
	// Keep leaves a file Run created in place, for later reads to reuse.
	Keep bool
	// Overwrite lets a write rewrite a file already at FileName, as
	// DeepNVMe's ds_io does on its second run: only a regular file (never
	// a symbolic link: O_NOFOLLOW) owned by the user running zinf, written
	// in place and kept afterwards (never removed). Default: such a file
	// is refused. Reads ignore it.
	Overwrite bool
	// Naive uses plain os.File I/O instead of the engine: writes through
	// the page cache followed by fsync; reads after dropping the page cache
	// (needs root; otherwise reads are reported as cached).
	Naive bool
	// Progress receives one line per loop (nil: silent).
	Progress io.Writer
	// Logger receives engine warnings.
	Logger *slog.Logger

	// private says Dir is a directory this package created in this run
	// for the data file (Tune, Compare), so an existing file there is one
	// an earlier pass wrote and may be rewritten.
	private bool
}

// Result is one measurement. GB is 1e9 bytes.
type Result struct {
	Op         string `json:"op"`
	Backend    string `json:"backend"`
	Bytes      int64  `json:"bytes"`
	Loops      int    `json:"loops"`
	BlockSize  int    `json:"block_size"`
	QueueDepth int    `json:"queue_depth"`
	Parallel   int    `json:"parallel"`
	SingleSub  bool   `json:"single_submit"`
	Overlap    bool   `json:"overlap_events"`
	Direct     bool   `json:"direct"`
	Pinned     bool   `json:"pinned"`
	// Registered says the buffer was moved as an io_uring registered
	// buffer (READ_FIXED/WRITE_FIXED).
	Registered  bool      `json:"registered"`
	Path        string    `json:"path"`
	GBps        []float64 `json:"gbps"`
	GBpsMedian  float64   `json:"gbps_median"`
	GBpsMin     float64   `json:"gbps_min"`
	GBpsMax     float64   `json:"gbps_max"`
	CacheNote   string    `json:"note,omitempty"`
	AlignBytes  int       `json:"align_bytes"`
	ElapsedSecs float64   `json:"elapsed_seconds"`
}

// Check validates o without touching the disk beyond a probe: every problem
// is reported at once, before anything is written.
func (o *Options) Check() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("--path is required: a directory on the device to measure"))
	} else if st, err := os.Stat(o.Dir); err != nil {
		errs = append(errs, fmt.Errorf("--path %q: %w", o.Dir, err))
	} else if !st.IsDir() {
		errs = append(errs, fmt.Errorf("--path %q is not a directory", o.Dir))
	} else if err := unix.Access(o.Dir, unix.W_OK); err != nil {
		errs = append(errs, fmt.Errorf("--path %q is not writable: %w", o.Dir, err))
	}
	if o.SizeBytes <= 0 {
		errs = append(errs, fmt.Errorf("--size %d is invalid: it must be positive (e.g. 1GiB, 64MiB)", o.SizeBytes))
	}
	if o.Op != "read" && o.Op != "write" {
		errs = append(errs, fmt.Errorf("--op %q is invalid (allowed: read, write)", o.Op))
	}
	if o.Overwrite && o.Op != "write" {
		errs = append(errs, fmt.Errorf("--overwrite applies to --op write (--op is %q)", o.Op))
	}
	if o.Loops < 0 {
		errs = append(errs, fmt.Errorf("--loops %d is invalid: it must not be negative", o.Loops))
	}
	if o.Warmup < 0 {
		errs = append(errs, fmt.Errorf("--warmup %d is invalid: it must not be negative", o.Warmup))
	}
	if o.FileName != "" && (o.FileName != filepath.Base(o.FileName) || o.FileName == "." || o.FileName == "..") {
		// A name with a separator could write outside --path.
		errs = append(errs, fmt.Errorf("--file %q is invalid: it must be a plain file name inside --path", o.FileName))
	}
	eo := o.Engine
	eo.EnsureDefaults()
	if engineErrs := engineProblems(eo); len(engineErrs) > 0 {
		errs = append(errs, engineErrs...)
	} else if err := aio.Available(eo.Backend); err != nil && !o.Naive {
		errs = append(errs, fmt.Errorf("--backend %s: %w", eo.Backend, err))
	}
	if len(errs) == 0 && eo.Direct != aio.DirectOff && !o.Naive {
		align, _, err := aio.ProbeDir(o.Dir, eo.Direct)
		if err != nil {
			errs = append(errs, err)
		} else if align > 1 && (eo.BlockSizeBytes%align != 0 || o.SizeBytes%int64(align) != 0) {
			errs = append(errs, fmt.Errorf("--block-size %d and --size %d must be multiples of the O_DIRECT alignment %d of %s (or use --direct off)",
				eo.BlockSizeBytes, o.SizeBytes, align, o.Dir))
		}
	}
	return errors.Join(errs...)
}

// engineProblems validates the engine options one field at a time, with
// aio's own rules, and names each problem by the flag that sets the field,
// so a user sees which flag to fix.
func engineProblems(eo aio.Options) []error {
	base := aio.Options{Backend: aio.BackendAuto, BlockSizeBytes: aio.DefaultBlockSizeBytes,
		QueueDepth: aio.DefaultQueueDepth, IntraOpParallelism: aio.DefaultIntraOpParallelism}
	fields := []struct {
		flag string
		set  func(*aio.Options)
	}{
		{"--backend", func(o *aio.Options) { o.Backend = eo.Backend }},
		{"--block-size", func(o *aio.Options) { o.BlockSizeBytes = eo.BlockSizeBytes }},
		{"--queue-depth", func(o *aio.Options) { o.QueueDepth = eo.QueueDepth }},
		{"--parallel", func(o *aio.Options) { o.IntraOpParallelism = eo.IntraOpParallelism }},
		{"--direct", func(o *aio.Options) { o.Direct = eo.Direct }},
	}
	var errs []error
	for _, f := range fields {
		o := base
		f.set(&o)
		if err := o.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.flag, err))
		}
	}
	if len(errs) == 0 {
		// Cross-field rules, if aio ever has any.
		if err := eo.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// fill sets the defaults Run and RunGPU share once Check has passed: the
// logger (also the engine's), the engine's options and the file name.
func (o *Options) fill() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Engine.EnsureDefaults()
	if o.Engine.Logger == nil {
		o.Engine.Logger = o.Logger
	}
	if o.FileName == "" {
		o.FileName = fmt.Sprintf("zinf-io-%d.dat", o.SizeBytes)
	}
}

// Run performs the measurement.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Loops == 0 {
		o.Loops = 5
	}
	if err := o.Check(); err != nil {
		return nil, err
	}
	o.fill()
	path := filepath.Join(o.Dir, o.FileName)
	if o.Naive {
		return runNaive(ctx, o, path)
	}
	e, err := aio.New(o.Engine)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	// One pinned buffer of the whole size, as ds_io uses.
	data, pinned, release, err := stagingBuffer(ctx, e, o.SizeBytes, o.Logger)
	if err != nil {
		return nil, err
	}
	defer release()
	df, err := claimDataFile(path, o.Op, o.SizeBytes, o.private, o.Overwrite)
	if err != nil {
		return nil, err
	}
	if !o.Keep {
		defer df.remove()
	}
	f, err := df.openEngine(e)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res := &Result{Op: o.Op, Backend: e.Name(), Bytes: o.SizeBytes, Loops: o.Loops, BlockSize: o.Engine.BlockSizeBytes,
		QueueDepth: o.Engine.QueueDepth, Parallel: o.Engine.IntraOpParallelism, SingleSub: o.Engine.SingleSubmit,
		Overlap: !o.Engine.SerialEvents, Direct: f.Direct(), Pinned: pinned, Path: path, AlignBytes: f.Alignment()}
	err = measure(ctx, o, res, "", f, transfer{
		read:  func(ctx context.Context) (int64, error) { n, err := e.ReadAt(ctx, f, data, 0); return int64(n), err },
		write: func(ctx context.Context) (int64, error) { n, err := e.WriteAt(ctx, f, data, 0); return int64(n), err },
	})
	if err != nil {
		return nil, err
	}
	res.Registered = e.Stats().FixedBufferPieces > 0
	return res, nil
}

// stagingBuffer is one pinned buffer of size bytes from a pool of its
// own, its pages touched with a pattern; release frees both. As the
// runtime does, io_uring registers it once (a refused registration is
// logged by the engine); other backends have no registered buffers, and
// asking would log that once per measurement.
func stagingBuffer(ctx context.Context, e aio.Engine, size int64, log *slog.Logger) (data []byte, pinned bool, release func(), err error) {
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: max(nextPow2(size), 1<<20), Logger: log})
	if err != nil {
		return nil, false, nil, err
	}
	if e.Name() == aio.BackendUring {
		_ = pool.Register(e)
	}
	buf, err := pool.Acquire(ctx, int(size), buffers.PurposeStaging)
	if err != nil {
		pool.Close()
		return nil, false, nil, err
	}
	data = buf.Bytes()
	for i := 0; i+8 <= len(data); i += 4096 {
		data[i] = byte(i >> 12)
	}
	return data, pool.Pinned(), func() { buf.Release(); pool.Close() }, nil
}

// transfer moves the whole buffer once in each direction. dropCache, when
// set, runs before each read loop (the naive contrast drops the page
// cache; an error means reads may be cached).
type transfer struct {
	read, write func(ctx context.Context) (int64, error)
	dropCache   func() error
}

// benchFile is the file a measurement runs on: an engine's *aio.File, or
// the naive contrast's *os.File (osFile).
type benchFile interface {
	Path() string
	Direct() bool
	Size() (int64, error)
	Sync() error
}

// osFile is an *os.File as a benchFile (buffered: no O_DIRECT).
type osFile struct{ *os.File }

func (f osFile) Path() string { return f.Name() }
func (f osFile) Direct() bool { return false }
func (f osFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// measure fills the file for reads (once), then runs the warmup and timed
// loops of o.Op through t, recording GB/s per loop in res. label prefixes
// progress lines.
func measure(ctx context.Context, o Options, res *Result, label string, f benchFile, t transfer) error {
	if o.Op == "read" {
		// Reads use a file created and filled once.
		if sz, _ := f.Size(); sz < o.SizeBytes {
			if _, err := t.write(ctx); err != nil {
				return fmt.Errorf("filling %s for reads: %w", f.Path(), err)
			}
			if err := f.Sync(); err != nil {
				return err
			}
		}
		if !f.Direct() && t.dropCache == nil {
			res.CacheNote = "buffered reads: may be served from the page cache"
		}
	}
	start := time.Now()
	for i := 0; i < o.Warmup+o.Loops; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if o.Op == "read" && t.dropCache != nil && t.dropCache() != nil {
			res.CacheNote = "could not drop the page cache (not root): reads may be cached"
		}
		t0 := time.Now()
		var n int64
		var err error
		if o.Op == "read" {
			n, err = t.read(ctx)
		} else {
			n, err = t.write(ctx)
			if err == nil && !f.Direct() {
				err = f.Sync() // buffered writes count only once on the device
			}
		}
		if err != nil {
			return err
		}
		el := time.Since(t0).Seconds()
		if i < o.Warmup {
			continue
		}
		g := float64(n) / el / 1e9
		res.GBps = append(res.GBps, g)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "  %s%s loop %d/%d: %.3f GB/s (%d bytes in %.3fs)\n", label, o.Op, i-o.Warmup+1, o.Loops, g, n, el)
		}
	}
	res.ElapsedSecs = time.Since(start).Seconds()
	res.summarize()
	return nil
}

func (r *Result) summarize() {
	s := slices.Clone(r.GBps)
	slices.Sort(s)
	if len(s) == 0 {
		return
	}
	r.GBpsMin, r.GBpsMax = s[0], s[len(s)-1]
	r.GBpsMedian = stats.Median(s)
}

// runNaive is the contrast: what a Go program gets from os.File with no
// engine. Writes go through the page cache and are fsync'ed; reads drop the
// page cache first (root only).
func runNaive(ctx context.Context, o Options, path string) (*Result, error) {
	data := make([]byte, o.SizeBytes)
	for i := 0; i < len(data); i += 4096 {
		data[i] = byte(i >> 12)
	}
	df, err := claimDataFile(path, o.Op, o.SizeBytes, o.private, o.Overwrite)
	if err != nil {
		return nil, err
	}
	if !o.Keep {
		defer df.remove()
	}
	f, err := os.OpenFile(path, df.openFlags(), 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := df.check(int(f.Fd())); err != nil {
		return nil, err
	}
	res := &Result{Op: o.Op, Backend: "naive-go", Bytes: o.SizeBytes, Loops: o.Loops, Path: path, AlignBytes: 1}
	err = measure(ctx, o, res, "naive ", osFile{f}, transfer{
		read:      func(context.Context) (int64, error) { n, err := f.ReadAt(data, 0); return int64(n), err },
		write:     func(context.Context) (int64, error) { n, err := f.WriteAt(data, 0); return int64(n), err },
		dropCache: dropCaches,
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// dropCaches asks the kernel to drop clean page-cache pages (root only).
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0)
}
