package optimizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// errAborted is the failure that StepTxn.Abort records to stop the
// pipeline; no caller sees it.
var errAborted = errors.New("optimizer: step aborted")

// StepTxn is an open step transaction (BeginStep): the tensors handed over
// with Tensor are being stepped in the background, and Commit or Abort ends
// it. Its methods may be called from any goroutine. A StepTxn must be
// ended: until Commit or Abort (or Close of the optimizer) its goroutines
// wait for more tensors, and Register, LoadState, Step and BeginStep fail
// with ErrStepOpen.
type StepTxn struct {
	o     *Optimizer
	r     *stepRun
	start time.Time

	mu     sync.Mutex
	handed map[*tensor]bool // handed over with Tensor
	ended  bool             // Commit or Abort called, or aborted by Close: the queue is closed
	closed bool             // ended by Close

	// async is closed when a commit CommitAsync started has finished,
	// with its result in asyncErr (nil before CommitAsync; set under mu).
	async    chan struct{}
	asyncErr error

	// Guarded by o.opMu.
	finished bool  // states committed or discarded, stats recorded
	result   error // what a Commit still waiting learns once finished
}

// BeginStep opens a step transaction for the next step and returns at
// once. Tensors are then handed over with StepTxn.Tensor, in any order,
// each at most once, as soon as their gradients are final (typically during
// the backward pass of the last micro-step, last layer first); each one's
// sub-groups go through the same read-ahead / update / write-behind
// pipeline as Step's, on the transaction's goroutines, while the caller
// goes on. StepTxn.Commit steps the tensors not handed over, waits, and
// commits atomically; StepTxn.Abort discards.
//
// Adam is per element, so the order in which tensors are stepped does not
// matter: the result is bit for bit Step's. The failure semantics are
// Step's too: any failure, whenever it happens, makes Commit return it
// after discarding everything, with states, parameters and the step
// counter unchanged.
//
// ctx governs the transaction's background work until it ends: cancelling
// it fails the step. Pinned memory stays within Step's bound; while it
// waits for the next tensor the pipeline holds no buffer. Grads.ReadRange
// of a handed-over tensor runs while the caller may still be producing
// other tensors' gradients, and the Params staging while the parameters are
// still being read: both are called from the transaction's goroutines.
//
// Only one transaction is open at a time: BeginStep while one is open
// fails with ErrStepOpen, as do Step, Register and LoadState. ReadState
// works meanwhile and returns the last committed states. Close aborts an
// open transaction.
func (o *Optimizer) BeginStep(ctx context.Context) (*StepTxn, error) {
	return o.BeginStepWith(ctx, o.DefaultParams())
}

// BeginStepWith is BeginStep for a step with the given parameters: its
// learning rate (and betas) and gradient scaling. Invalid parameters are
// refused (StepParams.Validate) and nothing is opened.
func (o *Optimizer) BeginStepWith(ctx context.Context, p StepParams) (*StepTxn, error) {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	return o.begin(ctx, p)
}

// begin opens a transaction and starts its pipeline; o.opMu is held.
func (o *Optimizer) begin(ctx context.Context, p StepParams) (*StepTxn, error) {
	o.mu.Lock()
	stepNo := o.step + 1
	tensors := o.tensors[:len(o.tensors):len(o.tensors)]
	sgs := o.sgs[:len(o.sgs):len(o.sgs)]
	o.mu.Unlock()
	fail := func(err error) error { return &Error{Op: "step", SubGroup: -1, Step: stepNo, Err: err} }
	if o.closed {
		return nil, fail(ErrClosed)
	}
	if o.txn != nil {
		return nil, fail(ErrStepOpen)
	}
	if err := ctx.Err(); err != nil {
		return nil, fail(err)
	}
	if err := p.Validate(); err != nil {
		return nil, fail(err)
	}
	h := o.opts.Hyper.With(p)
	if err := h.Validate(); err != nil {
		return nil, fail(err)
	}
	r := &stepRun{o: o, step: stepNo, params: p, hyper: h, args: newAdamArgsExact(stepNo, h), tensors: tensors, sgs: sgs, depth: o.opts.PipelineDepth,
		queue: make(chan *tensor, len(tensors)), done: make(chan struct{})}
	r.initWindows()
	r.pub.retired = make(map[*tensor]bool, len(tensors))
	if o.opts.Params != nil {
		r.pub.sink = publisherOf(o.opts.Params)
	}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	t := &StepTxn{o: o, r: r, start: time.Now(), handed: make(map[*tensor]bool)}
	r.start = t.start
	o.txn = t
	go r.run()
	return t, nil
}

// Step returns the number of the step the transaction takes (1-based).
func (t *StepTxn) Step() int { return t.r.step }

// Params returns the parameters the transaction steps with.
func (t *StepTxn) Params() StepParams { return t.r.params }

// Tensor hands over the named tensor: its gradient is final, and its
// sub-groups are queued for the pipeline. It returns at once, without
// waiting for any I/O. It fails with ErrNotRegistered for an unknown name,
// ErrHandedOver for a tensor handed over already and ErrStepEnded after
// Commit or Abort; such a refused call leaves the transaction as it was.
// Once the step has failed in the background it returns that failure (the
// *Error naming the tensor that failed): hand nothing more over and call
// Commit, which returns it too, or Abort.
func (t *StepTxn) Tensor(name string) error {
	r := t.r
	fail := func(err error) error {
		return &Error{Op: "hand-over", Tensor: name, SubGroup: -1, Step: r.step, Err: err}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return fail(t.endedErr())
	}
	tn, ok := t.o.lookup(name) // no tensor is registered while t is open
	if !ok {
		return fail(ErrNotRegistered)
	}
	if err := r.firstErr(); err != nil {
		return err
	}
	if t.handed[tn] {
		return fail(ErrHandedOver)
	}
	t.handed[tn] = true
	r.queue <- tn // never blocks: room for every tensor, each sent once
	return nil
}

// Commit ends the transaction: it queues every registered tensor not
// handed over yet (in registration order), waits for the pipeline, and
// then commits exactly as Step does: the new records renamed over the old
// ones in one Store.Rename, Params.CommitUpdates, the step counter
// advanced. On any failure during the transaction or the commit it
// discards everything and returns the first failure, an *Error naming the
// tensor and sub-group (or the commit); states, parameters and the step
// counter are then unchanged and a new transaction may retry the step.
// Cancelling ctx while Commit waits fails the step as cancelling
// BeginStep's ctx does. Commit after Commit or Abort fails with
// ErrStepEnded; after Close it fails with ErrClosed.
func (t *StepTxn) Commit(ctx context.Context) error { return t.commit(ctx, false) }

// commit implements Commit; locked says o.opMu is held (by Step).
func (t *StepTxn) commit(ctx context.Context, locked bool) error {
	r := t.r
	t.mu.Lock()
	handed, err := t.closeHandOver()
	if err != nil {
		t.mu.Unlock()
		return err
	}
	for _, tn := range r.tensors {
		if !t.handed[tn] {
			r.queue <- tn
		}
	}
	close(r.queue)
	t.mu.Unlock()
	return t.await(ctx, handed, time.Now(), locked)
}

// closeHandOver ends the hand-overs for Commit or CommitAsync (t.mu is
// held): it returns how many tensors were handed over, or the error of a
// transaction that has ended already.
func (t *StepTxn) closeHandOver() (handed int, err error) {
	if t.ended {
		return 0, &Error{Op: "step", SubGroup: -1, Step: t.r.step, Err: t.endedErr()}
	}
	t.ended = true
	return len(t.handed), nil
}

// await waits for the pipeline, which ctx cancels, and then commits or
// discards the step (finish); locked says o.opMu is held (by Step).
func (t *StepTxn) await(ctx context.Context, handed int, drainStart time.Time, locked bool) error {
	r, o := t.r, t.o
	stop := context.AfterFunc(ctx, func() { r.cancel(context.Cause(ctx)) })
	<-r.done
	stop()
	drain := time.Since(drainStart)
	if !locked {
		o.opMu.Lock()
		defer o.opMu.Unlock()
	}
	if t.finished { // aborted by Close while the commit waited
		return t.result
	}
	return t.finish(false, handed, drain, nil)
}

// Abort ends the transaction without committing: it stops the pipeline,
// waits for the I/O in flight and discards what was staged, leaving
// states, parameters and the step counter unchanged. Abort after Commit or
// Abort does nothing, so "defer txn.Abort()" is a safe pattern.
func (t *StepTxn) Abort() {
	if !t.end(errAborted) {
		return
	}
	t.o.opMu.Lock()
	defer t.o.opMu.Unlock()
	if !t.finished {
		t.finish(true, -1, 0, nil)
	}
}

// endedErr is the cause to report for a call after the transaction ended;
// t.mu is held.
func (t *StepTxn) endedErr() error {
	if t.closed {
		return ErrClosed
	}
	return ErrStepEnded
}

// end closes the queue and stops the pipeline with cause, unless Commit or
// Abort did already, and waits for it; it reports whether it ended t.
func (t *StepTxn) end(cause error) bool {
	r := t.r
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return false
	}
	t.ended = true
	t.closed = errors.Is(cause, ErrClosed)
	close(r.queue)
	t.mu.Unlock()
	r.fail(&Error{Op: "step", SubGroup: -1, Step: r.step, Err: cause})
	<-r.done
	return true
}

// abortForClose ends an open transaction as Close begins; o.opMu is held.
// A Commit or Abort waiting for the pipeline then finds it finished.
func (t *StepTxn) abortForClose() {
	r := t.r
	if !t.end(ErrClosed) {
		// Commit or Abort ended it and waits for the pipeline: stop it.
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		r.fail(&Error{Op: "step", SubGroup: -1, Step: r.step, Err: ErrClosed})
		<-r.done
	}
	t.finish(true, -1, 0, &Error{Op: "step", SubGroup: -1, Step: r.step, Err: ErrClosed})
}

// finish commits (abort false, no failure) or discards the step whose
// pipeline is done, records its stats and closes the transaction. o.opMu
// is held. handed is the number of tensors handed over before Commit (-1:
// count now); closeErr is what a waiting Commit returns after Close.
func (t *StepTxn) finish(abort bool, handed int, drain time.Duration, closeErr error) error {
	o, r := t.o, t.r
	if handed < 0 {
		t.mu.Lock()
		handed = len(t.handed)
		t.mu.Unlock()
	}
	err := r.firstErr()
	var commitTime time.Duration
	switch {
	case abort:
		o.abort(r)
	case err != nil:
		o.abort(r)
	case int(r.subGroups.Load()) != len(r.sgs):
		// Only a broken invariant gets here; committing would publish a
		// partial step.
		err = &Error{Op: "commit", SubGroup: -1, Step: r.step,
			Err: fmt.Errorf("internal error: %d of %d sub-groups updated", r.subGroups.Load(), len(r.sgs))}
		o.abort(r)
	default:
		start := time.Now()
		err = o.commit(r)
		commitTime = time.Since(start)
	}
	r.cancel(context.Canceled) // release the context
	st := r.stepStats(!abort && err == nil)
	st.Elapsed = time.Since(t.start)
	st.Commit = commitTime
	st.Drain = drain
	st.HandedOver = handed

	o.mu.Lock()
	switch {
	case abort:
		o.stats.AbortedSteps++
	case err == nil:
		o.step = r.step
		o.stats.Steps++
	default:
		o.stats.FailedSteps++
	}
	o.stats.Last = st
	o.stats.Total.add(st)
	o.mu.Unlock()
	o.txn = nil
	t.finished = true
	t.result = closeErr

	switch {
	case abort:
		o.opts.Logger.Debug("optimizer: step aborted; states and parameters unchanged", slog.Int("step", r.step),
			slog.Int("handed_over", handed), slog.Bool("closing", closeErr != nil))
		return nil
	case err != nil:
		o.opts.Logger.Warn("optimizer: step failed; states and parameters unchanged", slog.Int("step", r.step), slog.Any("error", err))
		return err
	}
	o.opts.Logger.Debug("optimizer: step committed", slog.Int("step", r.step), slog.Int("sub_groups", st.SubGroups),
		slog.Int("handed_over", handed),
		slog.Int64("bytes_read", st.BytesRead), slog.Int64("bytes_written", st.BytesWritten),
		slog.Duration("elapsed", st.Elapsed), slog.Duration("compute", st.Compute), slog.Duration("drain", st.Drain))
	return nil
}
