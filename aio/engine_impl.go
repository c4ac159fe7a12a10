package aio

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// engine is the one Engine implementation: backend-independent request
// handling over per-worker rings.
type engine struct {
	opts    Options
	name    string
	workers []*worker
	dones   []chan struct{}

	mu       sync.RWMutex // guards closed against concurrent Submit
	closed   bool
	inflight sync.WaitGroup
	next     atomic.Uint32 // round-robin start worker for small requests

	readOps, writeOps, readBytes, writeBytes atomic.Int64
	pieces, retries, shorts, errs            atomic.Int64
	strays, ringErrs                         atomic.Int64
	fixedBufPieces, fixedFilePieces          atomic.Int64

	reqPool sync.Pool // *Request for ReadAt/WriteAt

	// memMu serializes changes to the registered memory; mem is the set
	// (RegisterMemory), memBytes its size when every ring took it.
	memMu    sync.Mutex
	mem      [][]byte
	memBytes atomic.Int64
	// memWarned and fileWarned make each fallback from registered buffers
	// and fixed files logged once per engine.
	memWarned, fileWarned atomic.Bool
}

var _ Engine = (*engine)(nil)

// New builds an Engine from opts (defaults filled, then validated). With
// Backend "auto" it tries uring, libaio and posix in that order and logs
// which it chose and why the others were skipped.
func New(opts Options) (Engine, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Backend != BackendAuto {
		return newEngine(opts, opts.Backend)
	}
	var skipped []error
	for _, b := range Backends {
		e, err := newEngine(opts, b)
		if err == nil {
			if len(skipped) > 0 {
				opts.Logger.Info("aio: auto chose backend "+b, "skipped", errors.Join(skipped...).Error())
			} else {
				opts.Logger.Debug("aio: auto chose backend " + b)
			}
			return e, nil
		}
		skipped = append(skipped, fmt.Errorf("%s: %w", b, err))
	}
	return nil, fmt.Errorf("aio: no backend works: %w", errors.Join(skipped...))
}

// Available reports whether backend can run here: nil, or an error wrapping
// ErrUnavailable that says why.
func Available(backend string) error {
	switch backend {
	case BackendUring:
		return uringAvailable()
	case BackendLibaio:
		return libaioAvailable()
	case BackendPosix, BackendAuto:
		return nil
	}
	return fmt.Errorf("aio: backend %q is unknown (allowed: auto, uring, libaio, posix): %w", backend, ErrUnavailable)
}

func ringFor(backend string) (newRingFunc, error) {
	switch backend {
	case BackendUring:
		return newUringRing, uringAvailable()
	case BackendLibaio:
		return newLibaioRing, libaioAvailable()
	case BackendPosix:
		return newPosixRing, nil
	}
	return nil, fmt.Errorf("aio: backend %q is unknown (allowed: auto, uring, libaio, posix)", backend)
}

func newEngine(opts Options, backend string) (*engine, error) {
	return newEngineWrapped(opts, backend, nil)
}

// newEngineWrapped is newEngine with every ring passed through wrap (when
// not nil) as it is created, replacements included. It is the ring-level
// fault seam: tests wrap rings to inject CQ overflows, stray completions,
// wait and submit errors; production code never sets it.
func newEngineWrapped(opts Options, backend string, wrap func(worker int, r ring) ring) (*engine, error) {
	nr, err := ringFor(backend)
	if err != nil {
		return nil, err
	}
	e := &engine{opts: opts, name: backend}
	e.opts.Backend = backend
	e.reqPool.New = func() any { return new(Request) }
	for i := 0; i < opts.IntraOpParallelism; i++ {
		newRing := nr
		if wrap != nil {
			id := i
			newRing = func(entries int) (ring, error) {
				r, err := nr(entries)
				if err != nil {
					return nil, err
				}
				return wrap(id, r), nil
			}
		}
		w := newWorker(e, i, newRing)
		ready := make(chan error, 1)
		done := make(chan struct{})
		go w.run(ready, done)
		if err := <-ready; err != nil {
			e.stopWorkers()
			return nil, fmt.Errorf("aio: %s: creating ring %d of %d: %w", backend, i+1, opts.IntraOpParallelism, err)
		}
		e.workers = append(e.workers, w)
		e.dones = append(e.dones, done)
	}
	return e, nil
}

func (e *engine) stopWorkers() {
	for i, w := range e.workers {
		close(w.stop)
		<-e.dones[i]
	}
	e.workers = nil
	e.dones = nil
}

func (e *engine) Name() string     { return e.name }
func (e *engine) Options() Options { return e.opts }

func (e *engine) Open(path string, flag int, perm os.FileMode) (*File, error) {
	return OpenFile(path, flag, perm, e.opts.Direct, e.opts.Logger)
}

// errInvalid builds the error for a request rejected before any I/O.
func (e *engine) errInvalid(r *Request, cause error) error {
	path := ""
	direct := false
	if r.File != nil {
		path, direct = r.File.path, r.File.direct
	}
	return &OpError{Op: r.Op.String(), Path: path, Offset: r.Offset, Bytes: len(r.Buf), Direct: direct, Backend: e.name, Err: cause}
}

func (e *engine) Submit(r *Request) error {
	if r.File == nil {
		return e.errInvalid(r, errors.New("nil file"))
	}
	if len(r.Buf) == 0 {
		return e.errInvalid(r, errors.New("empty buffer"))
	}
	if r.Offset < 0 {
		return e.errInvalid(r, errors.New("negative offset"))
	}
	if r.Op != OpRead && r.Op != OpWrite {
		return e.errInvalid(r, fmt.Errorf("unknown op %d", r.Op))
	}
	if f := r.File; f.direct {
		a := int64(f.align)
		addr := int64(uintptr(unsafe.Pointer(&r.Buf[0])))
		if r.Offset%a != 0 || int64(len(r.Buf))%a != 0 || addr%a != 0 || int64(e.opts.BlockSizeBytes)%a != 0 {
			return e.errInvalid(r, fmt.Errorf("%w: offset %d, length %d, buffer address %#x and block size %d must all be multiples of %d",
				ErrAlignment, r.Offset, len(r.Buf), addr, e.opts.BlockSizeBytes, a))
		}
	}
	if !r.state.CompareAndSwap(0, 1) {
		return e.errInvalid(r, errors.New("request already in flight (Wait before reusing it)"))
	}
	e.mu.RLock()
	if e.closed {
		e.mu.RUnlock()
		r.state.Store(0)
		return e.errInvalid(r, ErrClosed)
	}
	e.inflight.Add(1)
	e.mu.RUnlock()
	if err := r.File.acquire(); err != nil {
		e.inflight.Done()
		r.state.Store(0)
		return e.errInvalid(r, err)
	}
	if r.done == nil {
		r.done = make(chan struct{}, 1)
	}
	r.moved.Store(0)
	r.errSet.Store(false)
	r.err = nil

	// Split into at most IntraOpParallelism contiguous slices of whole
	// blocks, one per worker.
	bs := e.opts.BlockSizeBytes
	n := len(r.Buf)
	blocks := (n + bs - 1) / bs
	nw := min(len(e.workers), blocks)
	if cap(r.slices) < nw {
		r.slices = make([]slice, nw, len(e.workers))
	}
	r.slices = r.slices[:nw]
	per := (blocks + nw - 1) / nw * bs
	nw = (n + per - 1) / per // drop slices that would be empty
	r.slices = r.slices[:nw]
	r.pending.Store(int32(nw))
	start := int(e.next.Add(1))
	for i := 0; i < nw; i++ {
		lo := i * per
		hi := min(lo+per, n)
		r.slices[i] = slice{req: r, off: r.Offset + int64(lo), buf: r.Buf[lo:hi]}
		e.workers[(start+i)%len(e.workers)].queue <- &r.slices[i]
	}
	return nil
}

// finish completes a request (called by the worker that retired its last
// slice).
func (e *engine) finish(r *Request) {
	moved := r.moved.Load()
	if r.errSet.Load() {
		e.errs.Add(1)
		if oe, ok := r.err.(*OpError); ok {
			oe.Done = moved
		}
	} else if r.Op == OpRead {
		e.readOps.Add(1)
		e.readBytes.Add(moved)
	} else {
		e.writeOps.Add(1)
		e.writeBytes.Add(moved)
	}
	r.File.release()
	r.doneAt = time.Now()
	r.state.Store(2)
	r.done <- struct{}{}
	e.inflight.Done()
}

func (e *engine) do(ctx context.Context, op Op, f *File, buf []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	r := e.reqPool.Get().(*Request)
	r.Op, r.File, r.Buf, r.Offset = op, f, buf, off
	if err := e.Submit(r); err != nil {
		r.File, r.Buf = nil, nil
		e.reqPool.Put(r)
		return 0, err
	}
	// The buffer belongs to the kernel until completion, so the wait is not
	// abandoned on ctx cancellation; requests are bounded in size.
	n, err := r.Wait()
	r.File, r.Buf = nil, nil
	e.reqPool.Put(r)
	return int(n), err
}

func (e *engine) ReadAt(ctx context.Context, f *File, buf []byte, off int64) (int, error) {
	return e.do(ctx, OpRead, f, buf, off)
}

func (e *engine) WriteAt(ctx context.Context, f *File, buf []byte, off int64) (int, error) {
	return e.do(ctx, OpWrite, f, buf, off)
}

func (e *engine) Stats() Stats {
	return Stats{
		ReadOps: e.readOps.Load(), WriteOps: e.writeOps.Load(),
		ReadBytes: e.readBytes.Load(), WriteBytes: e.writeBytes.Load(),
		Pieces: e.pieces.Load(), Retries: e.retries.Load(),
		ShortTransfers: e.shorts.Load(), Errors: e.errs.Load(),
		StrayCompletions: e.strays.Load(), RingFailures: e.ringErrs.Load(),
		RegisteredBytes: e.memBytes.Load(), FixedBufferPieces: e.fixedBufPieces.Load(),
		FixedFilePieces: e.fixedFilePieces.Load(),
	}
}

// RegisterMemory implements Engine.
func (e *engine) RegisterMemory(mem []byte) error {
	if len(mem) == 0 {
		return errors.New("aio: RegisterMemory: empty region")
	}
	e.memMu.Lock()
	defer e.memMu.Unlock()
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	hi := lo + uintptr(len(mem))
	for _, m := range e.mem {
		a := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
		if lo < a+uintptr(len(m)) && a < hi {
			return fmt.Errorf("aio: RegisterMemory: %d bytes at %#x overlap the %d bytes at %#x registered already", len(mem), lo, len(m), a)
		}
	}
	set := append(e.mem[:len(e.mem):len(e.mem)], mem[:len(mem):len(mem)])
	return e.setMemory(set)
}

// UnregisterMemory implements Engine.
func (e *engine) UnregisterMemory(mem []byte) error {
	e.memMu.Lock()
	defer e.memMu.Unlock()
	for i, m := range e.mem {
		if unsafe.SliceData(m) == unsafe.SliceData(mem) && len(m) == len(mem) {
			// A ring that fails to take the rest of the set (logged by
			// setMemory) is left with none registered, which is as safe:
			// either way no operation uses mem's registration any more.
			_ = e.setMemory(append(e.mem[:i:i], e.mem[i+1:]...))
			return nil
		}
	}
	return fmt.Errorf("aio: UnregisterMemory: the %d bytes at %p were not registered", len(mem), unsafe.SliceData(mem))
}

// setMemory makes set the registered memory of every ring and waits until
// each has applied it; e.memMu is held. It returns what the rings
// reported, joined, and logs a fallback once.
func (e *engine) setMemory(set [][]byte) error {
	e.mem = set
	e.mu.RLock()
	closed := e.closed
	e.mu.RUnlock()
	if closed {
		e.memBytes.Store(0)
		return fmt.Errorf("aio: registering memory: %w", ErrClosed)
	}
	replies := make([]chan error, len(e.workers))
	for i, w := range e.workers {
		replies[i] = w.setMemory(set)
	}
	var errs []error
	for i, c := range replies {
		if err := <-c; err != nil {
			errs = append(errs, err)
			if !errors.Is(err, ErrClosed) {
				e.memoryFallback(e.workers[i], err)
			}
		}
	}
	var total int64
	for _, m := range set {
		total += int64(len(m))
	}
	if len(errs) > 0 {
		total = 0
	}
	e.memBytes.Store(total)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("aio: %s: registered buffers not used: %w", e.name, err)
	}
	return nil
}

// memoryFallback logs, once per engine, that a ring moves registered
// memory as ordinary memory.
func (e *engine) memoryFallback(w *worker, err error) {
	if !e.memWarned.CompareAndSwap(false, true) {
		return
	}
	if errors.Is(err, errors.ErrUnsupported) {
		e.opts.Logger.Info("aio: the "+e.name+" backend has no registered buffers; the kernel pins each request's pages as usual",
			"backend", e.name)
		return
	}
	e.opts.Logger.Warn("aio: io_uring could not register the pinned memory; requests use plain reads and writes, which pin their pages per request",
		"backend", e.name, "ring", w.id+1, "err", err)
}

// fixedFileFallback logs, once per engine, that a file is used by its
// descriptor because it could not get a fixed-file slot.
func (e *engine) fixedFileFallback(w *worker, f *File, err error) {
	if !e.fileWarned.CompareAndSwap(false, true) {
		return
	}
	e.opts.Logger.Info("aio: a file could not get an io_uring fixed-file slot; it, and any other that cannot, is used by its descriptor",
		"backend", e.name, "ring", w.id+1, "path", f.path, "err", err)
}

func (e *engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.inflight.Wait()
	e.stopWorkers()
	return nil
}
