package optimizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zinfio/zinf/buffers"
)

// Step takes one Adam step over every sub-group, in registration order.
// It is BeginStep followed at once by Commit, with the optimizer held for
// the whole step (Register, ReadState and the like wait for it).
//
// Each sub-group's record (master, exp_avg, exp_avg_sq) is read from the
// store into a pinned buffer, the sub-group's slice of the gradient is read
// from Grads into the same buffer (GradSource.ReadRange), Adam updates the
// record in place, and the record is written back under a staging name;
// its new master goes to Params.StageRange (a RangeSink) or, when the last
// sub-group of a tensor is done, the tensor's whole new master partition to
// Params.StageUpdate. With
// PipelineDepth k >= 1 a reader goroutine keeps k sub-groups read ahead and
// a writer goroutine waits for up to k write-behinds, while an update
// goroutine runs Adam; BufferCount and the pool bound the pinned memory in
// use (backpressure, never an error).
//
// Step is transactional. Only when every sub-group is written and staged
// are the new records renamed over the old ones, in one atomic
// Store.Rename, and Params.CommitUpdates called (if that fails the rename
// is undone). On any error (a full disk on a write-behind, an I/O error or
// checksum mismatch on a read, a failing Grads or Params, ctx cancelled)
// Step waits for everything in flight, deletes the staged records, calls
// Params.DiscardUpdates, leaves the step counter as it was and returns an
// *Error naming the tensor and sub-group: the states on NVMe and in memory
// are unchanged, and calling Step again once the fault has cleared gives
// exactly the result a fault-free step would have. While a step runs, the
// store holds both versions of every record (twice the states' disk
// space). Step fails with ErrStepOpen while a transaction from BeginStep
// is open.
func (o *Optimizer) Step(ctx context.Context) error {
	return o.StepWith(ctx, o.DefaultParams())
}

// StepWith is Step with the given parameters (learning rate, betas,
// gradient scaling); invalid ones are refused before anything is read.
func (o *Optimizer) StepWith(ctx context.Context, p StepParams) error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	txn, err := o.begin(ctx, p)
	if err != nil {
		return err
	}
	return txn.commit(ctx, true)
}

// stepRun is one step attempt: the pipeline of a StepTxn.
type stepRun struct {
	o      *Optimizer
	ctx    context.Context // cancelled at the first failure, by Abort and Close, and with Commit's ctx
	cancel context.CancelCauseFunc
	step   int
	args   adamArgs // the step's constants
	params StepParams
	hyper  Hyper // Options.Hyper with params applied
	// tensors and sgs are every registered tensor and sub-group, in
	// registration order: a committed step has updated all of them.
	tensors []*tensor
	sgs     []*subGroup
	depth   int

	// queue carries the tensors to step, in the order they are handed
	// over. Its capacity is len(tensors) and each tensor is sent at most
	// once, so a send never blocks. Commit and Abort close it.
	queue chan *tensor
	// done is closed when the pipeline has stopped: nothing in flight and
	// every buffer given back.
	done chan struct{}

	// tokens bounds the buffer sets in use (BufferCount) and wslots the
	// write-behinds in flight (depth > 0), each sub-group weighted (see
	// windowUnits); maxBlock is the largest block a sub-group takes.
	tokens, wslots window
	maxBlock       int64

	mu  sync.Mutex
	err error // the first failure

	subGroups, bytesRead, bytesWritten, gradBytes atomic.Int64
	// Touched by the update goroutine only, read after done.
	compute, readWait, writeWait, idle time.Duration

	// start is the step's start; timeline collects each sub-group's
	// timing as it retires (see timeline.go).
	start    time.Time
	tlMu     sync.Mutex
	timeline []SubGroupTiming

	pub pubState // CommitAsync's publishing (publish.go)
	// pre holds the records StepTxn.Prefetch read ahead (prefetch.go).
	pre prefetchState
	// undoing is set before a failed step's staged and published updates
	// are discarded (abort), so that a reader can tell (StepTxn.Failing).
	undoing atomic.Bool
}

// item is one sub-group on its way through the pipeline, with everything
// it holds; retire gives all of it back, whatever happened.
type item struct {
	sg           *subGroup
	failed       bool // read-ahead did not complete: no update
	prefetched   bool // its record read was started by StepTxn.Prefetch
	token, wslot bool
	// buf is the sub-group's pinned buffer: its record (with a store),
	// then the gradient slice.
	buf   *buffers.Buffer
	state []float32 // master | exp_avg | exp_avg_sq
	grad  []float32 // the sub-group's gradient, inside buf
	// master is the tensor's whole new master, assembled in ordinary
	// memory for a ParamSink that is not a RangeSink (nil otherwise and
	// for a tensor of one sub-group).
	master   []float32
	read     Waiter
	readDone bool
	// gradRead is the gradient read started by an AsyncGradSource (nil
	// when the read was synchronous); grad is set once it is waited for.
	gradRead     RangeRead
	gradDone     bool
	write, stage Waiter
	// toStage is set once the update succeeded and its write-behind
	// started: stage hands the new master to Params.
	toStage bool
	// idleFrom and idleTo bound the time the pipeline waited for this
	// sub-group's tensor to be handed over (zero when it did not wait).
	idleFrom, idleTo time.Time
	tm               SubGroupTiming
}

// tensorBufs is what the read-ahead keeps for the tensor it is reading:
// the new-master array its items share (see item.master).
type tensorBufs struct{ master []float32 }

func (tb *tensorBufs) release() { tb.master = nil }

func (r *stepRun) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	} else {
		r.o.opts.Logger.Debug("optimizer: further step error", slog.Any("error", err))
	}
	r.mu.Unlock()
	r.cancel(err)
}

func (r *stepRun) failed() bool { return r.firstErr() != nil }

// firstErr returns the step's first failure, nil while there is none.
func (r *stepRun) firstErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// cause is the error a cancelled step's context reports: the first
// failure, context.Canceled or DeadlineExceeded of the caller's context.
func (r *stepRun) cause() error { return context.Cause(r.ctx) }

func (r *stepRun) wrap(op string, sg *subGroup, whole bool, err error) error {
	j := sg.j
	if whole {
		j = -1
	}
	return &Error{Op: op, Tensor: sg.t.name, SubGroup: j, SubGroups: len(sg.t.sgs), Step: r.step, Err: err}
}

// stepStats are the pipeline's counters; call it after done.
func (r *stepRun) stepStats(committed bool) StepStats {
	tl, gaps := r.timelineStats()
	return StepStats{Step: r.step, Committed: committed, SubGroups: int(r.subGroups.Load()),
		BytesRead: r.bytesRead.Load(), BytesWritten: r.bytesWritten.Load(), GradBytes: r.gradBytes.Load(),
		Compute: r.compute, ReadWait: r.readWait, WriteWait: r.writeWait, Idle: r.idle,
		IOGaps: gaps, Timeline: tl, Start: r.start, Prefetched: int(r.pre.used.Load())}
}

func last(sg *subGroup) bool { return sg.j == len(sg.t.sgs)-1 }

// next returns the next tensor handed over, waiting for one when there is
// none yet; ok is false once the queue is closed and drained or the step
// has failed. While it waits the pipeline holds no buffer: everything read
// ahead before runs through update and write-behind without it. from and to
// bound the wait (zero when it did not wait).
func (r *stepRun) next() (t *tensor, from, to time.Time, ok bool) {
	if r.failed() {
		return nil, from, to, false
	}
	select {
	case t, ok = <-r.queue:
		return t, from, to, ok
	default:
	}
	from = time.Now()
	select {
	case t, ok = <-r.queue:
		return t, from, time.Now(), ok
	case <-r.ctx.Done():
		// No tensor is in hand: the caller cancelled between hand-overs.
		r.fail(&Error{Op: "step", SubGroup: -1, Step: r.step, Err: r.cause()})
		return nil, from, to, false
	}
}

// waited splits a wait of the update goroutine, from start to now, for
// item it into the part spent waiting for its tensor to be handed over
// (idle) and the rest (read-ahead).
func waited(start time.Time, it *item) (read, idle time.Duration) {
	read = time.Since(start)
	if it == nil || it.idleTo.IsZero() || !it.idleTo.After(start) {
		return read, 0
	}
	from := it.idleFrom
	if start.After(from) {
		from = start
	}
	idle = min(it.idleTo.Sub(from), read)
	return read - idle, idle
}

// run drives every sub-group of every tensor coming through the queue
// through read-ahead, update and retire, on the goroutines of the step
// (this one updates), and closes done once nothing is in flight and every
// buffer is back.
func (r *stepRun) run() {
	defer close(r.done)
	defer r.dropPrefetched() // before done: every buffer is back by then
	if r.depth == 0 {
		var tb tensorBufs
		defer tb.release()
		for {
			tn, from, to, ok := r.next()
			if !ok {
				return
			}
			if !to.IsZero() {
				r.idle += to.Sub(from)
			}
			for _, sg := range tn.sgs {
				if err := r.ctx.Err(); err != nil {
					r.fail(r.wrap("read-ahead", sg, false, r.cause()))
					return
				}
				t := time.Now()
				it, err := r.prefetch(sg, &tb)
				r.readWait += time.Since(t)
				it.tm.Picked = r.since()
				if err != nil {
					it.failed = true
					r.fail(err)
				}
				r.update(it)
				t = time.Now()
				r.retire(it)
				r.writeWait += time.Since(t)
				if r.failed() {
					return
				}
				if last(sg) {
					tb.release()
				}
			}
		}
	}

	k := r.depth
	ready := make(chan *item, r.chanCap(k)) // read ahead, waiting for the update
	ahead := newWindow(k)                   // bounds ready plus the one being read to k (weighted)
	done := make(chan *item, r.chanCap(k))  // updated, waiting for write-behind
	r.wslots = newWindow(k)
	var wg sync.WaitGroup
	wg.Go(func() { // read-ahead
		defer close(ready)
		var tb tensorBufs
		defer tb.release()
		for {
			tn, from, to, ok := r.next()
			if !ok {
				return
			}
			for _, sg := range tn.sgs {
				if err := ahead.acquire(r.ctx, r.weight(sg)); err != nil {
					r.fail(r.wrap("read-ahead", sg, false, r.cause()))
					return
				}
				it, err := r.prefetch(sg, &tb)
				if sg.j == 0 {
					it.idleFrom, it.idleTo = from, to
				}
				if err != nil {
					it.failed = true
					r.fail(err)
				}
				ready <- it // the update loop drains ready to the end, failed or not
				if err != nil {
					return
				}
				if last(sg) {
					tb.release()
				}
			}
		}
	})
	// Staging has a goroutine of its own between the update and the
	// write-behind: it starts each sub-group's parameter write as soon as
	// the sub-group is updated, as the update goroutine did before, not
	// once the write-behind has retired the sub-group before it.
	staged := make(chan *item, r.chanCap(k))
	wg.Go(func() { // stage
		defer close(staged)
		for it := range done {
			r.stage(it)
			staged <- it
		}
	})
	wg.Go(func() { // write-behind
		for it := range staged {
			r.retire(it)
		}
	})
	for {
		t := time.Now()
		it, ok := <-ready
		read, idle := waited(t, it)
		r.readWait += read
		r.idle += idle
		if !ok {
			break
		}
		it.tm.Picked = r.since()
		ahead.release(r.weight(it.sg))
		r.update(it)
		t = time.Now()
		done <- it
		r.writeWait += time.Since(t)
	}
	close(done)
	wg.Wait()
}

// prefetch takes a buffer set for sg, starts reading its record and reads
// its gradient slice into the same pinned buffer. It always returns an
// item holding whatever it acquired, for retire to give back.
func (r *stepRun) prefetch(sg *subGroup, tb *tensorBufs) (*item, error) {
	o := r.o
	// A record StepTxn.Prefetch started reading comes with its token,
	// its buffer and its read.
	it := r.takePrefetched(sg)
	if it == nil {
		it = &item{sg: sg}
		it.tm.Ahead = r.since()
		if err := r.tokens.acquire(r.ctx, r.weight(sg)); err != nil {
			return it, r.wrap("read-ahead", sg, false, r.cause())
		}
		it.token = true
	}
	t := sg.t
	if sg.j == 0 {
		tb.release()
		if _, ranged := o.opts.Params.(RangeSink); !ranged && o.opts.Params != nil && len(t.sgs) > 1 {
			tb.master = make([]float32, t.n)
		}
	}
	it.master = tb.master
	z := o.sz
	lo, hi := sg.off, sg.off+sg.n
	gradAt := z.recRegion(sg.n)
	if it.prefetched {
		return it, r.readGrad(it, gradAt)
	}
	b, err := o.opts.Pool.Acquire(r.ctx, int(z.slot(lo, hi)), buffers.PurposeOptimizer)
	if err != nil {
		return it, r.wrap("read-ahead", sg, false, err)
	}
	it.buf = b
	it.tm.Buffered = r.since()
	if st := o.opts.Store; st != nil {
		rb := sg.recordBytes()
		it.state = buffers.Float32Bytes(b.Bytes()[:rb])
		it.tm.ReadIssued = r.since()
		p, err := st.ReadAsync(sg.key, b.Bytes()[:rb])
		if err != nil {
			return it, r.wrap("read-ahead", sg, false, err)
		}
		it.read = p
		it.tm.RecordBytes = int64(rb)
	} else {
		// The step builds the other copy; the current one stays as it is
		// until commit.
		next, err := o.nextRecord(r.ctx, sg)
		if err != nil {
			return it, r.wrap("read-ahead", sg, false, err)
		}
		copy(next.Float32(), sg.mem[sg.cur].Float32())
		it.state = next.Float32()
	}
	return it, r.readGrad(it, gradAt)
}

// readGrad reads it's gradient slice into its buffer at gradAt, or starts
// reading it (an AsyncGradSource).
func (r *stepRun) readGrad(it *item, gradAt int64) error {
	o, sg := r.o, it.sg
	t, b := sg.t, it.buf
	lo, hi := sg.off, sg.off+sg.n
	it.tm.GradBytes = 4 * int64(sg.n)
	if ag, ok := o.opts.Grads.(AsyncGradSource); ok {
		// Started, not waited for: update waits (see gradWait).
		rr, err := ag.ReadRangeAsync(r.ctx, t.name, lo, hi, b.Bytes()[gradAt:])
		if err != nil {
			return r.wrap("grad", sg, false, err)
		}
		it.gradRead = rr
		return nil
	}
	g, err := o.opts.Grads.ReadRange(r.ctx, t.name, lo, hi, b.Bytes()[gradAt:])
	if err == nil && len(g) != sg.n {
		err = fmt.Errorf("the gradient source returned %d values for elements [%d, %d)", len(g), lo, hi)
	}
	if err != nil {
		return r.wrap("grad", sg, false, err)
	}
	it.grad = g
	it.tm.GradRead = r.since()
	r.gradBytes.Add(4 * int64(sg.n))
	return nil
}

// gradWait waits for it's asynchronous gradient read (see
// AsyncGradSource), if it has one not waited for yet.
func (r *stepRun) gradWait(it *item) error {
	if it.gradRead == nil || it.gradDone {
		return nil
	}
	it.gradDone = true
	g, err := it.gradRead.Wait()
	it.tm.GradRead = r.doneOffset(it.gradRead, r.since())
	if err == nil && len(g) != it.sg.n {
		err = fmt.Errorf("the gradient source returned %d values for elements [%d, %d)", len(g), it.sg.off, it.sg.off+it.sg.n)
	}
	if err != nil {
		return err
	}
	it.grad = g
	r.gradBytes.Add(4 * int64(it.sg.n))
	return nil
}

// update waits for it's read, applies Adam and starts the write-behind;
// the sub-group's new master is staged next (see stage). It runs on the
// update goroutine and does nothing once the step has failed.
func (r *stepRun) update(it *item) {
	if it.failed || r.failed() {
		return
	}
	o := r.o
	sg, n := it.sg, it.sg.n
	if it.read != nil {
		start := time.Now()
		err := it.read.Wait()
		it.readDone = true
		r.readWait += time.Since(start)
		it.tm.ReadDone = r.doneOffset(it.read, r.since())
		if err != nil {
			r.fail(r.wrap("read-ahead", sg, false, err))
			return
		}
		r.bytesRead.Add(int64(sg.recordBytes()))
		if it.prefetched {
			r.pre.used.Add(1)
		}
	}
	if it.gradRead != nil {
		start := time.Now()
		err := r.gradWait(it)
		r.readWait += time.Since(start)
		if err != nil {
			r.fail(r.wrap("grad", sg, false, err))
			return
		}
	}
	start := time.Now()
	if r.params.ScaleGrads {
		ScaleGrad(it.grad[:n], r.params.GradScale)
	}
	if sg.lay.compressed() {
		o.kern.adamRecordSplit(sg.lay, it.state, it.grad[:n], &r.args, o.opts.UpdateWorkers)
	} else if r.hyper.Rule == RuleAdam {
		p, m, v := sg.states(it.state)
		o.kern.adamSplit(p, it.grad[:n], m, v, &r.args, o.opts.UpdateWorkers)
	} else {
		arrays := sg.arrays(it.state)
		o.kern.updateSplit(arrays[0], it.grad[:n], arrays[1:], r.step, r.hyper, o.opts.UpdateWorkers)
	}
	p := sg.lay.array(it.state, 0)
	if it.master != nil {
		copy(it.master[sg.off:sg.off+n], p)
	}
	r.compute += time.Since(start)
	it.tm.Updated = r.since()
	r.subGroups.Add(1)

	if r.wslots.Weighted != nil {
		// At most k sub-groups (weighted) past their update hold buffers
		// (the writer frees slots), with or without a store: this bounds
		// what PinnedNeedBytes counts. The writer always makes progress,
		// so this wait needs no context.
		start := time.Now()
		_ = r.wslots.acquire(context.Background(), r.weight(sg))
		it.wslot = true
		r.writeWait += time.Since(start)
	}
	if st := o.opts.Store; st != nil {
		start := time.Now()
		it.tm.WriteIssued = r.since()
		w, err := st.WriteAsync(sg.staged(), it.buf.Bytes()[:sg.recordBytes()])
		r.writeWait += time.Since(start)
		if err != nil {
			r.fail(r.wrap("write-behind", sg, false, err))
			return
		}
		it.write = w
	}
	it.toStage = true
	if r.depth == 0 {
		r.stage(it)
	}
}

// stage hands it's new master to Params: its range (a RangeSink) or, after
// a tensor's last sub-group, the tensor's. With a pipeline it runs on a
// goroutine of its own, in update order (so a RangeSink still gets a
// tensor's ranges in ascending order), while the update goroutine goes
// on with the next sub-group: staging converts the master to the
// parameters' dtype (bf16: 16 MiB read, 8 MiB written for a 4 M-element
// sub-group) and starts their write, a millisecond or two that would
// otherwise keep the update's workers, and a core, idle between two
// updates. The sub-group's buffer is held until retire, so p stays valid.
func (r *stepRun) stage(it *item) {
	if !it.toStage || r.failed() {
		return
	}
	it.toStage = false
	sg, t := it.sg, it.sg.t
	p := sg.lay.array(it.state, 0)
	params := r.o.opts.Params
	if rs, ok := params.(RangeSink); ok {
		w, err := rs.StageRange(r.ctx, t.name, sg.off, t.n, p)
		if err != nil {
			r.fail(r.wrap("stage", sg, false, err))
			return
		}
		it.stage = w
	} else if params != nil && last(sg) {
		vals := p
		if it.master != nil {
			vals = it.master
		}
		w, err := params.StageUpdate(r.ctx, t.name, vals)
		if err != nil {
			r.fail(r.wrap("stage", sg, true, err))
			return
		}
		it.stage = w
	}
}

// retire waits for everything it started and gives back what it holds.
func (r *stepRun) retire(it *item) {
	sg := it.sg
	if it.read != nil && !it.readDone {
		// Skipped after another failure; the outcome no longer matters,
		// but the buffer may not be reused while the read runs.
		_ = it.read.Wait()
	}
	_ = r.gradWait(it) // likewise; it also ends the source's read

	if it.write != nil {
		if err := it.write.Wait(); err != nil {
			r.fail(r.wrap("write-behind", sg, false, err))
		} else {
			r.bytesWritten.Add(int64(sg.recordBytes()))
		}
		it.tm.WriteDone = r.doneOffset(it.write, r.since())
	}
	if it.stage != nil {
		if err := it.stage.Wait(); err != nil {
			r.fail(r.wrap("stage", sg, true, err))
		}
	}
	if it.buf != nil {
		it.buf.Release()
	}
	if it.wslot {
		r.wslots.release(r.weight(sg))
	}
	if it.token {
		r.tokens.release(r.weight(sg))
	}
	r.record(it)
	if last(sg) && !it.failed && !r.failed() {
		r.tensorRetired(sg.t)
	}
}

// commit publishes a step whose every sub-group was written and staged.
// The store's rename keeps the old records under prev names until
// Params.CommitUpdates has succeeded, so a failing commit can be undone.
func (o *Optimizer) commit(r *stepRun) error {
	fail := func(err error) error { return &Error{Op: "commit", SubGroup: -1, Step: r.step, Err: err} }
	params := o.opts.Params
	st := o.opts.Store
	if st == nil {
		if params != nil {
			if err := params.CommitUpdates(); err != nil {
				params.DiscardUpdates()
				return fail(err)
			}
		}
		o.memMu.Lock()
		for _, sg := range r.sgs {
			sg.cur = 1 - sg.cur
		}
		o.memMu.Unlock()
		return nil
	}
	pairs := make([][2]string, 0, 2*len(r.sgs))
	for _, sg := range r.sgs {
		pairs = append(pairs, [2]string{sg.key, sg.prev()}, [2]string{sg.staged(), sg.key})
	}
	if err := st.Rename(pairs...); err != nil {
		o.abort(r)
		return fail(err)
	}
	if params != nil {
		if err := params.CommitUpdates(); err != nil {
			back := make([][2]string, 0, 2*len(r.sgs))
			for _, sg := range r.sgs {
				back = append(back, [2]string{sg.key, sg.staged()}, [2]string{sg.prev(), sg.key})
			}
			if rerr := st.Rename(back...); rerr != nil {
				o.opts.Logger.Error("optimizer: parameters failed to commit and the optimizer states could not be rolled back: states are one step ahead of the parameters",
					slog.Int("step", r.step), slog.Any("commit_error", err), slog.Any("rollback_error", rerr))
				r.undoing.Store(true)
				params.DiscardUpdates()
				return fail(errors.Join(err, rerr))
			}
			o.abort(r)
			return fail(err)
		}
	}
	for _, sg := range r.sgs {
		st.Delete(sg.prev())
	}
	return nil
}

// abort drops what a failed step staged.
func (o *Optimizer) abort(r *stepRun) {
	r.undoing.Store(true) // before anything published is put back (StepTxn.Failing)
	if st := o.opts.Store; st != nil {
		for _, sg := range r.sgs {
			st.Delete(sg.staged())
		}
	}
	if o.opts.Params != nil {
		o.opts.Params.DiscardUpdates()
	}
}

// nextRecord returns the buffer a step builds sg's new record in (states
// in pinned memory): mem[1-cur], the record before the current one. When a
// StateSnapshot still holds that one (a save taken two or more steps ago
// is draining), it is left to the snapshot and a fresh buffer from the
// pool takes its place, so snapshotted bytes never change. That buffer is
// one record (about 12 bytes per element) beyond the two copies Register reserved: when the
// pool has none free the step waits for one (backpressure: typically
// until the save has drained and released its snapshot) under ctx.
func (o *Optimizer) nextRecord(ctx context.Context, sg *subGroup) (*buffers.Buffer, error) {
	o.memMu.Lock()
	k := 1 - sg.cur
	b := sg.mem[k]
	if b != nil && sg.held[k] == 0 {
		o.memMu.Unlock()
		return b, nil
	}
	sg.mem[k], sg.held[k] = nil, 0
	o.memMu.Unlock()
	if b != nil {
		b.Release() // the sub-group's reference; the snapshots keep theirs
	}
	nb, err := o.opts.Pool.Acquire(ctx, sg.recordBytes(), buffers.PurposeOptimizer)
	if err != nil {
		return nil, err // mem[k] stays empty: the next step acquires it
	}
	o.memMu.Lock()
	sg.mem[k] = nb
	o.memMu.Unlock()
	return nb, nil
}
