package aio

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxRetries bounds consecutive EINTR/EAGAIN retries of one piece, so a
// device that keeps refusing cannot spin a worker forever.
const maxRetries = 1000

// slice is the contiguous part of a request that one worker moves.
type slice struct {
	req         *Request
	off         int64  // file offset of buf[0]
	buf         []byte // the slice's bytes
	pos         int    // next byte of buf to issue
	outstanding int    // pieces in flight
	failed      bool
}

// piece is one operation in flight: a token's state.
type piece struct {
	s       *slice
	off     int64
	buf     []byte // remaining bytes of the piece
	issued  int    // bytes asked for in the current submission
	retries int
	inUse   bool
	// inRing is set while the ring holds the operation (prepped and not
	// yet reaped), so a completion for a token the ring does not hold is
	// recognised as stray instead of corrupting another piece.
	inRing bool
	// cause, when set, is the error a synthetic completion for this piece
	// stands for (a ring that refused the submission); it is reported
	// instead of the bare errno and never retried.
	cause error
}

// worker owns one ring and keeps up to QueueDepth pieces in flight.
type worker struct {
	e       *engine
	id      int // index among the engine's workers, for messages
	newRing newRingFunc
	ring    ring
	queue   chan *slice
	stop    chan struct{}
	pieces  []piece
	free    []uint32 // free tokens
	active  []*slice // slices with bytes left to issue, FIFO
	comps   []completion
	synth   []completion // fault-injected completions, delivered before real ones
	batch   []completion // scratch copy of synth being handled
	unsub   []uint32     // tokens prepped since the last submit
	real    int          // operations handed to the ring and not yet reaped
	// lost counts completions the ring reported dropped (a CQ overflow).
	// While it is non-zero the worker issues nothing new and waits until
	// only the lost operations remain in the ring, then fails exactly
	// those and replaces the ring (see recoverLost).
	lost int
	// broken, once set, is the error every piece and slice on this worker
	// fails with: its ring failed in a way that leaves nothing to recover.
	broken error

	// regions is the memory registered with the ring (the engine's set as
	// of the last control applied); a replacement ring gets it too.
	regions [][]byte
	// files maps each file used on this worker to its slot in the ring's
	// fixed-file table, or -1 when it has none (the ring has no fixed
	// files, the table is full, the kernel refused). It is reset with the
	// ring. noFixedFiles is set once the ring said it has none.
	files        map[*File]int32
	noFixedFiles bool

	// Controls from other goroutines (engine.setMemory, File.release),
	// applied by run between pieces: ctlFlag says some are pending.
	ctlFlag atomic.Bool
	ctlMu   sync.Mutex
	ctlMem  []*memControl // buffer-set changes, applied with nothing in flight
	ctlDrop []*File       // files closing: their slots are freed
	wake    chan struct{} // (capacity 1) wakes an idle run
	dead    atomic.Bool   // run has ended: controls are refused
}

// memControl asks a worker to register regions with its ring; reply gets
// the outcome.
type memControl struct {
	regions [][]byte
	reply   chan error
}

func newWorker(e *engine, id int, newRing newRingFunc) *worker {
	qd := e.opts.QueueDepth
	w := &worker{
		e:       e,
		id:      id,
		newRing: newRing,
		queue:   make(chan *slice, 1024),
		stop:    make(chan struct{}),
		pieces:  make([]piece, qd),
		free:    make([]uint32, 0, qd),
		active:  make([]*slice, 0, 64),
		comps:   make([]completion, qd),
		synth:   make([]completion, 0, qd),
		batch:   make([]completion, 0, qd),
		unsub:   make([]uint32, 0, qd),
		files:   make(map[*File]int32),
		wake:    make(chan struct{}, 1),
	}
	for i := qd - 1; i >= 0; i-- {
		w.free = append(w.free, uint32(i))
	}
	return w
}

// run is the worker's loop. ready receives the ring-creation result.
func (w *worker) run(ready chan<- error, done chan<- struct{}) {
	defer close(done)
	// Rings with per-thread submission state (io_uring's single-issuer
	// mode) need the goroutine to stay on one OS thread; a dedicated
	// thread per worker costs little and keeps syscalls off other Ps.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := w.newRing(w.e.opts.QueueDepth)
	if err != nil {
		ready <- err
		return
	}
	w.ring = r
	ready <- nil
	defer w.closeRing()
	defer w.refuseControls()
	for {
		inflight := len(w.pieces) - len(w.free)
		if inflight == 0 && len(w.active) == 0 && !w.ctlFlag.Load() {
			select {
			case s := <-w.queue:
				w.active = append(w.active, s)
			case <-w.wake:
			case <-w.stop:
				return
			}
		}
		w.drainQueue()
		// Controls go before issuing, so that a slot a closed file freed
		// is free for the files of the requests just taken.
		holdIssue := false
		if w.ctlFlag.Load() {
			holdIssue = w.control()
		}
		if w.broken != nil {
			w.failActive()
			continue
		}
		if w.lost == 0 && !holdIssue {
			w.issue()
		}
		w.submit()
		w.reap()
		if w.lost > 0 && w.real <= w.lost && len(w.synth) == 0 {
			w.recoverLost()
		}
	}
}

// closeRing releases the worker's ring, logging a failure: there is no
// caller left to return it to.
func (w *worker) closeRing() {
	if w.ring == nil {
		return
	}
	if err := w.ring.close(); err != nil {
		w.e.opts.Logger.Error("aio: closing ring failed", "backend", w.e.name, "ring", w.id+1, "err", err)
	}
	w.ring = nil
}

// ringError names this worker's ring and wraps cause under ErrRingFailed.
func (w *worker) ringError(what string, cause error) error {
	return fmt.Errorf("%w: %s ring %d of %d: %s: %w", ErrRingFailed, w.e.name, w.id+1, w.e.opts.IntraOpParallelism, what, cause)
}

// drainQueue moves newly queued slices to active without blocking.
func (w *worker) drainQueue() {
	for {
		select {
		case s := <-w.queue:
			w.active = append(w.active, s)
		default:
			return
		}
	}
}

// issue preps pieces from active slices while tokens are free.
func (w *worker) issue() {
	bs := w.e.opts.BlockSizeBytes
	if w.e.opts.SerialEvents && len(w.free) != len(w.pieces) {
		return // wait for the whole batch before the next one
	}
	for len(w.free) > 0 && len(w.active) > 0 {
		s := w.active[0]
		if s.failed || s.req.errSet.Load() || s.pos >= len(s.buf) {
			if s.req.errSet.Load() && !s.failed {
				s.failed = true // another slice failed: stop issuing this one
			}
			w.popActive()
			if s.outstanding == 0 {
				w.finishSlice(s)
			}
			continue
		}
		n := min(bs, len(s.buf)-s.pos)
		tok := w.free[len(w.free)-1]
		w.free = w.free[:len(w.free)-1]
		p := &w.pieces[tok]
		*p = piece{s: s, off: s.off + int64(s.pos), buf: s.buf[s.pos : s.pos+n], inUse: true}
		s.pos += n
		s.outstanding++
		w.prep(tok)
	}
}

func (w *worker) popActive() {
	copy(w.active, w.active[1:])
	w.active[len(w.active)-1] = nil
	w.active = w.active[:len(w.active)-1]
}

// prep issues (or re-issues) the piece behind tok, consulting the fault hook.
func (w *worker) prep(tok uint32) {
	p := &w.pieces[tok]
	if w.broken != nil {
		// A continuation (short transfer, retry) of a piece whose ring has
		// just failed: nothing can run it.
		w.fail(tok, w.broken)
		return
	}
	buf := p.buf
	f := p.s.req.File
	op := p.s.req.Op
	t := target{fd: f.fd, slot: -1}
	if !w.noFixedFiles {
		t.slot = w.fileSlot(f)
	}
	if h := w.e.opts.Faults; h != nil {
		flt := h.Before(PieceInfo{Op: op, Path: f.path, Offset: p.off, Len: len(buf), Align: f.align})
		if flt.Delay > 0 {
			time.Sleep(flt.Delay)
		}
		if flt.Err != 0 {
			p.issued = len(buf)
			w.synth = append(w.synth, completion{token: tok, res: -int32(flt.Err)})
			return
		}
		if flt.ShortLen > 0 && flt.ShortLen < len(buf) {
			buf = buf[:flt.ShortLen]
		}
	}
	p.issued = len(buf)
	p.inRing = true
	if len(w.regions) > 0 && w.ring.fixedBuffer(buf) {
		w.e.fixedBufPieces.Add(1)
	}
	w.ring.prep(op, t, buf, p.off, tok)
	if t.slot >= 0 {
		w.e.fixedFilePieces.Add(1)
	}
	w.real++
	w.unsub = append(w.unsub, tok)
	w.e.pieces.Add(1)
	if w.e.opts.SingleSubmit {
		w.submit()
	}
}

// submit hands prepped pieces to the ring. Rings retry transient errors
// themselves and, by the ring contract, return an error only when they
// accepted none of the batch; the batch's pieces then fail with that error
// (as synthetic completions, handled by the next reap), so their requests
// return it instead of hanging. The ring stays in use: a later batch may
// succeed, and one that does not fails the same way.
func (w *worker) submit() {
	if len(w.unsub) == 0 {
		return
	}
	if err := w.ring.submit(); err != nil {
		w.e.ringErrs.Add(1)
		cause := w.ringError("submit", err)
		w.e.opts.Logger.Error("aio: ring submit failed", "backend", w.e.name, "ring", w.id+1, "pieces", len(w.unsub), "err", err)
		for _, tok := range w.unsub {
			p := &w.pieces[tok]
			p.inRing = false
			p.cause = cause
			w.synth = append(w.synth, completion{token: tok, res: -int32(syscall.EIO)})
			w.real--
		}
	}
	w.unsub = w.unsub[:0]
}

// reap collects completions (fault-injected first) and handles them.
func (w *worker) reap() {
	if len(w.synth) > 0 {
		// complete may append new synthetic completions (a retried piece
		// failing again), so handle a copy.
		w.batch = append(w.batch[:0], w.synth...)
		w.synth = w.synth[:0]
		for _, c := range w.batch {
			w.complete(c)
		}
		w.submit()
		if w.real == 0 || w.broken != nil {
			return
		}
		// Poll real completions without blocking.
		n, err := w.ring.wait(0, w.comps)
		w.handleWait(n, err)
		return
	}
	// Operations lost to a CQ overflow will never complete: wait only for
	// the others.
	want := w.real - w.lost
	if want <= 0 {
		return
	}
	min := 1
	if w.e.opts.SerialEvents {
		min = want
	}
	n, err := w.ring.wait(min, w.comps)
	w.handleWait(n, err)
}

// handleWait processes what one ring wait returned. Every one of the n
// completions is delivered first, whatever err is: a ring may return valid
// completions together with an error, and dropping them would leave their
// requests waiting forever. Then err is handled by kind:
//
//   - a stray completion (a token the ring does not hold) is logged,
//     counted and otherwise ignored;
//   - lost completions (a CQ overflow) are recorded; run stops issuing,
//     lets every other operation complete, then fails the lost ones and
//     replaces the ring (recoverLost);
//   - anything else means the ring cannot be reaped any more: every piece
//     on this worker, and every request that reaches it later, fails with
//     an error naming the ring and the cause (breakRing).
func (w *worker) handleWait(n int, err error) {
	for i := 0; i < n; i++ {
		c := w.comps[i]
		if int(c.token) >= len(w.pieces) || !w.pieces[c.token].inRing {
			w.stray(uint64(c.token), nil)
			continue
		}
		w.pieces[c.token].inRing = false
		w.real--
		w.complete(c)
	}
	if err == nil {
		return
	}
	if fatal := w.absorb(err); fatal != nil {
		w.breakRing(w.ringError("wait", fatal))
	}
}

// absorb handles the parts of a wait error the worker can live with (stray
// and lost completions; a ring may report several joined) and returns the
// rest, which is fatal, or nil.
func (w *worker) absorb(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var fatal []error
		for _, e := range j.Unwrap() {
			if f := w.absorb(e); f != nil {
				fatal = append(fatal, f)
			}
		}
		return errors.Join(fatal...)
	}
	var se *strayError
	var le *lostError
	switch {
	case errors.As(err, &se):
		w.stray(se.token, err)
		return nil
	case errors.As(err, &le):
		w.e.ringErrs.Add(1)
		w.lost += le.n
		w.e.opts.Logger.Error("aio: ring lost completions; draining it, then failing the lost operations and replacing the ring",
			"backend", w.e.name, "ring", w.id+1, "lost", le.n, "err", err)
		return nil
	}
	return err
}

// stray records a completion for a token the ring does not hold.
func (w *worker) stray(token uint64, err error) {
	w.e.strays.Add(1)
	if err == nil {
		err = fmt.Errorf("completion for token %d, which is not in flight", token)
	}
	w.e.opts.Logger.Warn("aio: ignoring a stray completion", "backend", w.e.name, "ring", w.id+1, "token", token, "err", err)
}

// recoverLost runs when every operation left in the ring is one whose
// completion was lost: their outcome is unknown, so they fail with an error
// saying so, and the ring (whose bookkeeping still holds them) is replaced
// by a fresh one. If no ring can be made, the worker breaks.
func (w *worker) recoverLost() {
	cause := w.ringError("recovering from a CQ overflow", fmt.Errorf("%w: %d operations finished but their results were dropped by the kernel, so whether they moved their bytes is unknown", ErrCompletionLost, w.lost))
	for tok := range w.pieces {
		p := &w.pieces[tok]
		if p.inUse && p.inRing {
			p.inRing = false
			w.fail(uint32(tok), cause)
		}
	}
	w.real = 0
	w.lost = 0
	w.closeRing()
	r, err := w.newRing(w.e.opts.QueueDepth)
	if err != nil {
		w.breakRing(w.ringError("replacing the ring after a CQ overflow", err))
		return
	}
	w.ring = r
	w.ringReplaced()
}

// breakRing fails every piece and slice on this worker with cause and makes
// every later slice fail the same way. The ring is not used again; it is
// closed when the engine closes.
func (w *worker) breakRing(cause error) {
	if w.broken != nil {
		return
	}
	w.e.ringErrs.Add(1)
	w.broken = cause
	w.e.opts.Logger.Error("aio: ring failed; failing its requests", "backend", w.e.name, "ring", w.id+1, "err", cause)
	w.synth = w.synth[:0]
	w.unsub = w.unsub[:0]
	w.real = 0
	w.lost = 0
	for tok := range w.pieces {
		p := &w.pieces[tok]
		if p.inUse {
			p.inRing = false
			w.fail(uint32(tok), cause)
		}
	}
	w.failActive()
}

// failActive fails the slices of a broken worker that have no piece in
// flight (those with pieces were failed with them).
func (w *worker) failActive() {
	for len(w.active) > 0 {
		s := w.active[0]
		w.popActive()
		s.failed = true
		s.req.setErr(w.e.name, w.broken)
		if s.outstanding == 0 {
			w.finishSlice(s)
		}
	}
}

// complete applies one completion to its piece.
func (w *worker) complete(c completion) {
	p := &w.pieces[c.token]
	if !p.inUse {
		w.stray(uint64(c.token), nil)
		return
	}
	s := p.s
	req := s.req
	res := int(c.res)
	switch {
	case p.cause != nil:
		w.fail(c.token, p.cause)
	case res < 0:
		errno := syscall.Errno(-res)
		if (errno == syscall.EINTR || errno == syscall.EAGAIN) && p.retries < maxRetries {
			p.retries++
			w.e.retries.Add(1)
			w.prep(c.token)
			return
		}
		w.fail(c.token, errno)
	case res == 0:
		w.fail(c.token, ErrShortTransfer)
	case res < len(p.buf):
		req.moved.Add(int64(res))
		p.buf = p.buf[res:]
		p.off += int64(res)
		p.retries = 0
		w.e.shorts.Add(1)
		if req.errSet.Load() {
			w.releasePiece(c.token)
			return
		}
		w.prep(c.token)
		return
	default:
		req.moved.Add(int64(len(p.buf)))
		w.releasePiece(c.token)
		return
	}
}

// fail records the piece's error on its request and retires the piece.
func (w *worker) fail(tok uint32, cause error) {
	s := w.pieces[tok].s
	s.failed = true
	s.req.setErr(w.e.name, cause)
	w.releasePiece(tok)
}

// setErr records the request's first failure; later ones are dropped (the
// first is the cause, the rest are consequences).
func (r *Request) setErr(backend string, cause error) {
	if r.errSet.CompareAndSwap(false, true) {
		// Written before pending reaches zero; read after done is signalled.
		r.err = &OpError{
			Op: r.Op.String(), Path: r.File.path, Offset: r.Offset, Bytes: len(r.Buf),
			Done: r.moved.Load(), Direct: r.File.direct, Backend: backend, Err: cause,
		}
	}
}

// releasePiece frees tok and finishes its slice when nothing is left.
func (w *worker) releasePiece(tok uint32) {
	p := &w.pieces[tok]
	s := p.s
	*p = piece{}
	w.free = append(w.free, tok)
	s.outstanding--
	if s.req.errSet.Load() {
		s.failed = true
	}
	if s.outstanding == 0 && (s.pos >= len(s.buf) || s.failed) {
		// Remove from active if still there (failed slices may be).
		for i, a := range w.active {
			if a == s {
				copy(w.active[i:], w.active[i+1:])
				w.active[len(w.active)-1] = nil
				w.active = w.active[:len(w.active)-1]
				break
			}
		}
		w.finishSlice(s)
	}
}

// finishSlice retires a slice; the last slice of a request completes it.
func (w *worker) finishSlice(s *slice) {
	req := s.req
	s.req = nil
	s.buf = nil
	if req.pending.Add(-1) == 0 {
		w.e.finish(req)
	}
}

// fileSlot returns f's slot in the ring's fixed-file table, registering
// it on first use, or -1 when it has none. A file that got a slot tells
// the worker when it closes (File.release), so the slot is freed and the
// ring's reference to the file dropped.
func (w *worker) fileSlot(f *File) int32 {
	if slot, ok := w.files[f]; ok {
		return slot
	}
	slot, err := w.ring.registerFile(f.fd)
	switch {
	case err == nil:
		if !f.watch(w) {
			// Closed meanwhile (it cannot be: a request holds it), but
			// never keep a slot no one will free.
			w.ring.unregisterFile(slot)
			slot = -1
		}
	case errors.Is(err, errors.ErrUnsupported):
		w.noFixedFiles = true
		return -1
	default:
		w.e.fixedFileFallback(w, f, err)
	}
	w.files[f] = slot
	return slot
}

// fileClosed is called by a file with a slot on this worker once its
// descriptor is closed: the slot is freed by run (the ring's own reference
// keeps the file open until then). It never blocks.
func (w *worker) fileClosed(f *File) {
	if w.dead.Load() {
		return // the ring, and its table, are gone
	}
	w.ctlMu.Lock()
	w.ctlDrop = append(w.ctlDrop, f)
	w.ctlMu.Unlock()
	w.ctlFlag.Store(true)
	w.poke()
}

// setMemory queues a buffer-set change for run and returns the channel its
// outcome arrives on.
func (w *worker) setMemory(regions [][]byte) chan error {
	c := &memControl{regions: regions, reply: make(chan error, 1)}
	w.ctlMu.Lock()
	if w.dead.Load() {
		w.ctlMu.Unlock()
		c.reply <- ErrClosed
		return c.reply
	}
	w.ctlMem = append(w.ctlMem, c)
	w.ctlMu.Unlock()
	w.ctlFlag.Store(true)
	w.poke()
	return c.reply
}

func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// control applies pending controls: freed file slots at once, buffer-set
// changes once nothing is prepped or in flight on the ring (the kernel
// must not see the set change under an operation using it). It reports
// whether a buffer-set change is still waiting, in which case run issues
// nothing new until the ring has drained.
func (w *worker) control() (waiting bool) {
	w.ctlMu.Lock()
	drop := w.ctlDrop
	w.ctlDrop = nil
	idle := len(w.free) == len(w.pieces) && w.real == 0 && len(w.synth) == 0 && len(w.unsub) == 0
	var mem []*memControl
	if idle || w.broken != nil {
		mem = w.ctlMem
		w.ctlMem = nil
	}
	waiting = len(w.ctlMem) > 0
	if !waiting {
		w.ctlFlag.Store(false)
	}
	w.ctlMu.Unlock()
	for _, f := range drop {
		if slot, ok := w.files[f]; ok {
			delete(w.files, f)
			if slot >= 0 {
				if err := w.ring.unregisterFile(slot); err != nil {
					w.e.opts.Logger.Warn("aio: freeing a fixed-file slot failed; the ring keeps the file open until the engine closes",
						"backend", w.e.name, "ring", w.id+1, "path", f.path, "slot", slot, "err", err)
				}
			}
		}
	}
	for _, c := range mem {
		var err error
		if w.broken != nil {
			err = w.broken
		} else {
			w.regions = c.regions
			err = w.ring.registerBuffers(c.regions)
		}
		c.reply <- err
	}
	return waiting
}

// refuseControls answers buffer-set changes still queued when run ends.
func (w *worker) refuseControls() {
	w.ctlMu.Lock()
	defer w.ctlMu.Unlock()
	w.dead.Store(true)
	for _, c := range w.ctlMem {
		c.reply <- ErrClosed
	}
	w.ctlMem = nil
}

// ringReplaced gives a fresh ring (after a CQ overflow) the memory the old
// one had registered; its fixed-file table starts empty.
func (w *worker) ringReplaced() {
	clear(w.files)
	w.noFixedFiles = false
	if len(w.regions) == 0 {
		return
	}
	if err := w.ring.registerBuffers(w.regions); err != nil {
		w.e.memoryFallback(w, err)
	}
}
