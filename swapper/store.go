package swapper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/base/crc32c"
	"github.com/zinfio/zinf/tensor"
	"github.com/zinfio/zinf/trace"
)

// Sentinel errors.
var (
	// ErrChecksum: bytes read back differ from what was written.
	ErrChecksum = errors.New("swapper: checksum mismatch")
	// ErrNotFound: no tensor of that name is in the store.
	ErrNotFound = errors.New("swapper: tensor not in store")
	// ErrClosed: the store was closed.
	ErrClosed = tensor.ClosedError("swapper: store closed")
)

// TensorError names the tensor an operation failed on.
type TensorError struct {
	Op     string // "swap-out", "swap-in", "read"
	Tensor string
	Err    error
}

func (e *TensorError) Error() string {
	return fmt.Sprintf("swapper: %s of tensor %q: %v", e.Op, e.Tensor, e.Err)
}

// Unwrap returns the cause.
func (e *TensorError) Unwrap() error { return e.Err }

// StoreOptions configure a Store.
type StoreOptions struct {
	// Paths are directories on NVMe; tensors are striped across them.
	// Required, at least one; each must exist and be writable.
	Paths []string
	// Engine moves the bytes. Required.
	Engine aio.Engine
	// Name prefixes the scratch directory ("rank0" gives
	// zinf-rank0-<pid>-*); default "swap".
	Name string
	// Checksums enables a CRC-32C per stripe chunk, verified on every read.
	Checksums bool
	// StripeBytes is the striping unit across paths. Default 1 MiB; it is
	// rounded up to a multiple of the device alignment.
	StripeBytes int64
	// ChecksumBytes is the bytes one CRC-32C covers (with Checksums). A
	// ranged read (ReadRangeAsync) transfers and verifies whole units, so
	// a smaller unit makes reading a few rows of a large tensor cheaper
	// (an embedding lookup). Rounded up to the alignment, then down to a
	// divisor of the stripe. Default 0: the stripe.
	ChecksumBytes int64
	// ReserveBytes preallocates (fallocate) this many bytes in each path's
	// swap file at open, so later swap-outs cannot run out of space midway.
	// Default 0: files grow as needed.
	ReserveBytes int64
	// KeepStale keeps the swap space of runs that are gone instead of
	// removing it. OpenStore always looks in each path for run directories
	// that a store left when its process died (kill -9, OOM kill, power
	// loss on a persistent path) and logs each with its size; by default it
	// removes them, because nothing can read them (the map from tensors to
	// extents lived in the dead process) and every crash would otherwise
	// leak the whole swap footprint until the disk fills. Set KeepStale to
	// keep them for a post-mortem look at their bytes. Only directories
	// with the name shape this package gives run directories and a lock
	// file of ours that no live process holds are ever considered (see
	// FindStale). Default false.
	KeepStale bool
	// Logger, default slog.Default().
	Logger *slog.Logger
	// Trace, when set, receives a trace.Read or trace.Write event per
	// operation, from submission to completion, when Wait returns (see
	// package trace). Default nil: no events.
	Trace trace.Sink
}

// Store maps tensor names to extents in swap files. Methods are safe for
// concurrent use; operations on the same name are ordered by the caller
// (a swapper never writes a tensor while reading it).
type Store struct {
	opts   StoreOptions
	dirs   []string
	locks  []*os.File // one per dir, flock'ed while the store lives
	files  []*aio.File
	allocs []*extentAlloc
	align  int64
	stripe int64
	unit   int64 // bytes per checksum (ChecksumBytes)

	mu      sync.Mutex
	tensors map[string]*version
	closed  bool
	adopted map[string]*aio.File // files read in place (Adopt), by path

	stats StoreStats
	// sumNs and sumBytes measure the checksums' CPU time (Stats).
	sumNs, sumBytes atomic.Int64
	paths           []PathStats // per path, guarded by mu
}

// StoreStats are cumulative store counters.
type StoreStats struct {
	BytesWritten, BytesRead int64 // logical tensor bytes
	Writes, Reads           int64
	WriteErrors, ReadErrors int64
	ChecksumFailures        int64
	// ChecksumTime is the time spent computing and verifying CRC-32C
	// (zinf.checksums) over ChecksumBytes of buffers: its rate is a cost
	// of every transfer (policy.Costs.ChecksumBytesPerSec).
	ChecksumTime  time.Duration
	ChecksumBytes int64
	LiveBytes     int64 // padded bytes of current versions
	// FileBytes is the length the swap files' extents have reached,
	// summed over paths: the disk space the extents span (files never
	// shrink while the store is open; a file that ReserveBytes or
	// Preallocate lengthened is longer). DiskBytes bounds it.
	FileBytes int64
	// ReadLatency and WriteLatency are the latencies of successful reads
	// and writes, from submission to the completion of their I/O.
	ReadLatency, WriteLatency Latency
	// Paths counts the device bytes moved per path, in StoreOptions.Paths
	// order.
	Paths []PathStats
}

// version is one on-disk copy of a tensor.
type version struct {
	length  int64    // logical bytes
	padded  int64    // rounded up to the alignment
	ext     []extent // one per path (len 0 on a path with no chunks)
	sums    []uint32 // CRC-32C per stripe chunk, when checksums are on
	refs    int      // reads in flight on this version
	retired bool     // replaced or deleted: free extents at refs == 0
	// A version read in place (Adopt) lives in file, not the swap files:
	// the aligned span read by O_DIRECT is direct bytes from fileOff, the
	// tensor's bytes begin head bytes into it, and its last bytes, when
	// they lie past that span (in the aligned block after it, or in the
	// file's last, partial block), are kept in tail (under one alignment
	// unit, read once by Adopt).
	file                  *aio.File
	fileOff, head, direct int64
	tail                  []byte
}

type extent struct{ off, len int64 }

// OpenStore creates the scratch directories and swap files. In each path
// it first looks for the swap space of runs that are gone and reports and
// removes it (see StoreOptions.KeepStale and FindStale). Each scratch
// directory holds a lock file that the store keeps flock'ed until Close, so
// other stores can tell it from a dead run's.
func OpenStore(opts StoreOptions) (*Store, error) {
	if opts.Engine == nil {
		return nil, errors.New("swapper: StoreOptions.Engine is required")
	}
	if len(opts.Paths) == 0 {
		return nil, errors.New("swapper: StoreOptions.Paths is empty: give at least one NVMe directory")
	}
	if opts.Name == "" {
		opts.Name = "swap"
	}
	if strings.ContainsAny(opts.Name, "/\x00") {
		return nil, fmt.Errorf("swapper: StoreOptions.Name %q must not contain a slash or NUL", opts.Name)
	}
	if opts.StripeBytes == 0 {
		opts.StripeBytes = 1 << 20
	}
	if opts.StripeBytes < 0 || opts.ReserveBytes < 0 {
		return nil, fmt.Errorf("swapper: StripeBytes %d and ReserveBytes %d must not be negative", opts.StripeBytes, opts.ReserveBytes)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{opts: opts, tensors: make(map[string]*version), align: 1}
	for i, p := range opts.Paths {
		if err := checkDir(p); err != nil {
			s.Close()
			return nil, err
		}
		sweepStale(p, opts.KeepStale, opts.Logger)
		dir, lock, err := makeRunDir(p, opts.Name)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("swapper: creating scratch dir in %s: %w", p, err)
		}
		s.dirs = append(s.dirs, dir)
		s.locks = append(s.locks, lock)
		f, err := opts.Engine.Open(filepath.Join(dir, fmt.Sprintf("swap.%d", i)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("swapper: opening swap file in %s: %w", p, err)
		}
		s.files = append(s.files, f)
		s.align = max(s.align, int64(f.Alignment()))
		if opts.ReserveBytes > 0 {
			if err := f.Allocate(opts.ReserveBytes); err != nil {
				s.Close()
				return nil, fmt.Errorf("swapper: reserving %d bytes on %s: %w", opts.ReserveBytes, p, err)
			}
		}
	}
	s.stripe = roundUp(opts.StripeBytes, s.align)
	s.unit = checksumUnit(opts.ChecksumBytes, s.stripe, s.align)
	for i := range s.files {
		s.allocs = append(s.allocs, &extentAlloc{})
		s.paths = append(s.paths, PathStats{Path: opts.Paths[i]})
	}
	return s, nil
}

// checkDir says clearly why a swap path cannot be used.
func checkDir(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("swapper: NVMe path %q does not exist (create it, or fix nvme_path in the config)", p)
		}
		return fmt.Errorf("swapper: NVMe path %q: %w", p, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("swapper: NVMe path %q is not a directory", p)
	}
	if err := accessWrite(p); err != nil {
		return fmt.Errorf("swapper: NVMe path %q is not writable: %w", p, err)
	}
	return nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// Alignment is the device alignment every extent and transfer keeps.
func (s *Store) Alignment() int64 { return s.align }

// StripeBytes is the striping unit.
func (s *Store) StripeBytes() int64 { return s.stripe }

// Paths returns the scratch directories (one per NVMe path).
func (s *Store) Paths() []string { return append([]string(nil), s.dirs...) }

// PaddedLen is n rounded up to the alignment: the buffer capacity a tensor
// of n bytes needs for Write and Read.
func (s *Store) PaddedLen(n int64) int64 { return roundUp(n, s.align) }

// Len returns the logical length of a stored tensor.
func (s *Store) Len(name string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.tensors[name]
	if !ok {
		return 0, false
	}
	return v.length, true
}

// Names returns the stored tensor names, sorted.
func (s *Store) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.tensors))
	for n := range s.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Stats returns the store's counters.
func (s *Store) Stats() StoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.ChecksumTime, st.ChecksumBytes = time.Duration(s.sumNs.Load()), s.sumBytes.Load()
	for _, a := range s.allocs {
		st.FileBytes += a.high
	}
	st.Paths = slices.Clone(s.paths)
	return st
}

// chunk is one stripe unit of a tensor: bytes [lo, hi) of the padded
// tensor live on path p at file offset off.
type chunk struct {
	p      int
	off    int64
	lo, hi int64
}

// layout computes a tensor's extents' sizes per path for padded bytes.
func (s *Store) extentSizes(padded int64) []int64 {
	n := len(s.files)
	sizes := make([]int64, n)
	for k, lo := int64(0), int64(0); lo < padded; k, lo = k+1, lo+s.stripe {
		sizes[k%int64(n)] += min(s.stripe, padded-lo)
	}
	return sizes
}

// chunks lists the stripe chunks of v.
func (s *Store) chunks(v *version, fn func(c chunk)) {
	n := int64(len(s.files))
	for k, lo := int64(0), int64(0); lo < v.padded; k, lo = k+1, lo+s.stripe {
		p := k % n
		fn(chunk{p: int(p), off: v.ext[p].off + (k/n)*s.stripe, lo: lo, hi: min(lo+s.stripe, v.padded)})
	}
}

// Pending is an asynchronous store operation. Wait returns its outcome; it
// may be called more than once.
type Pending struct {
	s      *Store
	op     string
	name   string
	reqs   []aio.Request
	v      *version // the version written or read
	buf    []byte
	waited bool
	err    error
	doneAt time.Time // when the last request completed (set by Wait)
	// A ranged read (ReadRangeAsync) transfers bytes [from, to) of the
	// version into buf and delivers [lo, hi) of them; a whole read has
	// ranged false.
	ranged           bool
	from, to, lo, hi int64
	// one is the pooled request of a single-path store's op (reqs is
	// one[:]), given back once every request was waited for.
	one *[1]aio.Request
	// bg, when not nil, is closed by the goroutine that waits for the
	// I/O and then does the checksum work (see started); Wait waits for
	// it instead of the requests.
	bg chan struct{}
	// start is when the operation was submitted.
	start time.Time
	// piece is the PieceWriter of a piece's write (nil otherwise): it
	// covers bytes [from, to) of v, and the version is installed by the
	// writer's Commit, not by Wait.
	piece *PieceWriter
}

// onePool recycles the requests of single-path stores: an aio.Request
// keeps its completion channel and slice table from one use to the next
// (aio: reuse after Wait allocates nothing), so a warm store op allocates
// neither.
var onePool = sync.Pool{New: func() any { return new([1]aio.Request) }}

// single sets p.reqs to one pooled request.
func (p *Pending) single(op aio.Op, f *aio.File, off int64, buf []byte) {
	p.one = onePool.Get().(*[1]aio.Request)
	r := &p.one[0]
	r.Op, r.File, r.Offset, r.Buf = op, f, off, buf
	p.reqs = p.one[:]
}

// recycle gives the pooled request back: every request of p was waited
// for (or never submitted), so the engine holds none of it.
func (p *Pending) recycle() {
	if p.one != nil {
		r := &p.one[0]
		r.File, r.Buf = nil, nil
		onePool.Put(p.one)
		p.one = nil
	}
	p.reqs = nil
}

// started is called once p's requests are submitted. With checksums on,
// a goroutine verifies a read once its I/O is done, and checksums a write
// while its I/O is in flight: that CRC-32C work is then off the goroutine
// that calls Wait, which in an optimizer step is the update loop, and
// done while it is busy with other work, by a core that would otherwise
// wait. A write's buffer was typically filled just before (an update, an
// encode): checksummed at once it is still in the cache, where CRC-32C
// runs two to three times as fast as on memory the device has read since
// (a 25 MiB optimizer record after the write completed), and the write's
// latency becomes the longer of the two instead of their sum. The buffer
// belongs to the operation until Wait returns and neither the device nor
// the checksum changes it, so the sums are the same either way; a failed
// write's are discarded with it.
func (p *Pending) started() {
	if !p.s.opts.Checksums {
		return
	}
	p.bg = make(chan struct{})
	write := p.op == "swap-out"
	go func() {
		defer close(p.bg)
		if write {
			p.checksum()
			p.collect()
			return
		}
		p.collect()
		p.checksum()
	}()
}

// collect waits for p's requests and records their outcome.
func (p *Pending) collect() {
	var errs []error
	for i := range p.reqs {
		if _, err := p.reqs[i].Wait(); err != nil {
			errs = append(errs, err)
		}
		if t := p.reqs[i].CompletedAt(); t.After(p.doneAt) {
			p.doneAt = t
		}
	}
	if err := errors.Join(errs...); err != nil {
		p.err = &TensorError{Op: p.op, Tensor: p.name, Err: err}
	}
}

// checksum verifies a read once its I/O succeeded, or computes a written
// version's checksums from the buffer, which may not change until Wait
// returns: they are the bytes written, and the version is not visible
// before finishWrite (which drops them with the version if the write
// failed).
func (p *Pending) checksum() {
	s := p.s
	if p.err != nil || !s.opts.Checksums {
		return
	}
	t0 := time.Now()
	defer func() {
		s.sumNs.Add(int64(time.Since(t0)))
		s.sumBytes.Add(int64(len(p.buf)))
	}()
	if p.piece != nil {
		p.pieceChecksums()
		return
	}
	if p.op == "swap-out" {
		p.v.sums = make([]uint32, 0, (p.v.padded+s.unit-1)/s.unit)
		s.sumUnits(p.v, func(_ int, lo, hi int64) {
			p.v.sums = append(p.v.sums, crc32c.Checksum(p.buf[lo:hi]))
		})
		return
	}
	if p.v.sums != nil {
		p.err = s.verify(p)
	}
}

// Wait blocks until the operation is done. For a write, success commits the
// new version; failure frees it and leaves the previous version in place.
// For a read, checksums are verified.
func (p *Pending) Wait() error {
	if p.waited {
		return p.err
	}
	p.waited = true
	if p.bg != nil {
		<-p.bg
	} else {
		p.collect()
		p.checksum()
	}
	if v := p.v; p.err == nil && v.file != nil && p.op == "swap-in" && !p.ranged {
		// Read in place: the tensor starts head bytes into the span read,
		// and ends with the bytes Adopt kept.
		n := min(v.length, max(0, v.direct-v.head))
		if v.head > 0 && n > 0 {
			copy(p.buf[:n], p.buf[v.head:v.head+n])
		}
		copy(p.buf[n:v.length], v.tail)
	}
	// The I/O's completion, not the moment Wait was called.
	end := p.doneAt
	if end.IsZero() {
		end = time.Now()
	}
	s := p.s
	switch {
	case p.piece != nil:
		s.finishPiece(p, end)
	case p.op == "swap-out":
		s.finishWrite(p, end)
	default:
		s.mu.Lock()
		if p.err != nil {
			s.stats.ReadErrors++
		} else {
			s.stats.Reads++
			if p.ranged {
				s.stats.BytesRead += p.hi - p.lo
			} else {
				s.stats.BytesRead += p.v.length
			}
			s.stats.ReadLatency.observe(end.Sub(p.start))
			s.countPathsLocked(p, false)
		}
		s.unrefLocked(p.v)
		s.mu.Unlock()
	}
	if t := s.opts.Trace; t != nil {
		k, n := trace.Read, p.v.length
		if p.op == "swap-out" {
			k = trace.Write
		}
		if p.ranged {
			n = p.hi - p.lo
		}
		t.Record(trace.Event{Kind: k, Failed: p.err != nil, Layer: -1, SubGroup: -1, Bytes: n, Name: p.name, Start: p.start, End: end})
	}
	p.recycle()
	return p.err
}

// countPathsLocked adds a successful operation's requests to the per-path
// counters.
func (s *Store) countPathsLocked(p *Pending, write bool) {
	for i := range p.reqs {
		r := &p.reqs[i]
		for j, f := range s.files {
			if f != r.File {
				continue
			}
			ps := &s.paths[j]
			if write {
				ps.BytesWritten += int64(len(r.Buf))
				ps.Writes++
			} else {
				ps.BytesRead += int64(len(r.Buf))
				ps.Reads++
			}
			break
		}
	}
}

// CompletedAt returns when the operation's I/O completed (its last
// request was reaped), which may be well before Wait was called; the zero
// time until Wait has returned. Checksum verification, which Wait does
// afterwards, is not included.
func (p *Pending) CompletedAt() time.Time {
	if !p.waited {
		return time.Time{}
	}
	return p.doneAt
}

// Write stores b.Bytes() under name (a new version; see WriteAsync) and
// waits for it.
func (s *Store) Write(ctx context.Context, name string, b []byte) error {
	p, err := s.WriteAsync(name, b)
	if err != nil {
		return err
	}
	return p.Wait()
}

// WriteAsync starts writing b (length = the tensor's logical length; its
// capacity must cover PaddedLen(len(b)) and its start must be aligned, as
// pool buffers are) as the new version of name. The bytes between len(b)
// and the padded length are zeroed. b must not change until Wait returns.
// With checksums, Wait computes them from b once the write is done (so
// WriteAsync returns without reading b).
func (s *Store) WriteAsync(name string, b []byte) (*Pending, error) {
	n := int64(len(b))
	if n == 0 {
		return nil, &TensorError{Op: "swap-out", Tensor: name, Err: errors.New("empty tensor")}
	}
	padded := s.PaddedLen(n)
	if int64(cap(b)) < padded {
		return nil, &TensorError{Op: "swap-out", Tensor: name, Err: fmt.Errorf("buffer capacity %d is below the padded length %d (alignment %d): use a pool buffer", cap(b), padded, s.align)}
	}
	full := b[:padded]
	clear(full[n:])
	v := &version{length: n, padded: padded}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-out", Tensor: name, Err: ErrClosed}
	}
	sizes := s.extentSizes(padded)
	v.ext = make([]extent, len(sizes))
	for i, sz := range sizes {
		if sz > 0 {
			v.ext[i] = extent{off: s.allocs[i].alloc(sz), len: sz}
		}
	}
	s.mu.Unlock()
	p := &Pending{s: s, op: "swap-out", name: name, v: v, buf: full, start: time.Now()}
	if err := s.submit(p, aio.OpWrite); err != nil {
		s.mu.Lock()
		s.freeLocked(v)
		s.stats.WriteErrors++
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-out", Tensor: name, Err: err}
	}
	p.started()
	return p, nil
}

// submit issues one request per stripe chunk (merged when there is a
// single path: one request, split by the engine into blocks).
func (s *Store) submit(p *Pending, op aio.Op) error {
	v := p.v
	if v.file != nil {
		if op != aio.OpRead {
			return errors.New("swapper: a version read in place is never written")
		}
		if v.direct > 0 {
			p.single(op, v.file, v.fileOff, p.buf[:v.direct])
		}
	} else if len(s.files) == 1 {
		p.single(op, s.files[0], v.ext[0].off, p.buf[:v.padded])
	} else {
		s.chunks(v, func(c chunk) {
			p.reqs = append(p.reqs, aio.Request{Op: op, File: s.files[c.p], Offset: c.off, Buf: p.buf[c.lo:c.hi]})
		})
	}
	for i := range p.reqs {
		if err := s.opts.Engine.Submit(&p.reqs[i]); err != nil {
			// Wait for what was submitted; nothing may stay in flight.
			for j := 0; j < i; j++ {
				p.reqs[j].Wait()
			}
			p.recycle()
			return err
		}
	}
	return nil
}

func (s *Store) finishWrite(p *Pending, end time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.err != nil {
		s.freeLocked(p.v)
		s.stats.WriteErrors++
		return
	}
	s.stats.WriteLatency.observe(end.Sub(p.start))
	s.countPathsLocked(p, true)
	if old, ok := s.tensors[p.name]; ok {
		s.stats.LiveBytes -= old.padded
		old.retired = true
		if old.refs == 0 {
			s.freeLocked(old)
		}
	}
	s.tensors[p.name] = p.v
	s.stats.LiveBytes += p.v.padded
	s.stats.Writes++
	s.stats.BytesWritten += p.v.length
}

// Read reads name into b (see ReadAsync) and waits.
func (s *Store) Read(ctx context.Context, name string, b []byte) error {
	p, err := s.ReadAsync(name, b)
	if err != nil {
		return err
	}
	return p.Wait()
}

// ReadAsync starts reading the current version of name into b, whose
// length must equal the tensor's length and whose capacity must cover the
// padded length (a pool buffer). Checksums, when on, are verified by Wait.
func (s *Store) ReadAsync(name string, b []byte) (*Pending, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: ErrClosed}
	}
	v, ok := s.tensors[name]
	if !ok {
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: ErrNotFound}
	}
	if int64(len(b)) != v.length || int64(cap(b)) < v.padded {
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: fmt.Errorf("buffer length %d / capacity %d; the tensor has %d bytes (%d padded)", len(b), cap(b), v.length, v.padded)}
	}
	v.refs++
	s.mu.Unlock()
	p := &Pending{s: s, op: "swap-in", name: name, v: v, buf: b[:v.padded], start: time.Now()}
	if err := s.submit(p, aio.OpRead); err != nil {
		s.mu.Lock()
		s.unrefLocked(v)
		s.stats.ReadErrors++
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: err}
	}
	p.started()
	return p, nil
}

// rangeUnit is the granule ranged reads transfer in: the alignment, or
// with checksums the stripe, so that every chunk read is read whole and
// verified.
func (s *Store) rangeUnit() int64 {
	if s.opts.Checksums {
		return s.unit
	}
	return s.align
}

// checksumUnit is StoreOptions.ChecksumBytes for a stripe and an
// alignment: rounded up to the alignment, then down to a divisor of the
// stripe (itself a multiple of the alignment); the stripe for 0.
func checksumUnit(bytes, stripe, align int64) int64 {
	if bytes <= 0 || bytes >= stripe {
		return stripe
	}
	u := roundUp(bytes, align)
	for stripe%u != 0 {
		u -= align
	}
	return u
}

// sumUnits calls fn for every checksum unit of v, in order: its index in
// v.sums and its bytes [lo, hi) (hi at most v's length). A unit lies in
// one stripe chunk.
func (s *Store) sumUnits(v *version, fn func(i int, lo, hi int64)) {
	for i, lo := 0, int64(0); lo < v.padded && lo < v.length; i, lo = i+1, lo+s.unit {
		fn(i, lo, min(lo+s.unit, v.length))
	}
}

// fileAt is the file and offset of byte lo of v.
func (s *Store) fileAt(v *version, lo int64) (string, int64) {
	n := int64(len(s.files))
	k := lo / s.stripe
	p := k % n
	return s.files[p].Path(), v.ext[p].off + (k/n)*s.stripe + lo%s.stripe
}

// RangeUnit is the granule ranged reads transfer in (see RangeLen): the
// alignment, or with checksums the stripe.
func (s *Store) RangeUnit() int64 { return s.rangeUnit() }

// RangeLen is the buffer capacity ReadRangeAsync needs to deliver bytes
// [lo, hi) of a tensor: the range widened to the alignment (with
// checksums, to whole stripe chunks, which are what a checksum covers).
// It never exceeds roundUp(hi-lo) + one unit, whatever lo is.
func (s *Store) RangeLen(lo, hi int64) int64 {
	if hi <= lo {
		return 0
	}
	u := s.rangeUnit()
	return roundUp(hi, u) - lo/u*u
}

// ReadRange reads bytes [lo, hi) of name (see ReadRangeAsync) and waits.
func (s *Store) ReadRange(ctx context.Context, name string, lo, hi int64, b []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: err}
	}
	p, data, err := s.ReadRangeAsync(name, lo, hi, b)
	if err != nil {
		return nil, err
	}
	return data, p.Wait()
}

// ReadRangeAsync starts reading bytes [lo, hi) of the current version of
// name straight into b, an aligned buffer (a pool buffer) of capacity at
// least RangeLen(lo, hi): the aligned span around the range is read into
// b from its start, and data is the part of b that will hold bytes
// [lo, hi) once Wait returns nil. Checksums, when on, are verified by Wait
// for every chunk read. 0 <= lo < hi <= the tensor's length.
func (s *Store) ReadRangeAsync(name string, lo, hi int64, b []byte) (_ *Pending, data []byte, _ error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, &TensorError{Op: "swap-in", Tensor: name, Err: ErrClosed}
	}
	v, ok := s.tensors[name]
	if !ok {
		s.mu.Unlock()
		return nil, nil, &TensorError{Op: "swap-in", Tensor: name, Err: ErrNotFound}
	}
	if lo < 0 || hi <= lo || hi > v.length {
		s.mu.Unlock()
		return nil, nil, &TensorError{Op: "swap-in", Tensor: name, Err: fmt.Errorf("byte range [%d, %d) is not a non-empty part of the tensor's %d bytes", lo, hi, v.length)}
	}
	if v.file != nil {
		s.mu.Unlock()
		return nil, nil, &TensorError{Op: "swap-in", Tensor: name, Err: errors.New("a tensor read in place (Adopt) is read whole, not by ranges")}
	}
	u := s.rangeUnit()
	from, to := lo/u*u, min(roundUp(hi, u), v.padded)
	if int64(cap(b)) < to-from {
		s.mu.Unlock()
		return nil, nil, &TensorError{Op: "swap-in", Tensor: name, Err: fmt.Errorf("buffer capacity %d is below the %d bytes a read of [%d, %d) transfers (RangeLen)", cap(b), to-from, lo, hi)}
	}
	v.refs++
	s.mu.Unlock()
	p := &Pending{s: s, op: "swap-in", name: name, v: v, buf: b[:to-from], ranged: true, from: from, to: to, lo: lo, hi: hi, start: time.Now()}
	if len(s.files) == 1 {
		p.single(aio.OpRead, s.files[0], v.ext[0].off+from, p.buf)
	} else {
		s.chunks(v, func(c chunk) {
			a, z := max(c.lo, from), min(c.hi, to)
			if a < z {
				p.reqs = append(p.reqs, aio.Request{Op: aio.OpRead, File: s.files[c.p], Offset: c.off + (a - c.lo), Buf: p.buf[a-from : z-from]})
			}
		})
	}
	for i := range p.reqs {
		if err := s.opts.Engine.Submit(&p.reqs[i]); err != nil {
			for j := 0; j < i; j++ {
				p.reqs[j].Wait()
			}
			p.recycle()
			s.mu.Lock()
			s.unrefLocked(v)
			s.stats.ReadErrors++
			s.mu.Unlock()
			return nil, nil, &TensorError{Op: "swap-in", Tensor: name, Err: err}
		}
	}
	p.started()
	return p, b[lo-from : hi-from], nil
}

func (s *Store) verify(p *Pending) error {
	var bad error
	from, to := int64(0), p.v.padded
	if p.ranged {
		from, to = p.from, p.to // whole units only: see RangeLen
	}
	s.sumUnits(p.v, func(i int, lo, hi int64) {
		if bad != nil || lo < from || min(lo+s.unit, p.v.padded) > to {
			return
		}
		got := crc32c.Checksum(p.buf[lo-from : hi-from])
		if got != p.v.sums[i] {
			path, off := s.fileAt(p.v, lo)
			bad = &TensorError{Op: "swap-in", Tensor: p.name, Err: fmt.Errorf("%w: bytes %d..%d (file %s offset %d): crc32c %08x, written %08x",
				ErrChecksum, lo, hi, path, off, got, p.v.sums[i])}
		}
	})
	if bad != nil {
		s.mu.Lock()
		s.stats.ChecksumFailures++
		s.mu.Unlock()
	}
	return bad
}

// Delete drops name; its extents are freed when no read uses them.
func (s *Store) Delete(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.tensors[name]
	if !ok {
		return
	}
	delete(s.tensors, name)
	s.stats.LiveBytes -= v.padded
	v.retired = true
	if v.refs == 0 {
		s.freeLocked(v)
	}
}

func (s *Store) unrefLocked(v *version) {
	v.refs--
	if v.refs == 0 && v.retired {
		s.freeLocked(v)
	}
}

func (s *Store) freeLocked(v *version) {
	for i, e := range v.ext {
		if e.len > 0 {
			s.allocs[i].release(e.off, e.len)
		}
	}
	v.ext = nil
}

// Locate returns, for diagnostics and tests (e.g. corrupting a chunk on
// purpose), the file and offset holding byte off of name's current version.
func (s *Store) Locate(name string, off int64) (path string, fileOff int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.tensors[name]
	if !ok {
		return "", 0, &TensorError{Op: "locate", Tensor: name, Err: ErrNotFound}
	}
	if off < 0 || off >= v.length {
		return "", 0, &TensorError{Op: "locate", Tensor: name, Err: fmt.Errorf("offset %d outside 0..%d", off, v.length)}
	}
	if v.file != nil {
		return v.file.Path(), v.fileOff + v.head + off, nil
	}
	n := int64(len(s.files))
	k := off / s.stripe
	p := k % n
	return s.files[p].Path(), v.ext[p].off + (k/n)*s.stripe + off%s.stripe, nil
}

// Close removes the scratch files. Operations still pending must have been
// waited for; Close does not wait for them.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	var errs []error
	for _, f := range s.files {
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.closeAdopted())
	for _, d := range s.dirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("swapper: removing scratch dir %s: %w", d, err))
		}
	}
	// The locks go last: a directory is never unlocked while it exists.
	for _, l := range s.locks {
		l.Close()
	}
	return errors.Join(errs...)
}

// extentAlloc hands out byte ranges of one swap file by size class: a
// freed extent is reused only for an extent of exactly its length (the
// lowest such first), else the file grows at its end; extents freed at the
// end give the end back.
//
// Why size classes rather than first fit: they bound the file. A class
// gets a new extent only when every extent of that class is in use, so a
// class never has more extents than it ever had live at once, and a store
// holding at most V versions of tensors of padded sizes s_i never grows its
// file beyond V*sum(s_i), which is what DiskBytes promises. First fit has
// no such bound: holes left between tensors of other sizes push the end
// out, and simulated swap patterns reach 1.9 times that figure. The
// swappers rewrite tensors of fixed sizes, so exact reuse loses nothing
// there.
type extentAlloc struct {
	end, high int64             // current end; the most it has been (the file length)
	free      map[int64][]int64 // length -> offsets of free extents, ascending
	freeEnds  map[int64]int64   // off+len -> len of every free extent
}

func (a *extentAlloc) alloc(n int64) int64 {
	if offs := a.free[n]; len(offs) > 0 {
		off := offs[0]
		a.free[n] = offs[1:]
		delete(a.freeEnds, off+n)
		return off
	}
	off := a.end
	a.end += n
	a.high = max(a.high, a.end)
	return off
}

func (a *extentAlloc) release(off, n int64) {
	if off+n == a.end {
		a.end = off
		// Free extents now at the end give it back too.
		for {
			l, ok := a.freeEnds[a.end]
			if !ok {
				return
			}
			delete(a.freeEnds, a.end)
			a.end -= l
			offs := a.free[l]
			if i, found := slices.BinarySearch(offs, a.end); found {
				a.free[l] = slices.Delete(offs, i, i+1)
			}
		}
	}
	if a.free == nil {
		a.free, a.freeEnds = make(map[int64][]int64), make(map[int64]int64)
	}
	offs := a.free[n]
	i, _ := slices.BinarySearch(offs, off)
	a.free[n] = slices.Insert(offs, i, off)
	a.freeEnds[off+n] = n
}

// Rename atomically makes each from name the current version of its to
// name (replacing any version there) and removes the from names. Either
// every pair is applied or, when a from name is missing, none is. Swappers
// use it to commit a whole optimizer step at once: new versions are written
// under staging names and renamed only after all of them are on disk.
func (s *Store) Rename(pairs ...[2]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	for _, p := range pairs {
		if _, ok := s.tensors[p[0]]; !ok {
			return &TensorError{Op: "rename", Tensor: p[0], Err: ErrNotFound}
		}
	}
	for _, p := range pairs {
		v := s.tensors[p[0]]
		delete(s.tensors, p[0])
		if old, ok := s.tensors[p[1]]; ok {
			s.stats.LiveBytes -= old.padded
			old.retired = true
			if old.refs == 0 {
				s.freeLocked(old)
			}
		}
		s.tensors[p[1]] = v
	}
	return nil
}
