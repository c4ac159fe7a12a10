package aio

import (
	"errors"
	"runtime"
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
}

// worker owns one ring and keeps up to QueueDepth pieces in flight.
type worker struct {
	e      *engine
	ring   ring
	queue  chan *slice
	stop   chan struct{}
	pieces []piece
	free   []uint32 // free tokens
	active []*slice // slices with bytes left to issue, FIFO
	comps  []completion
	synth  []completion // fault-injected completions, delivered before real ones
	batch  []completion // scratch copy of synth being handled
	unsub  []uint32     // tokens prepped since the last submit
	real   int          // operations handed to the ring and not yet reaped
}

func newWorker(e *engine) *worker {
	qd := e.opts.QueueDepth
	w := &worker{
		e:      e,
		queue:  make(chan *slice, 1024),
		stop:   make(chan struct{}),
		pieces: make([]piece, qd),
		free:   make([]uint32, 0, qd),
		active: make([]*slice, 0, 64),
		comps:  make([]completion, qd),
		synth:  make([]completion, 0, qd),
		batch:  make([]completion, 0, qd),
		unsub:  make([]uint32, 0, qd),
	}
	for i := qd - 1; i >= 0; i-- {
		w.free = append(w.free, uint32(i))
	}
	return w
}

// run is the worker's loop. ready receives the ring-creation result.
func (w *worker) run(newRing newRingFunc, ready chan<- error, done chan<- struct{}) {
	defer close(done)
	// Rings with per-thread submission state (io_uring's single-issuer
	// mode) need the goroutine to stay on one OS thread; a dedicated
	// thread per worker costs little and keeps syscalls off other Ps.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := newRing(w.e.opts.QueueDepth)
	if err != nil {
		ready <- err
		return
	}
	w.ring = r
	ready <- nil
	defer r.close()
	for {
		inflight := len(w.pieces) - len(w.free)
		if inflight == 0 && len(w.active) == 0 {
			select {
			case s := <-w.queue:
				w.active = append(w.active, s)
			case <-w.stop:
				return
			}
		}
		w.drainQueue()
		w.issue()
		w.submit()
		w.reap()
	}
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
	buf := p.buf
	f := p.s.req.File
	op := p.s.req.Op
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
	w.ring.prep(op, f.fd, buf, p.off, tok)
	w.real++
	w.unsub = append(w.unsub, tok)
	w.e.pieces.Add(1)
	if w.e.opts.SingleSubmit {
		w.submit()
	}
}

// submit hands prepped pieces to the ring. Rings retry transient errors
// themselves; a fatal error fails the pieces of this batch (they were not
// accepted), so their requests return the error instead of hanging.
func (w *worker) submit() {
	if len(w.unsub) == 0 {
		return
	}
	if err := w.ring.submit(); err != nil {
		w.e.opts.Logger.Error("aio: ring submit failed", "backend", w.e.name, "err", err)
		errno := syscall.EIO
		var en syscall.Errno
		if errors.As(err, &en) {
			errno = en
		}
		for _, tok := range w.unsub {
			w.synth = append(w.synth, completion{token: tok, res: -int32(errno)})
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
		if w.real == 0 {
			return
		}
		// Poll real completions without blocking.
		n, err := w.ring.wait(0, w.comps)
		w.handleWait(n, err)
		return
	}
	if w.real == 0 {
		return
	}
	min := 1
	if w.e.opts.SerialEvents {
		min = w.real
	}
	n, err := w.ring.wait(min, w.comps)
	w.handleWait(n, err)
}

func (w *worker) handleWait(n int, err error) {
	if err != nil {
		// A ring that cannot reap is broken; nothing sensible remains but
		// to report it. Back off briefly so a persistent error cannot spin.
		w.e.opts.Logger.Error("aio: ring wait failed", "backend", w.e.name, "err", err)
		time.Sleep(time.Millisecond)
		return
	}
	w.real -= n
	for i := 0; i < n; i++ {
		w.complete(w.comps[i])
	}
}

// complete applies one completion to its piece.
func (w *worker) complete(c completion) {
	p := &w.pieces[c.token]
	s := p.s
	req := s.req
	res := int(c.res)
	switch {
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
	req := s.req
	s.failed = true
	if req.errSet.CompareAndSwap(false, true) {
		// Written before pending reaches zero; read after done is signalled.
		req.err = &OpError{
			Op: req.Op.String(), Path: req.File.path, Offset: req.Offset, Bytes: len(req.Buf),
			Done: req.moved.Load(), Direct: req.File.direct, Backend: w.e.name, Err: cause,
		}
	}
	w.releasePiece(tok)
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
