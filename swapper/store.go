package swapper

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/zinfio/zinf/aio"
)

// Sentinel errors.
var (
	// ErrChecksum: bytes read back differ from what was written.
	ErrChecksum = errors.New("swapper: checksum mismatch")
	// ErrNotFound: no tensor of that name is in the store.
	ErrNotFound = errors.New("swapper: tensor not in store")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("swapper: store closed")
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
	// ReserveBytes preallocates (fallocate) this many bytes in each path's
	// swap file at open, so later swap-outs cannot run out of space midway.
	// Default 0: files grow as needed.
	ReserveBytes int64
	// Logger, default slog.Default().
	Logger *slog.Logger
}

// Store maps tensor names to extents in swap files. Methods are safe for
// concurrent use; operations on the same name are ordered by the caller
// (a swapper never writes a tensor while reading it).
type Store struct {
	opts   StoreOptions
	dirs   []string
	files  []*aio.File
	allocs []*extentAlloc
	align  int64
	stripe int64

	mu      sync.Mutex
	tensors map[string]*version
	closed  bool

	stats StoreStats
}

// StoreStats are cumulative store counters.
type StoreStats struct {
	BytesWritten, BytesRead int64 // logical tensor bytes
	Writes, Reads           int64
	WriteErrors, ReadErrors int64
	ChecksumFailures        int64
	LiveBytes               int64 // padded bytes of current versions
}

// version is one on-disk copy of a tensor.
type version struct {
	length  int64    // logical bytes
	padded  int64    // rounded up to the alignment
	ext     []extent // one per path (len 0 on a path with no chunks)
	sums    []uint32 // CRC-32C per stripe chunk, when checksums are on
	refs    int      // reads in flight on this version
	retired bool     // replaced or deleted: free extents at refs == 0
}

type extent struct{ off, len int64 }

// OpenStore creates the scratch directories and swap files.
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
		dir, err := os.MkdirTemp(p, fmt.Sprintf("zinf-%s-%d-", opts.Name, os.Getpid()))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("swapper: creating scratch dir in %s: %w", p, err)
		}
		s.dirs = append(s.dirs, dir)
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
	for range s.files {
		s.allocs = append(s.allocs, &extentAlloc{})
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
	return s.stats
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
}

// Wait blocks until the operation is done. For a write, success commits the
// new version; failure frees it and leaves the previous version in place.
// For a read, checksums are verified.
func (p *Pending) Wait() error {
	if p.waited {
		return p.err
	}
	p.waited = true
	var errs []error
	for i := range p.reqs {
		if _, err := p.reqs[i].Wait(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		p.err = &TensorError{Op: p.op, Tensor: p.name, Err: err}
	}
	s := p.s
	switch p.op {
	case "swap-out":
		s.finishWrite(p)
	default:
		if p.err == nil && p.v.sums != nil {
			p.err = s.verify(p)
		}
		s.mu.Lock()
		if p.err != nil {
			s.stats.ReadErrors++
		} else {
			s.stats.Reads++
			s.stats.BytesRead += p.v.length
		}
		s.unrefLocked(p.v)
		s.mu.Unlock()
	}
	p.reqs = nil
	return p.err
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
	if s.opts.Checksums {
		s.chunks(v, func(c chunk) {
			v.sums = append(v.sums, crc32.Checksum(full[c.lo:min(c.hi, n)], castagnoli))
		})
	}
	p := &Pending{s: s, op: "swap-out", name: name, v: v, buf: full}
	if err := s.submit(p, aio.OpWrite); err != nil {
		s.mu.Lock()
		s.freeLocked(v)
		s.stats.WriteErrors++
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-out", Tensor: name, Err: err}
	}
	return p, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// submit issues one request per stripe chunk (merged when there is a
// single path: one request, split by the engine into blocks).
func (s *Store) submit(p *Pending, op aio.Op) error {
	v := p.v
	if len(s.files) == 1 {
		p.reqs = make([]aio.Request, 1)
		p.reqs[0] = aio.Request{Op: op, File: s.files[0], Offset: v.ext[0].off, Buf: p.buf[:v.padded]}
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
			p.reqs = nil
			return err
		}
	}
	return nil
}

func (s *Store) finishWrite(p *Pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.err != nil {
		s.freeLocked(p.v)
		s.stats.WriteErrors++
		return
	}
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
	p := &Pending{s: s, op: "swap-in", name: name, v: v, buf: b[:v.padded]}
	if err := s.submit(p, aio.OpRead); err != nil {
		s.mu.Lock()
		s.unrefLocked(v)
		s.stats.ReadErrors++
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: err}
	}
	return p, nil
}

func (s *Store) verify(p *Pending) error {
	i := 0
	var bad error
	s.chunks(p.v, func(c chunk) {
		if bad == nil && c.lo < p.v.length {
			got := crc32.Checksum(p.buf[c.lo:min(c.hi, p.v.length)], castagnoli)
			if got != p.v.sums[i] {
				bad = &TensorError{Op: "swap-in", Tensor: p.name, Err: fmt.Errorf("%w: bytes %d..%d (file %s offset %d): crc32c %08x, written %08x",
					ErrChecksum, c.lo, min(c.hi, p.v.length), s.files[c.p].Path(), c.off, got, p.v.sums[i])}
			}
		}
		i++
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
	for _, d := range s.dirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("swapper: removing scratch dir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// extentAlloc hands out byte ranges of one swap file: first fit from a
// coalescing free list, else the end of the file.
type extentAlloc struct {
	end   int64
	holes []extent // sorted by off, non-adjacent
}

func (a *extentAlloc) alloc(n int64) int64 {
	for i, f := range a.holes {
		if f.len >= n {
			off := f.off
			if f.len == n {
				a.holes = append(a.holes[:i], a.holes[i+1:]...)
			} else {
				a.holes[i] = extent{off: f.off + n, len: f.len - n}
			}
			return off
		}
	}
	off := a.end
	a.end += n
	return off
}

func (a *extentAlloc) release(off, n int64) {
	i := sort.Search(len(a.holes), func(i int) bool { return a.holes[i].off > off })
	a.holes = append(a.holes, extent{})
	copy(a.holes[i+1:], a.holes[i:])
	a.holes[i] = extent{off: off, len: n}
	// Coalesce with the next and the previous.
	if i+1 < len(a.holes) && a.holes[i].off+a.holes[i].len == a.holes[i+1].off {
		a.holes[i].len += a.holes[i+1].len
		a.holes = append(a.holes[:i+1], a.holes[i+2:]...)
	}
	if i > 0 && a.holes[i-1].off+a.holes[i-1].len == a.holes[i].off {
		a.holes[i-1].len += a.holes[i].len
		a.holes = append(a.holes[:i], a.holes[i+1:]...)
		i--
	}
	// Give the tail back to the end of file.
	if last := len(a.holes) - 1; last >= 0 && a.holes[last].off+a.holes[last].len == a.end {
		a.end = a.holes[last].off
		a.holes = a.holes[:last]
	}
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
