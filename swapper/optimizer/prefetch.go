package optimizer

import (
	"sync"
	"sync/atomic"

	"github.com/zinfio/zinf/buffers"
)

// prefetchState holds the records StepTxn.Prefetch started reading ahead
// of their tensors' hand-over, until the pipeline takes them up (or the
// pipeline stops and gives them back).
type prefetchState struct {
	mu     sync.Mutex
	items  map[*subGroup]*item
	closed bool // the pipeline has stopped: nothing more is read ahead
	// used counts the prefetched records the pipeline updated from.
	used atomic.Int64
}

// Prefetch starts reading the optimizer records (the fp32 master and the
// rule's states) of the named tensor into pinned buffers now, ahead of its
// hand-over with Tensor, so that the disk works while the caller is still
// computing the tensor's gradient; when the tensor is handed over, its
// update waits only for what is left of those reads. It returns how many
// of the tensor's sub-groups it started reading (in order, from the
// first not read ahead yet) and never waits for I/O or memory: call it
// again later (as the pipeline frees buffers) to read more ahead.
//
// The buffers come out of the step's own budget (BufferCount and the
// optimizer's reservation in the pool), and Prefetch takes one only while
// a buffer set of the largest sub-group stays free beside it for the
// tensors already handed over: when none is, it stops and the remaining
// sub-groups are read when the tensor is handed over, as without
// Prefetch. So the pipeline never waits for a prefetched buffer, which
// the tensor's hand-over alone gives back. With a pool in which the
// optimizer has no reservation of its own (buffers.Options.Reservations)
// nothing is read ahead: a buffer held there could starve the parameter
// swap-ins that must run before the hand-over.
//
// A prefetched record is the bytes the update would read: the records
// change only when a step commits, and Register, LoadState and another
// step are refused while the transaction is open, so the read belongs to
// this transaction and nothing can intervene between it and the update.
// The records of a transaction that ends without handing the tensor over
// (Commit steps it in order, Abort and failures discard it) are still
// used by Commit, or given back once their reads have finished.
//
// Prefetch of a tensor already handed over, or with states in pinned
// memory (no Store: nothing to read), does nothing and returns 0;
// sub-groups read ahead already are passed over. It fails with ErrNotRegistered for an unknown name and
// ErrStepEnded after Commit or Abort; once the step has failed in the
// background it returns that failure, as Tensor does.
func (t *StepTxn) Prefetch(name string) (int, error) {
	r := t.r
	fail := func(err error) error {
		return &Error{Op: "prefetch", Tensor: name, SubGroup: -1, Step: r.step, Err: err}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return 0, fail(t.endedErr())
	}
	tn, ok := t.o.lookup(name)
	if !ok {
		return 0, fail(ErrNotRegistered)
	}
	if err := r.firstErr(); err != nil {
		return 0, err
	}
	if t.handed[tn] || t.o.opts.Store == nil {
		return 0, nil
	}
	n := 0
	for _, sg := range tn.sgs {
		switch r.prefetchRecord(sg) {
		case prefetchStarted:
			n++
		case prefetchHeld:
		default:
			return n, nil
		}
	}
	return n, nil
}

// What prefetchRecord did.
const (
	prefetchSkipped = iota // nothing: no room, or the pipeline stopped
	prefetchStarted        // started reading the record
	prefetchHeld           // nothing: the record was read ahead already
)

// prefetchRecord starts reading sg's record into a buffer of the step's
// budget, without waiting. It skips sg when no buffer is free beyond the
// pipeline's reserve, when the pipeline has stopped, and when the read
// cannot be started (the hand-over then reads the record and reports the
// failure).
func (r *stepRun) prefetchRecord(sg *subGroup) int {
	o := r.o
	p := &r.pre
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return prefetchSkipped
	}
	if p.items[sg] != nil {
		return prefetchHeld
	}
	w := r.weight(sg)
	// Keep one unit of the largest sub-group free: the tensors handed
	// over before this one (which the pipeline steps first) must never
	// wait for a buffer only this tensor's hand-over frees.
	if !r.tokens.TryAcquire(w + windowUnits) {
		return prefetchSkipped
	}
	r.tokens.release(windowUnits)
	pool := o.opts.Pool
	if pool.ReservedBytes(buffers.PurposeOptimizer) == 0 {
		// Served from the shared region, a held buffer could starve the
		// parameter swap-ins the backward pass needs to hand the tensor
		// over.
		r.tokens.release(w)
		return prefetchSkipped
	}
	b, ok := pool.TryAcquire(int(o.sz.slot(sg.off, sg.off+sg.n)), buffers.PurposeOptimizer)
	if !ok {
		r.tokens.release(w)
		return prefetchSkipped
	}
	// The optimizer's region may hold fewer buffer sets than BufferCount
	// (PinnedNeedBytes sizes it by the pipeline's depth): the largest
	// block must stay free beside the records read ahead, or the pipeline
	// could wait for one only this tensor's hand-over frees. Everything
	// else in the region is given back in time, so a block free now with
	// the records held stays obtainable.
	probe, ok := pool.TryAcquire(int(r.maxBlock), buffers.PurposeOptimizer)
	if !ok {
		b.Release()
		r.tokens.release(w)
		return prefetchSkipped
	}
	probe.Release()
	it := &item{sg: sg, token: true, buf: b, prefetched: true}
	it.tm.Ahead = r.since()
	it.tm.Buffered = it.tm.Ahead
	rb := sg.recordBytes()
	it.state = buffers.Float32Bytes(b.Bytes()[:rb])
	it.tm.ReadIssued = r.since()
	rd, err := o.opts.Store.ReadAsync(sg.key, b.Bytes()[:rb])
	if err != nil {
		b.Release()
		r.tokens.release(w)
		return prefetchSkipped
	}
	it.read = rd
	it.tm.RecordBytes = int64(rb)
	if p.items == nil {
		p.items = make(map[*subGroup]*item)
	}
	p.items[sg] = it
	return prefetchStarted
}

// takePrefetched returns sg's prefetched item, holding its token, buffer
// and record read, or nil when sg was not prefetched.
func (r *stepRun) takePrefetched(sg *subGroup) *item {
	p := &r.pre
	p.mu.Lock()
	defer p.mu.Unlock()
	it := p.items[sg]
	if it != nil {
		delete(p.items, sg)
	}
	return it
}

// dropPrefetched ends the read-ahead of Prefetch as the pipeline stops:
// records it read that no update took up (the step failed or was
// aborted) are given back once their reads have finished.
func (r *stepRun) dropPrefetched() {
	p := &r.pre
	p.mu.Lock()
	p.closed = true
	items := p.items
	p.items = nil
	p.mu.Unlock()
	for _, it := range items {
		_ = it.read.Wait() // the buffer may not be reused while the read runs
		it.buf.Release()
		r.tokens.release(r.weight(it.sg))
	}
}
