package grad

import (
	"context"
	"errors"
	"fmt"
	ztensor "github.com/zinfio/zinf/tensor"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/vec"
	"github.com/zinfio/zinf/internal/base/yield"
	"github.com/zinfio/zinf/swapper"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrClosed: the swapper was closed.
	ErrClosed = ztensor.ClosedError("grad: swapper closed")
	// ErrUnknown: no gradient of that name was registered.
	ErrUnknown = errors.New("grad: gradient not registered")
)

// DefaultKeyPrefix prefixes gradient names in the store, so that a store
// shared with the parameter swapper keeps them apart.
const DefaultKeyPrefix = "grad/"

// Options configure a Swapper. Zero fields take the documented defaults.
type Options struct {
	// Store receives the gradients written behind. Default nil: every
	// gradient stays in pinned memory.
	Store *swapper.Store
	// Pool provides the pinned buffers (purpose gradients). Required.
	Pool *buffers.Pool
	// Logger, default slog.Default().
	Logger *slog.Logger
	// KeepInCPUBytes keeps gradients in pinned memory instead of NVMe
	// while the budget allows, in registration order. Default 0.
	KeepInCPUBytes int64
	// Keep names gradients kept in pinned memory whatever KeepInCPUBytes
	// says (the runtime's zinf.pinned_grads: the set the planner found room
	// for, by name, so that the order of registration does not change
	// it). A kept gradient holds its buffer from Register on, is never
	// written to the store nor read back from it, and is not cut into
	// pieces. Default nil: KeepInCPUBytes alone decides.
	Keep func(name string) bool
	// KeyPrefix prefixes a gradient's name to form its store key. Default
	// DefaultKeyPrefix ("grad/").
	KeyPrefix string
	// SumSquares keeps, per gradient, the sum of the squares of its
	// accumulated values (see Swapper.SumSquares), computed by Accumulate
	// from the pinned copy before it is written behind, so the global
	// gradient norm never reads a gradient back. Default false.
	SumSquares bool
	// PieceElems, when > 0, keeps every gradient written to the store
	// that is longer than it in pieces of PieceElems elements (the last
	// shorter), each its own store key and pinned buffer: Accumulate and
	// AccumulateSpans read, add and write one piece at a time, so a
	// gradient's pinned need is one piece, not the partition. ReadRange
	// ranges must then lie within one piece (the optimizer's sub-groups
	// do when PieceElems is a multiple of the sub-group size); SumSquares
	// is still the whole gradient's, in index order. Default 0: every
	// gradient is one piece.
	PieceElems int
	// ServeWhileWriting lets a read (Read, ReadAsync, ReadRange) of a
	// gradient whose write-behind is in flight copy from the pinned copy
	// being written instead of waiting for the write and reading it back
	// from the store: the optimizer reading a layer just handed over. Such
	// a read cannot report that write's failure; the next operation on
	// the gradient, or Flush, does. The runtime sets it: its Step flushes
	// the gradients before it commits. Default false: every read waits
	// for the write and reports its failure.
	ServeWhileWriting bool
}

// EnsureDefaults fills the zero fields of o with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
}

// Validate reports every invalid field, joined.
func (o *Options) Validate() error {
	var errs []error
	if o.Pool == nil {
		errs = append(errs, errors.New("grad: Options.Pool = nil: required (the pinned gradient buffers)"))
	}
	if o.PieceElems < 0 {
		errs = append(errs, fmt.Errorf("grad: Options.PieceElems = %d: must be >= 0 (0 means whole gradients)", o.PieceElems))
	}
	if o.KeepInCPUBytes < 0 {
		errs = append(errs, fmt.Errorf("grad: Options.KeepInCPUBytes = %d: must be >= 0 (0 means write every gradient to the store)", o.KeepInCPUBytes))
	}
	return errors.Join(errs...)
}

// Waiter is an operation in progress; Wait blocks until it is done and
// returns its outcome. Wait may be called more than once, from any
// goroutine.
type Waiter interface{ Wait() error }

// Stats are a swapper's cumulative counters and current gauges.
type Stats struct {
	BytesWritten, BytesRead int64 // to and from the store
	Writes, Reads           int64 // completed store writes and reads
	WriteErrors             int64 // failed write-behinds
	Retries                 int64 // writes of a pinned copy re-issued after a failure (by Flush, or by an Accumulate that needs its memory)
	WriteWait               time.Duration
	// ServedReads and ServedBytes count the reads served from the pinned
	// copy of a gradient whose write-behind was still in flight (the
	// optimizer reading a layer just handed over): no wait for the
	// write, no store read.
	ServedReads, ServedBytes int64
	// HandOffTime is the time Accumulate spent copying or adding
	// HandOffBytes of gradients into their pinned sums (its arithmetic,
	// not its I/O): the rate is policy.Costs.HandOffBytesPerSec.
	HandOffTime  time.Duration
	HandOffBytes int64
	// PairedBytes is the part of HandOffBytes added two gradients at a
	// time (AccumulatePair: one pass over the sum for both).
	PairedBytes int64
	// Gauges.
	PinnedBytes int64 // pinned memory held now (kept gradients, copies awaiting their write)
	KeptBytes   int64 // KeepInCPUBytes budget given to kept gradients
	Pending     int   // write-behinds in flight
	// KeptNamed and KeptNamedBytes count the gradients Options.Keep kept
	// in pinned memory and their bytes (4 per element).
	KeptNamed      int
	KeptNamedBytes int64
}

// tensor is one gradient partition. Its mutable fields are guarded by
// Swapper.mu; op orders the operations on it.
type tensor struct {
	name, key string
	n, bytes  int
	keep      bool // kept in pinned memory, never written to the store
	op        chan struct{}

	buf        *buffers.Buffer // pinned copy; the truth while dirty
	has        bool            // accumulated since Zero
	dirty      bool            // the pinned copy is newer than the store
	write      *write          // write-behind in flight
	serving    bool            // a read copies from buf while write is in flight (see serve)
	unreported error           // a failed write, until an operation reports it
	sumSq      float64         // Options.SumSquares: of the accumulated values

	// pieces: a gradient kept in pieces (Options.PieceElems); the parent
	// then holds no memory and each piece covers [lo, lo+n) of it.
	// resume: after an Accumulate that failed part way, the pieces of it
	// already added (its retry skips them).
	pieces []*tensor
	lo     int
	resume int
	// sumOK: sumSq is the sum of the pieces' squares (the last
	// accumulation went through every piece in order, or SumSquares
	// summed them since).
	sumOK bool

	// readers are the store reads ReadRangeAsync issued and their Wait
	// has not ended yet: they read the store's copy without holding op,
	// so that several ranges of one gradient can be in flight at once
	// (an optimizer step reading sub-groups ahead). drained is closed
	// when the last one ends. Guarded by rmu. lock waits for them: every
	// operation that changes the gradient starts after the reads of it.
	rmu     sync.Mutex
	readers int
	drained chan struct{}
}

// write is one write-behind; done is closed when it finished (its
// failure, if any, is in tensor.unreported by then).
type write struct{ done chan struct{} }

// lock takes t's operation lock and waits for t's store reads in flight
// (readers) to end: nothing changes the gradient under a read.
func (t *tensor) lock(ctx context.Context) error {
	if err := t.lockShared(ctx); err != nil {
		return err
	}
	if err := t.waitReaders(ctx); err != nil {
		t.unlock()
		return err
	}
	return nil
}

// lockShared takes t's operation lock without waiting for its store
// reads: for a read, which may go on beside them.
func (t *tensor) lockShared(ctx context.Context) error {
	select {
	case t.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &swapper.TensorError{Op: "gradient", Tensor: t.name, Err: ctx.Err()}
	}
}

// waitReaders waits until no store read of t is in flight (op held, so
// no new one starts); ctx ends the wait (nil: none).
func (t *tensor) waitReaders(ctx context.Context) error {
	t.rmu.Lock()
	ch := t.drained
	t.rmu.Unlock()
	if ch == nil {
		return nil
	}
	if ctx == nil {
		<-ch
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return &swapper.TensorError{Op: "gradient", Tensor: t.name, Err: fmt.Errorf("waiting for %d range reads of it to be waited for (RangeRead.Wait): %w", t.readerCount(), ctx.Err())}
	}
}

func (t *tensor) readerCount() int {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	return t.readers
}

// addReader counts a store read of t issued; doneReader its end.
func (t *tensor) addReader() {
	t.rmu.Lock()
	if t.readers == 0 {
		t.drained = make(chan struct{})
	}
	t.readers++
	t.rmu.Unlock()
}

func (t *tensor) doneReader() {
	t.rmu.Lock()
	t.readers--
	if t.readers == 0 {
		close(t.drained)
		t.drained = nil
	}
	t.rmu.Unlock()
}

func (t *tensor) unlock() { <-t.op }

// Swapper accumulates gradient partitions and writes them behind.
type Swapper struct {
	opts  Options
	store *swapper.Store
	pool  *buffers.Pool

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup      // operations, write-behinds and ReadAsync in flight
	opctx  *swapper.OpContexts // operations' contexts; their end calls wg.Done

	mu      sync.Mutex
	tensors map[string]*tensor
	kept    int64
	closed  bool
	stats   Stats

	writeWait atomic.Int64
	// handOffNs and handOffBytes measure Accumulate's arithmetic (Stats).
	handOffNs, handOffBytes atomic.Int64
	// pairedBytes is the part of handOffBytes added two gradients at a
	// time (AccumulatePair).
	pairedBytes atomic.Int64
}

// New validates opts and returns a Swapper.
func New(opts Options) (*Swapper, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Swapper{opts: opts, store: opts.Store, pool: opts.Pool, ctx: ctx, cancel: cancel, tensors: make(map[string]*tensor)}
	s.opctx = swapper.NewOpContexts(ctx, s.wg.Done)
	return s, nil
}

// Register declares a gradient partition of numel float32 elements (this
// rank's partition length; 0 is legal and costs nothing). It is kept in
// pinned memory when there is no store, when Options.Keep names it, or
// while KeepInCPUBytes allows; a kept gradient's buffer is taken from the
// pool here, and Register fails, registering nothing, when the pool has no
// room for it — except for one Options.Keep names, which then takes the
// store's round trip (in pieces, with PieceElems), with a warning.
func (s *Swapper) Register(name string, numel int) error {
	if name == "" || numel < 0 {
		return fmt.Errorf("grad: register %q: need a name and numel >= 0 (got %d)", name, numel)
	}
	t := &tensor{name: name, key: s.opts.KeyPrefix + name, n: numel, bytes: 4 * numel, op: make(chan struct{}, 1)}
	size := s.bufSize(t)
	named := s.store != nil && numel > 0 && s.opts.Keep != nil && s.opts.Keep(name)
	maxBuf := s.pool.MaxBufferBytesFor(buffers.PurposeGradients)
	if named && size > maxBuf {
		// Whole, it would need a buffer the pool cannot give: it takes
		// the store's round trip (in pieces, if it has them).
		s.opts.Logger.Warn("grad: a gradient to keep in pinned memory is larger than the pool's largest buffer for gradients; it is written to the store and read back",
			"tensor", name, "bytes", size, "largest", maxBuf)
		named = false
	}
	if s.store != nil && s.opts.PieceElems > 0 && numel > s.opts.PieceElems && !named {
		size = min(size, int(s.store.PaddedLen(4*int64(s.opts.PieceElems))))
	}
	if size > maxBuf {
		return fmt.Errorf("grad: register %q: a %d-byte gradient needs a buffer larger than the pool's largest for gradients (%d bytes)", name, size, maxBuf)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, dup := s.tensors[name]; dup {
		return fmt.Errorf("grad: register %q: already registered", name)
	}
	var namedBuf *buffers.Buffer
	if named {
		// Kept by name: its buffer is taken now, like any kept gradient's.
		// Without room (a pool smaller than the one the set was chosen
		// for) it takes the store's round trip instead, and says so.
		b, ok := s.pool.TryAcquire(s.bufSize(t), buffers.PurposeGradients)
		if !ok {
			s.opts.Logger.Warn("grad: no room in the pinned pool to keep this gradient in memory; it is written to the store and read back",
				"tensor", name, "bytes", s.bufSize(t), "free", s.pool.Stats().FreeBytes)
			named = false
		} else {
			namedBuf = b
		}
	}
	if s.store != nil && s.opts.PieceElems > 0 && numel > s.opts.PieceElems && !named && int64(t.bytes)+s.kept > s.opts.KeepInCPUBytes {
		for lo, k := 0, 0; lo < numel; lo, k = lo+s.opts.PieceElems, k+1 {
			n := min(s.opts.PieceElems, numel-lo)
			t.pieces = append(t.pieces, &tensor{name: name, key: fmt.Sprintf("%s#%d", t.key, k), n: n, bytes: 4 * n, lo: lo, op: make(chan struct{}, 1)})
		}
		t.sumOK = true // of nothing yet
		s.tensors[name] = t
		return nil
	}
	keptBudget := false
	if s.store == nil || named {
		t.keep = true
	} else if t.bytes > 0 && s.kept+int64(t.bytes) <= s.opts.KeepInCPUBytes {
		t.keep, keptBudget = true, true
	}
	if named {
		t.buf = namedBuf
	} else if t.keep && t.n > 0 {
		// A kept gradient's buffer is taken now, in registration order,
		// before any write-behind buffer comes and goes: taken later, it
		// could land in the middle of the free memory and split the block
		// the largest gradient needs (see PinnedNeedBytes). Register is
		// all or nothing: without the buffer nothing is registered.
		b, ok := s.pool.TryAcquire(s.bufSize(t), buffers.PurposeGradients)
		if !ok {
			return fmt.Errorf("grad: register %q: no %d bytes free in the pinned pool for a gradient kept in memory (free: %d bytes; raise the pool or lower KeepInCPUBytes)",
				name, s.bufSize(t), s.pool.Stats().FreeBytes)
		}
		t.buf = b
	}
	if keptBudget {
		s.kept += int64(t.bytes)
	}
	if named {
		s.stats.KeptNamed++
		s.stats.KeptNamedBytes += int64(t.bytes)
	}
	s.tensors[name] = t
	return nil
}

// bufSize is the pinned buffer a gradient needs: its bytes, padded to the
// store's alignment when it is written there.
func (s *Swapper) bufSize(t *tensor) int {
	if s.store == nil || t.bytes == 0 {
		return t.bytes
	}
	return int(s.store.PaddedLen(int64(t.bytes)))
}

// leavesLocked lists every gradient's memory holders: the gradients, or
// their pieces. s.mu is held.
func (s *Swapper) leavesLocked() []*tensor {
	out := make([]*tensor, 0, len(s.tensors))
	for _, t := range s.tensors {
		if t.pieces != nil {
			out = append(out, t.pieces...)
		} else {
			out = append(out, t)
		}
	}
	return out
}

// begin looks name up and registers an operation that Close waits for;
// the caller calls end. ctx is also cancelled by Close.
func (s *Swapper) begin(ctx context.Context, op, name string) (t *tensor, _ context.Context, end func(), err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, nil, &swapper.TensorError{Op: op, Tensor: name, Err: ErrClosed}
	}
	t, ok := s.tensors[name]
	if !ok {
		s.mu.Unlock()
		return nil, nil, nil, &swapper.TensorError{Op: op, Tensor: name, Err: ErrUnknown}
	}
	s.wg.Add(1)
	s.mu.Unlock()
	// The operation ends with the caller's context and at Close, without
	// an allocation per operation (see swapper.OpContexts).
	ctx, end = s.opctx.Get(ctx)
	return t, ctx, end, nil
}

// settle waits for t's write-behind (t.op held) and returns a failure not
// yet reported, which it thereby reports.
func (s *Swapper) settle(ctx context.Context, t *tensor) error {
	s.mu.Lock()
	w := t.write
	s.mu.Unlock()
	if w != nil {
		start := time.Now()
		select {
		case <-w.done:
		case <-ctx.Done():
			return &swapper.TensorError{Op: "gradient", Tensor: t.name, Err: ctx.Err()}
		}
		s.writeWait.Add(int64(time.Since(start)))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := t.unreported
	t.unreported = nil
	return err
}

// serve is settle for a read: a failed write-behind whose sum is still in
// pinned memory is written again first, and a failure not yet reported
// is returned (and thereby reported); with Options.ServeWhileWriting, while t's
// write-behind is in flight, the pinned copy
// it writes is returned instead of waiting for the write, and the read
// copies from it, then calls served (t.op held throughout, so nothing
// else changes the copy; the write only reads it). Otherwise it settles
// and returns nil.
func (s *Swapper) serve(ctx context.Context, t *tensor) (*buffers.Buffer, error) {
	s.mu.Lock()
	if t.unreported != nil && rewritable(t) {
		// The write-behind failed and the sum is still in pinned memory:
		// write it again first (as an Accumulate short of memory would),
		// so that a failure that does not recur is never seen.
		t.unreported = nil
		s.stats.Retries++
		buf := t.buf
		s.mu.Unlock()
		s.startWrite(t, buf)
		s.mu.Lock()
	}
	if err := t.unreported; err != nil {
		t.unreported = nil
		s.mu.Unlock()
		return nil, err
	}
	if s.opts.ServeWhileWriting && t.write != nil && t.buf != nil && t.has {
		t.serving = true
		s.mu.Unlock()
		return t.buf, nil
	}
	s.mu.Unlock()
	return nil, s.settle(ctx, t)
}

// served ends a read from the pinned copy serve returned: the copy is
// given back if its write completed meanwhile (the write leaves it to the
// read).
func (s *Swapper) served(t *tensor, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.serving = false
	s.stats.ServedReads++
	s.stats.ServedBytes += int64(bytes)
	if t.write == nil && !t.dirty && !t.keep && t.buf != nil {
		t.buf.Release()
		t.buf = nil
	}
}

// acquire takes t's buffer. Gradient memory comes back only when a
// write-behind completes; one that fails keeps its gradient's buffer (so
// nothing is lost) until a write of it succeeds — whether its failure was
// reported yet or not. So while the pool has no room, acquire waits for
// the writes in flight, writes a kept copy again when none is in flight,
// and returns the new failure of one instead of waiting for memory that
// would never come back.
func (s *Swapper) acquire(ctx context.Context, t *tensor) (*buffers.Buffer, error) {
	for {
		if b, ok := s.pool.TryAcquire(s.bufSize(t), buffers.PurposeGradients); ok {
			return b, nil
		}
		s.mu.Lock()
		var held *tensor
		var inFlight *write
		for _, o := range s.leavesLocked() {
			switch {
			case o == t || o.buf == nil:
			case o.write != nil:
				inFlight = o.write
			case held == nil && rewritable(o):
				held = o
			}
		}
		rewrote := false // inFlight is held's write, issued here
		if inFlight == nil && held != nil {
			// Write the kept gradient again: when the cause is gone (space
			// freed) its memory comes back; else the new failure is
			// returned, and a retry tries once more. The rewrite needs
			// held's operation lock (no Accumulate may change the buffer
			// under the write); when another operation has it, that one
			// reports the failure and lets go, so look again shortly.
			select {
			case held.op <- struct{}{}:
			default:
				s.mu.Unlock()
				select {
				case <-time.After(time.Millisecond):
				case <-ctx.Done():
					return nil, s.named("accumulate", t, ctx.Err())
				}
				continue
			}
			if !rewritable(held) {
				held.unlock() // changed while we looked: look again
				s.mu.Unlock()
				continue
			}
			// A new failure replaces an unreported one; a success makes
			// it moot (nothing was lost).
			held.unreported = nil
			s.stats.Retries++
			buf := held.buf
			s.mu.Unlock()
			s.startWrite(held, buf)
			held.unlock()
			s.mu.Lock()
			inFlight, rewrote = held.write, true
			if inFlight == nil {
				// Either the write could not even be issued, or it was
				// and has already finished. Only a failure is reported;
				// a success gave the memory back, so acquire again.
				err := held.unreported
				s.mu.Unlock()
				if err != nil {
					return nil, s.named("accumulate", t, fmt.Errorf("no pinned memory while a failed write-behind keeps its gradient: %w", err))
				}
				continue
			}
		}
		s.mu.Unlock()
		if inFlight != nil {
			select {
			case <-inFlight.done:
			case <-ctx.Done():
				return nil, s.named("accumulate", t, ctx.Err())
			}
			// Another gradient's write gave its memory back (or failed and
			// is rewritten on the next turn); only a failed rewrite of
			// held's is reported.
			if rewrote {
				s.mu.Lock()
				err := held.unreported
				s.mu.Unlock()
				if err != nil {
					return nil, s.named("accumulate", t, fmt.Errorf("no pinned memory while a failed write-behind keeps its gradient: %w", err))
				}
			}
			continue
		}
		b, err := s.pool.Acquire(ctx, s.bufSize(t), buffers.PurposeGradients)
		if err != nil {
			return nil, s.named("accumulate", t, err)
		}
		return b, nil
	}
}

// rewritable reports whether t holds pinned memory only because its
// write-behind failed: the failure is not reported yet, or it was (by an
// Accumulate, a Read or the optimizer's ReadRange of an overlapped step)
// and no write has been issued since, so the dirty copy waits for Flush.
// Either way the memory comes back only by writing it again. s.mu is
// held.
func rewritable(t *tensor) bool {
	return t.buf != nil && t.write == nil && !t.keep && (t.unreported != nil || t.dirty)
}

// startWrite writes t's pinned copy buf behind (t.op held, no write in
// flight). A failure is kept for the next operation to report; the pinned
// copy stays until a write succeeds.
func (s *Swapper) startWrite(t *tensor, buf *buffers.Buffer) {
	p, err := s.store.WriteAsync(t.key, buf.Bytes()[:t.bytes])
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.stats.WriteErrors++
		t.unreported = s.named("swap-out", t, err)
		return
	}
	w := &write{done: make(chan struct{})}
	t.write = w
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := p.Wait()
		s.mu.Lock()
		t.write = nil
		if err != nil {
			err = s.named("swap-out", t, err)
			s.stats.WriteErrors++
			t.unreported = err
		} else {
			s.stats.Writes++
			s.stats.BytesWritten += int64(t.bytes)
			t.dirty = false
			if !t.keep && !t.serving {
				t.buf.Release() // on disk now: give the memory back
				t.buf = nil
			} // else the read copying from it gives it back (served)
		}
		s.mu.Unlock()
		close(w.done)
	}()
}

// named makes err name t, unless it already does (store errors name the
// store key, which contains the tensor's name).
func (s *Swapper) named(op string, t *tensor, err error) error {
	var te *swapper.TensorError
	if errors.As(err, &te) {
		return err
	}
	return &swapper.TensorError{Op: op, Tensor: t.name, Err: err}
}

// Accumulate adds a micro-step's gradient (the partition, numel long) to
// name's sum, element by element in float32. The sum starts at +0 after
// Zero, so the first call stores grad + 0 (grad itself, except that a -0
// becomes +0): that makes AccumulateSpans of any pieces exactly
// Accumulate of the full gradient with zeros elsewhere. It returns once
// the sum is in pinned memory; the store write is behind. If the previous
// write of name failed and no one reported it yet, Accumulate returns that
// error and does NOT add grad (the sum so far is intact; retry the call).
// A gradient kept in pieces (Options.PieceElems) is added piece by piece:
// a call that fails part way has added the pieces before the failure,
// and its retry (the same call) adds the rest; Zero forgets where it was.
func (s *Swapper) Accumulate(ctx context.Context, name string, grad []float32) error {
	return s.accumulateNamed(ctx, name, grad, nil, false)
}

// AccumulateHold is Accumulate without the write-behind: the sum stays in
// pinned memory until WriteBehind, Flush or an Accumulate of name writes
// it. A layer-major step sums each of a layer's gradients over its k
// micro-batches this way — k-1 AccumulateHold calls, then Accumulate — so
// the gradient is written once per step instead of read back and
// rewritten k times; the sum is the same, addition by addition. A held
// sum is not lost when the pool runs short: an Accumulate of another
// gradient that needs its memory writes it behind (as Flush would), and
// the next addition to it reads it back.
func (s *Swapper) AccumulateHold(ctx context.Context, name string, grad []float32) error {
	return s.accumulateNamed(ctx, name, grad, nil, true)
}

// AccumulatePair is Accumulate of a, then of b, in one pass over the sum:
// the same bits, addition by addition ((sum + a) + b element by element),
// with the sum read and written once instead of twice. A layer-major step
// hands two micro-batches' gradients of a layer over at once this way.
// On an error nothing is added (a gradient kept in pieces: the pieces
// before the failure have both added, and a retry of the same call adds
// both to the rest).
func (s *Swapper) AccumulatePair(ctx context.Context, name string, a, b []float32) error {
	return s.accumulatePair(ctx, name, a, b, false)
}

// AccumulatePairHold is AccumulatePair without the write-behind, as
// AccumulateHold is Accumulate's.
func (s *Swapper) AccumulatePairHold(ctx context.Context, name string, a, b []float32) error {
	return s.accumulatePair(ctx, name, a, b, true)
}

func (s *Swapper) accumulatePair(ctx context.Context, name string, a, b []float32, hold bool) error {
	if len(a) != len(b) {
		return &swapper.TensorError{Op: "accumulate", Tensor: name, Err: fmt.Errorf("a pair of gradients of %d and %d values", len(a), len(b))}
	}
	if b == nil {
		b = []float32{} // a pair, however short
	}
	return s.accumulateNamed(ctx, name, a, b, hold)
}

// WriteBehind starts writing name's sum held in pinned memory by
// AccumulateHold; it does nothing when nothing is held (a gradient kept in
// memory, one already written or being written, or none accumulated). A
// failure of an earlier write not yet reported is returned (the held sum
// stays, and Flush writes it again).
func (s *Swapper) WriteBehind(ctx context.Context, name string) error {
	t, ctx, end, err := s.begin(ctx, "write-behind", name)
	if err != nil {
		return err
	}
	defer end()
	if t.pieces != nil {
		for _, p := range t.pieces {
			if err := s.writeBehind(ctx, p); err != nil {
				return err
			}
		}
		return nil
	}
	return s.writeBehind(ctx, t)
}

func (s *Swapper) writeBehind(ctx context.Context, t *tensor) error {
	if t.n == 0 || t.keep {
		return nil
	}
	if err := t.lock(ctx); err != nil {
		return err
	}
	defer t.unlock()
	if err := s.settle(ctx, t); err != nil {
		return err
	}
	s.mu.Lock()
	buf, dirty := t.buf, t.dirty
	s.mu.Unlock()
	if buf != nil && dirty {
		s.startWrite(t, buf)
	}
	return nil
}

// accumulateNamed is Accumulate (hold false) and AccumulateHold; with
// grad2 not nil, AccumulatePair and AccumulatePairHold.
func (s *Swapper) accumulateNamed(ctx context.Context, name string, grad, grad2 []float32, hold bool) error {
	t, ctx, end, err := s.begin(ctx, "accumulate", name)
	if err != nil {
		return err
	}
	defer end()
	if len(grad) != t.n {
		return &swapper.TensorError{Op: "accumulate", Tensor: name, Err: fmt.Errorf("%d values for a partition of %d elements", len(grad), t.n)}
	}
	if t.pieces != nil {
		return s.accumulatePieces(ctx, t, nil, grad, grad2, hold)
	}
	return s.accumulate(ctx, t, nil, grad, grad2, hold, 0)
}

// accumulatePieces is accumulate for a gradient kept in pieces: each
// piece the call touches is read, added to and written behind in turn. A
// call that fails part way remembers the pieces it added, and its retry
// (the same call: the contract of a failed Accumulate) skips them, so
// that nothing is added twice; AbortStep's Zero forgets them.
func (s *Swapper) accumulatePieces(ctx context.Context, t *tensor, spans []Span, g, g2 []float32, hold bool) error {
	type job struct {
		p           *tensor
		spans       []Span
		vals, vals2 []float32
	}
	jobs := make([]job, 0, len(t.pieces))
	if spans == nil {
		for _, p := range t.pieces {
			j := job{p: p, vals: g[p.lo : p.lo+p.n]}
			if g2 != nil {
				j.vals2 = g2[p.lo : p.lo+p.n]
			}
			jobs = append(jobs, j)
		}
	} else {
		// Spans are ascending and disjoint, their values back to back:
		// the parts in one piece are consecutive, their values one slice.
		at, k := 0, 0
		for _, p := range t.pieces {
			var local []Span
			from, to := -1, 0
			for ; k < len(spans); k++ {
				sp := spans[k]
				lo, hi := max(sp.Lo, p.lo), min(sp.Hi, p.lo+p.n)
				if sp.Lo >= p.lo+p.n {
					break
				}
				if lo < hi {
					local = append(local, Span{lo - p.lo, hi - p.lo})
					if from < 0 {
						from = at + lo - sp.Lo
					}
					to = at + hi - sp.Lo
				}
				if sp.Hi > p.lo+p.n {
					break // the span goes on into the next piece
				}
				at += sp.Hi - sp.Lo
			}
			if local != nil {
				jobs = append(jobs, job{p: p, spans: local, vals: g[from:to]})
			}
		}
	}
	// A whole gradient goes through every piece in order, so the sum of
	// squares runs on from piece to piece: the whole's, exactly. Spans
	// leave the pieces they miss as they were: SumSquares then sums the
	// pieces again.
	full := spans == nil
	s.mu.Lock()
	start := min(t.resume, len(jobs))
	var prefix float64
	if full && start > 0 {
		prefix = jobs[start-1].p.sumSq
	}
	t.sumOK = false
	s.mu.Unlock()
	for i := start; i < len(jobs); i++ {
		j := jobs[i]
		from := 0.0
		if full {
			from = prefix
		}
		if err := s.accumulate(ctx, j.p, j.spans, j.vals, j.vals2, hold, from); err != nil {
			s.mu.Lock()
			t.resume = i
			s.mu.Unlock()
			return err
		}
		s.mu.Lock()
		prefix = j.p.sumSq
		s.mu.Unlock()
	}
	s.mu.Lock()
	t.resume = 0
	t.sumSq, t.sumOK = prefix, full
	s.mu.Unlock()
	return nil
}

// pieceSumSquares sums the squares of a gradient kept in pieces over its
// pieces in order, as of their last accumulation, reading from the store
// those not in pinned memory: the sum of the whole, addition by addition.
func (s *Swapper) pieceSumSquares(ctx context.Context, t *tensor) (float64, error) {
	var sum float64
	for _, p := range t.pieces {
		if err := p.lock(ctx); err != nil {
			return 0, err
		}
		err := func() error {
			defer p.unlock()
			if err := s.settle(ctx, p); err != nil {
				return err
			}
			s.mu.Lock()
			buf, has := p.buf, p.has
			s.mu.Unlock()
			switch {
			case !has:
				return nil // zeros add nothing
			case buf != nil:
				sum = sumSquaresFrom(sum, buf.Float32()[:p.n])
				return nil
			}
			b, err := s.acquire(ctx, p)
			if err != nil {
				return err
			}
			defer b.Release()
			if err := s.readStore(ctx, p, b); err != nil {
				return err
			}
			sum = sumSquaresFrom(sum, b.Float32()[:p.n])
			return nil
		}()
		if err != nil {
			return 0, err
		}
	}
	return sum, nil
}

// Span is a range [Lo, Hi) of elements of a partition.
type Span struct{ Lo, Hi int }

// AccumulateSpans adds a micro-step's gradient given for some ranges of
// name's partition only: g holds the spans' values back to back (spans
// ascending and disjoint, within [0, numel)), and every element outside
// them counts as 0. The result is bit for bit that of Accumulate with the
// full gradient, zeros elsewhere, whatever pieces a gradient comes in (the
// sum never holds -0, so adding +0 changes nothing). A rank or a layer
// that computes only a part of a gradient never builds the full length.
// Errors and retries are Accumulate's.
func (s *Swapper) AccumulateSpans(ctx context.Context, name string, spans []Span, g []float32) error {
	return s.accumulateSpans(ctx, name, spans, g, false)
}

// AccumulateSpansHold is AccumulateSpans without the write-behind, as
// AccumulateHold is Accumulate's.
func (s *Swapper) AccumulateSpansHold(ctx context.Context, name string, spans []Span, g []float32) error {
	return s.accumulateSpans(ctx, name, spans, g, true)
}

func (s *Swapper) accumulateSpans(ctx context.Context, name string, spans []Span, g []float32, hold bool) error {
	t, ctx, end, err := s.begin(ctx, "accumulate", name)
	if err != nil {
		return err
	}
	defer end()
	total, prev := 0, 0
	for i, sp := range spans {
		if sp.Lo < prev || sp.Hi < sp.Lo || sp.Hi > t.n {
			return &swapper.TensorError{Op: "accumulate", Tensor: name,
				Err: fmt.Errorf("span %d [%d, %d): spans must be ascending, disjoint and within the partition's %d elements", i, sp.Lo, sp.Hi, t.n)}
		}
		prev = sp.Hi
		total += sp.Hi - sp.Lo
	}
	if len(g) != total {
		return &swapper.TensorError{Op: "accumulate", Tensor: name, Err: fmt.Errorf("%d values for spans of %d elements", len(g), total)}
	}
	if total == 0 {
		return nil
	}
	if t.pieces != nil {
		return s.accumulatePieces(ctx, t, spans, g, nil, hold)
	}
	return s.accumulate(ctx, t, spans, g, nil, hold, 0)
}

// accumulate adds g to t's sum: the whole partition (spans nil), or the
// spans with g back to back; hold keeps the sum in pinned memory
// (AccumulateHold) instead of writing it behind.
func (s *Swapper) accumulate(ctx context.Context, t *tensor, spans []Span, grad, grad2 []float32, hold bool, sumFrom float64) error {
	if t.n == 0 {
		return nil
	}
	if err := t.lock(ctx); err != nil {
		return err
	}
	defer t.unlock()
	if err := s.settle(ctx, t); err != nil {
		return err
	}
	s.mu.Lock()
	buf, has := t.buf, t.has
	s.mu.Unlock()
	if buf == nil {
		var err error
		if buf, err = s.acquire(ctx, t); err != nil {
			return err
		}
		if has { // read-modify-write: the sum so far is only on disk
			if err := s.readStore(ctx, t, buf); err != nil {
				buf.Release()
				return err
			}
		}
	}
	acc := buf.Float32()[:t.n]
	t0 := time.Now()
	defer func() {
		s.handOffNs.Add(int64(time.Since(t0)))
		s.handOffBytes.Add(int64(4 * (len(grad) + len(grad2))))
		if grad2 != nil {
			s.pairedBytes.Add(int64(4 * (len(grad) + len(grad2))))
		}
	}()
	if !has && spans != nil {
		clear(acc) // the sum starts at +0
	}
	sumSq := sumFrom // a piece's sum goes on from the pieces before it
	switch {
	case spans != nil:
		at := 0
		for _, sp := range spans {
			addInto(acc[sp.Lo:sp.Hi], grad[at:at+sp.Hi-sp.Lo])
			at += sp.Hi - sp.Lo
		}
		if s.opts.SumSquares {
			sumSq = sumSquaresFrom(sumFrom, acc)
		}
	case grad2 != nil && !has:
		// (+0 + a) + b: Accumulate of a, then of b.
		inChunks3(acc, grad, grad2, vec.PlusZeroPair)
		if s.opts.SumSquares {
			sumSq = sumSquaresFrom(sumFrom, acc)
		}
	case grad2 != nil:
		inChunks3(acc, grad, grad2, vec.AddPair)
		if s.opts.SumSquares {
			sumSq = sumSquaresFrom(sumFrom, acc)
		}
	case !has:
		// +0 + g: a -0 becomes +0, as adding to the zeroed sum would.
		inChunks(acc, grad, vec.PlusZero)
		if s.opts.SumSquares {
			sumSq = sumSquaresFrom(sumFrom, acc)
		}
	case s.opts.SumSquares:
		inChunks(acc, grad, func(acc, grad []float32) {
			for i, g := range grad {
				a := acc[i] + g
				acc[i] = a
				d := float64(a)
				sumSq += float64(d * d)
			}
		})
	default:
		addInto(acc, grad)
	}
	s.mu.Lock()
	t.sumSq = sumSq
	t.buf, t.has = buf, true
	t.dirty = !t.keep
	s.mu.Unlock()
	if !t.keep && !hold {
		s.startWrite(t, buf)
	}
	return nil
}

// addInto adds g to acc element by element in float32.
func addInto(acc, g []float32) { inChunks(acc, g, vec.Add) }

// chunkElems is the elements of each operand a sum handles between two
// yield points.
const chunkElems = yield.Chunk / 4

// inChunks runs f on acc and g (len(acc) >= len(g)) whole, or, while
// compute is marked (package yield), on consecutive chunks of
// chunkElems in index order with a yield.Point between them: the same
// operations in the same order.
func inChunks(acc, g []float32, f func(acc, g []float32)) {
	for len(g) > 2*chunkElems && yield.Active() {
		f(acc[:chunkElems], g[:chunkElems])
		acc, g = acc[chunkElems:], g[chunkElems:]
		yield.Point()
	}
	f(acc, g)
}

// inChunks3 is inChunks for f of a sum and two gradients.
func inChunks3(acc, a, b []float32, f func(acc, a, b []float32)) {
	for len(a) > 2*chunkElems && yield.Active() {
		f(acc[:chunkElems], a[:chunkElems], b[:chunkElems])
		acc, a, b = acc[chunkElems:], a[chunkElems:], b[chunkElems:]
		yield.Point()
	}
	f(acc, a, b)
}

// readStore reads t's stored sum into buf.
func (s *Swapper) readStore(ctx context.Context, t *tensor, buf *buffers.Buffer) error {
	if err := s.store.Read(ctx, t.key, buf.Bytes()[:t.bytes]); err != nil {
		return s.named("swap-in", t, err)
	}
	s.mu.Lock()
	s.stats.Reads++
	s.stats.BytesRead += int64(t.bytes)
	s.mu.Unlock()
	return nil
}

// Flush waits for every write-behind and returns the first failure
// (naming its tensor; with a count of the others). Pinned copies whose
// failure was already reported are written again, so after space returns
// a second Flush succeeds.
func (s *Swapper) Flush(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.wg.Add(1)
	ts := s.leavesLocked()
	s.mu.Unlock()
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	slices.SortFunc(ts, func(a, b *tensor) int { return strings.Compare(a.key, b.key) })

	var errs []error
	var retried []*tensor
	for _, t := range ts {
		if err := t.lock(ctx); err != nil {
			errs = append(errs, err)
			break
		}
		s.mu.Lock()
		retry := t.write == nil && t.unreported == nil && t.dirty && !t.keep
		buf := t.buf
		if retry {
			s.stats.Retries++
		}
		s.mu.Unlock()
		if retry {
			s.startWrite(t, buf)
			retried = append(retried, t)
		} else {
			if err := s.settle(ctx, t); err != nil {
				errs = append(errs, err)
			}
		}
		t.unlock()
	}
	for _, t := range retried {
		if err := t.lock(ctx); err != nil {
			errs = append(errs, err)
			break
		}
		if err := s.settle(ctx, t); err != nil {
			errs = append(errs, err)
		}
		t.unlock()
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%w (and %d more gradient writes failed)", errs[0], len(errs)-1)
}

// Read copies name's accumulated gradient into dst (numel long), after
// waiting for its write-behind; a write failure not yet reported is
// returned instead. A gradient not accumulated since Zero reads as zeros.
func (s *Swapper) Read(ctx context.Context, name string, dst []float32) error {
	t, ctx, end, err := s.begin(ctx, "read", name)
	if err != nil {
		return err
	}
	defer end()
	return s.read(ctx, t, dst)
}

func (s *Swapper) read(ctx context.Context, t *tensor, dst []float32) error {
	if len(dst) != t.n {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: fmt.Errorf("destination has %d elements, the partition %d", len(dst), t.n)}
	}
	if t.pieces != nil {
		for _, p := range t.pieces {
			if err := s.read(ctx, p, dst[p.lo:p.lo+p.n]); err != nil {
				return err
			}
		}
		return nil
	}
	if t.n == 0 {
		return nil
	}
	if err := t.lock(ctx); err != nil {
		return err
	}
	defer t.unlock()
	if buf, err := s.serve(ctx, t); err != nil || buf != nil {
		if buf != nil {
			copy(dst, buf.Float32()[:t.n])
			s.served(t, 4*t.n)
		}
		return err
	}
	s.mu.Lock()
	buf, has := t.buf, t.has
	s.mu.Unlock()
	switch {
	case !has:
		clear(dst)
	case buf != nil:
		copy(dst, buf.Float32()[:t.n])
	default:
		b, err := s.pool.Acquire(ctx, s.bufSize(t), buffers.PurposeGradients)
		if err != nil {
			return s.named("read", t, err)
		}
		defer b.Release()
		if err := s.readStore(ctx, t, b); err != nil {
			return err
		}
		copy(dst, b.Float32()[:t.n])
	}
	return nil
}

// RangeBufferBytes is the capacity of the buffer ReadRange needs for
// elements [lo, hi) of a gradient: 4 bytes per element, widened to the
// store's transfer unit around the range when gradients go to a store (see
// swapper.Store.RangeLen). It is at most 4*(hi-lo) rounded up to that unit,
// plus one unit.
func (s *Swapper) RangeBufferBytes(lo, hi int) int {
	if hi <= lo {
		return 0
	}
	if s.store == nil {
		return 4 * (hi - lo)
	}
	if pe := s.opts.PieceElems; pe > 0 {
		// Ranges of a gradient in pieces lie in one piece, whose key
		// starts at the piece.
		base := lo / pe * pe
		lo, hi = lo-base, hi-base
	}
	return int(max(s.store.RangeLen(4*int64(lo), 4*int64(hi)), 4*int64(hi-lo)))
}

// ReadRange reads elements [lo, hi) of name's accumulated gradient
// straight into dst, the start of a pinned pool buffer of at least
// RangeBufferBytes(lo, hi) bytes, after waiting for the gradient's
// write-behind (a write failure not yet reported is returned instead;
// with Options.ServeWhileWriting a write in flight is not waited for: its
// pinned copy is copied). It
// returns the part of dst holding the values: a gradient on the store is
// read there directly (a ranged store read, no staging buffer), one kept in
// pinned memory is copied, one not accumulated since Zero reads as zeros.
// It takes no pinned memory of its own.
func (s *Swapper) ReadRange(ctx context.Context, name string, lo, hi int, dst []byte) ([]float32, error) {
	r, err := s.ReadRangeAsync(ctx, name, lo, hi, dst)
	if err != nil {
		return nil, err
	}
	return r.Wait()
}

// RangeRead is a ReadRangeAsync in flight: Wait returns what ReadRange
// would have.
type RangeRead = interface{ Wait() ([]float32, error) }

// rangeRead is the RangeRead of ReadRangeAsync.
type rangeRead struct {
	s       *Swapper
	t       *tensor
	release func() // unlocks t and ends the operation
	p       *swapper.Pending
	data    []byte // the store's view of dst, valid once p is waited for
	out     []float32
	err     error
	done    bool
}

// copied ends the hold of a read served from memory (op held): its
// values are in dst already, so the next operation need not wait for
// its Wait.
func (r *rangeRead) copied() *rangeRead {
	r.release() // unlocks op and ends the operation
	r.release = func() {}
	return r
}

// Wait implements RangeRead; it may be called more than once.
func (r *rangeRead) Wait() ([]float32, error) {
	if r.done {
		return r.out, r.err
	}
	r.done = true
	if r.p != nil {
		if err := r.p.Wait(); err != nil {
			r.err = r.s.named("swap-in", r.t, err)
		} else {
			r.out = buffers.Float32Bytes(r.data)
			r.s.mu.Lock()
			r.s.stats.Reads++
			r.s.stats.BytesRead += int64(len(r.data))
			r.s.mu.Unlock()
		}
	}
	r.release()
	return r.out, r.err
}

// CompletedAt is when the store read's I/O completed (the zero time for a
// gradient in pinned memory, or before Wait).
func (r *rangeRead) CompletedAt() time.Time {
	if r.p == nil || !r.done {
		return time.Time{}
	}
	return r.p.CompletedAt()
}

// ReadRangeAsync starts ReadRange(ctx, name, lo, hi, dst) and returns once
// the read is issued, so that an optimizer step's read-ahead can keep
// several sub-groups' gradient reads in flight. Errors found before the
// read (arguments, a write-behind failure not yet reported, ctx) are
// returned at once; the read's by Wait. Until Wait returns, dst belongs to
// the read, and a read from the store holds the gradient: other ranges of
// it may be read meanwhile (their reads go on beside it), but operations
// that change it (Accumulate, a write-behind, Zero) wait for the Wait. So
// Wait must be called after a nil error, from any goroutine.
func (s *Swapper) ReadRangeAsync(ctx context.Context, name string, lo, hi int, dst []byte) (RangeRead, error) {
	t, ctx, end, err := s.begin(ctx, "read", name)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (RangeRead, error) {
		end()
		return nil, &swapper.TensorError{Op: "read", Tensor: name, Err: err}
	}
	if lo < 0 || hi < lo || hi > t.n {
		return fail(fmt.Errorf("range [%d, %d) is outside the partition's %d elements", lo, hi, t.n))
	}
	if t.pieces != nil && hi > lo {
		p := t.pieces[lo/s.opts.PieceElems]
		if hi > p.lo+p.n {
			return fail(fmt.Errorf("range [%d, %d) spans two pieces of %d elements (Options.PieceElems): ranges must lie in one", lo, hi, s.opts.PieceElems))
		}
		if need := s.RangeBufferBytes(lo, hi); len(dst) < need {
			return fail(fmt.Errorf("destination has %d bytes; range [%d, %d) needs %d (RangeBufferBytes)", len(dst), lo, hi, need))
		}
		t, lo, hi = p, lo-p.lo, hi-p.lo
	}
	if t.pieces == nil {
		if need := s.RangeBufferBytes(lo, hi); len(dst) < need {
			return fail(fmt.Errorf("destination has %d bytes; range [%d, %d) needs %d (RangeBufferBytes)", len(dst), lo, hi, need))
		}
	}
	r := &rangeRead{s: s, t: t, release: end}
	if hi == lo {
		r.out = []float32{}
		return r, nil
	}
	// Other ranges' store reads may be in flight: this read goes on
	// beside them. Everything up to issuing the read runs under op.
	if err := t.lockShared(ctx); err != nil {
		end()
		return nil, err
	}
	r.release = func() { t.unlock(); end() }
	if buf, err := s.serve(ctx, t); err != nil || buf != nil {
		if err != nil {
			r.release()
			return nil, err
		}
		r.out = buffers.Float32Bytes(dst[:4*(hi-lo)])
		copy(r.out, buf.Float32()[lo:hi])
		s.served(t, 4*(hi-lo))
		return r.copied(), nil
	}
	s.mu.Lock()
	buf, has := t.buf, t.has
	s.mu.Unlock()
	switch {
	case !has:
		r.out = buffers.Float32Bytes(dst[:4*(hi-lo)])
		clear(r.out)
		return r.copied(), nil
	case buf != nil:
		r.out = buffers.Float32Bytes(dst[:4*(hi-lo)])
		copy(r.out, buf.Float32()[lo:hi])
		return r.copied(), nil
	}
	if err := ctx.Err(); err != nil {
		r.release()
		return nil, s.named("swap-in", t, err)
	}
	p, data, err := s.store.ReadRangeAsync(t.key, 4*int64(lo), 4*int64(hi), dst)
	if err != nil {
		r.release()
		return nil, s.named("swap-in", t, err)
	}
	r.p, r.data = p, data
	// The read holds no lock while in flight: the next range's read may
	// be issued now. What changes the gradient waits for it (lock).
	t.addReader()
	t.unlock()
	r.release = func() { t.doneReader(); end() }
	return r, nil
}

// PinnedNeedBytes is the pinned memory a Swapper with opts needs for the
// given partitions (in registration order) so that no operation can wait
// forever on the pool: every gradient kept in pinned memory (all of them
// without a Store; else while KeepInCPUBytes allows) holds its buffer for
// good, and an Accumulate, Read or ReadAsync of another gradient takes one
// buffer of that gradient's size, which its write-behind (or the read)
// gives back without needing more memory. So the need is the kept buffers
// plus the largest other one, each as the pool's allocator reserves it:
// blockBytes maps a request to the bytes it takes (nil: the buddy blocks of
// opts.Pool, see BlockBytes; with no Pool either, the request itself).
// ReadRange takes no memory of its own. More memory only lets more
// write-behinds overlap. Empty partitions cost nothing.
func PinnedNeedBytes(opts Options, partitionElems []int, blockBytes func(int64) int64) int64 {
	kept, other := pinnedNeed(opts, partitionElems, blockBytes)
	return kept + other
}

// WriteBufferBytes is the pool bytes the largest write-behind takes (the
// largest gradient written to the store, or its piece), counted as
// PinnedNeedBytes counts it; 0 when every gradient is kept in pinned
// memory. PinnedNeedBytes holds one such buffer beyond the kept ones; each
// further one lets one more write-behind be in flight while the next
// gradient is added (see Accumulate).
func WriteBufferBytes(opts Options, partitionElems []int, blockBytes func(int64) int64) int64 {
	_, other := pinnedNeed(opts, partitionElems, blockBytes)
	return other
}

// pinnedNeed is PinnedNeedBytes split into the kept gradients' buffers and
// the largest other one.
func pinnedNeed(opts Options, partitionElems []int, blockBytes func(int64) int64) (kept, other int64) {
	if blockBytes == nil {
		blockBytes = BlockBytes(opts.Pool)
	}
	var keptBudget int64
	for _, n := range partitionElems {
		if n <= 0 {
			continue
		}
		bytes := 4 * int64(n)
		if opts.Store == nil {
			kept += blockBytes(bytes)
			continue
		}
		size := blockBytes(opts.Store.PaddedLen(bytes))
		if opts.PieceElems > 0 && n > opts.PieceElems && keptBudget+bytes > opts.KeepInCPUBytes {
			other = max(other, blockBytes(opts.Store.PaddedLen(4*int64(opts.PieceElems))))
			continue
		}
		if keptBudget+bytes <= opts.KeepInCPUBytes {
			keptBudget += bytes
			kept += size
			continue
		}
		other = max(other, size)
	}
	return kept, other
}

// BlockBytes returns the bytes p's buddy allocator reserves for a request
// of n bytes, in the worst case of fragmentation: the pool's own rule,
// buffers.SpanBytes with p's granule (MinBufferBytes). Sizing a pool as
// the sum of such blocks guarantees that the requests fit whatever the
// order they are given back in. A nil pool gives n itself.
func BlockBytes(p *buffers.Pool) func(int64) int64 {
	if p == nil {
		return func(n int64) int64 { return max(n, 0) }
	}
	g := p.MinBufferBytes()
	return func(n int64) int64 { return buffers.SpanBytes(n, g) }
}

// readOp is a ReadAsync in flight.
type readOp struct {
	done chan struct{}
	err  error
}

func (r *readOp) Wait() error {
	<-r.done
	return r.err
}

// ReadAsync starts Read(name, dst) and returns at once, for the
// optimizer's read-ahead pipeline; dst must not be touched until Wait
// returns. Argument errors are returned at once, the rest by Wait.
func (s *Swapper) ReadAsync(name string, dst []float32) (Waiter, error) {
	t, ctx, end, err := s.begin(context.Background(), "read", name)
	if err != nil {
		return nil, err
	}
	if len(dst) != t.n {
		end()
		return nil, &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("destination has %d elements, the partition %d", len(dst), t.n)}
	}
	r := &readOp{done: make(chan struct{})}
	go func() {
		defer end()
		r.err = s.read(ctx, t, dst)
		close(r.done)
	}()
	return r, nil
}

// Zero forgets every accumulated gradient (after a successful optimizer
// step): writes still in flight are waited for and their outcome dropped,
// stored copies deleted, pinned copies of stored gradients given back.
// Kept gradients keep their buffers for the next step.
func (s *Swapper) Zero() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	ts := s.leavesLocked()
	for _, t := range s.tensors {
		t.resume = 0
		t.sumSq, t.sumOK = 0, true
	}
	s.mu.Unlock()
	defer s.wg.Done()
	for _, t := range ts {
		t.op <- struct{}{}
		_ = t.waitReaders(nil) // the reads of the gradient being dropped end first
		s.mu.Lock()
		w := t.write
		s.mu.Unlock()
		if w != nil {
			<-w.done
		}
		s.mu.Lock()
		t.has, t.dirty, t.unreported, t.sumSq = false, false, nil, 0
		if t.buf != nil && !t.keep {
			t.buf.Release()
			t.buf = nil
		}
		s.mu.Unlock()
		if s.store != nil && !t.keep {
			s.store.Delete(t.key)
		}
		t.unlock()
	}
}

// sumSquares is Σ float64(v[i])² in index order, each addition rounded
// to float64 once (the conversion keeps the compiler from fusing it with
// the multiplication); each square is exact.
func sumSquares(v []float32) float64 { return sumSquaresFrom(0, v) }

// sumSquaresFrom is sumSquares going on from s: the sum over pieces in
// order is the sum over the whole, addition by addition.
func sumSquaresFrom(s float64, v []float32) float64 {
	inChunks(v, v, func(v, _ []float32) {
		for _, x := range v {
			d := float64(x)
			s += float64(d * d)
		}
	})
	return s
}

// SumSquares returns the sum of the squares of name's accumulated
// gradient as of its last Accumulate, 0 when nothing was accumulated since
// Zero (Options.SumSquares must be on). It is computed in Accumulate, from
// the pinned sum just before its write-behind, in float64, element by
// element in index order, each square exact and each addition rounded
// once — the order optimizer.SumSquares documents — so it costs no read of
// the store. It is +Inf or NaN exactly when an element is inf or NaN.
// Call it once the gradient is final (after Flush, say): it does not wait
// for an Accumulate in progress.
func (s *Swapper) SumSquares(name string) (float64, error) {
	return s.SumSquaresContext(context.Background(), name)
}

// SumSquaresContext is SumSquares with a context. For a gradient kept in
// pieces (Options.PieceElems) the sum is the whole gradient's too, in
// index order: kept as the pieces are accumulated when an accumulation
// went through all of them, else (AccumulateSpans missed some) summed
// again over the pieces, reading those on the store — which is what ctx
// bounds.
func (s *Swapper) SumSquaresContext(ctx context.Context, name string) (float64, error) {
	if !s.opts.SumSquares {
		return 0, &swapper.TensorError{Op: "sum-squares", Tensor: name, Err: errors.New("grad: Options.SumSquares is off")}
	}
	t, ctx, end, err := s.begin(ctx, "sum-squares", name)
	if err != nil {
		return 0, err
	}
	defer end()
	s.mu.Lock()
	if t.pieces == nil {
		defer s.mu.Unlock()
		if !t.has {
			return 0, nil
		}
		return t.sumSq, nil
	}
	if t.sumOK {
		defer s.mu.Unlock()
		return t.sumSq, nil
	}
	s.mu.Unlock()
	sum, err := s.pieceSumSquares(ctx, t)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	t.sumSq, t.sumOK = sum, true
	s.mu.Unlock()
	return sum, nil
}

// Stats returns the counters and gauges.
func (s *Swapper) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.WriteWait = time.Duration(s.writeWait.Load())
	st.HandOffTime, st.HandOffBytes = time.Duration(s.handOffNs.Load()), s.handOffBytes.Load()
	st.PairedBytes = s.pairedBytes.Load()
	st.KeptBytes = s.kept
	for _, t := range s.leavesLocked() {
		if t.buf != nil {
			st.PinnedBytes += int64(t.buf.Cap())
		}
		if t.write != nil {
			st.Pending++
		}
	}
	return st
}

// Close waits for operations and write-behinds in flight, then gives back
// every pinned buffer and deletes the gradients from the store (they are
// scratch). Later calls fail with ErrClosed; Close is idempotent.
func (s *Swapper) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	s.opctx.Close()
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.leavesLocked() {
		if t.buf != nil {
			t.buf.Release()
			t.buf = nil
		}
		if s.store != nil && !t.keep {
			s.store.Delete(t.key)
		}
	}
	return nil
}
