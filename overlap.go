package zinf

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// ErrUpdateFailed is wrapped by what BeginLayer, the parameter reads, the
// gradient calls and Step return after a step whose update ran on after
// Step returned (zinf.overlap_update) failed: nothing of that step was
// committed (the parameters it had published for the next forward pass
// are put back), its gradients are kept, and the loss scale, schedule and
// counters are as before it. Call Step again — it retries the failed step
// from the same gradients — and then run the step that was under way
// again from its first micro-batch's first layer: its forward may have
// read the failed step's parameters. AbortStep gives the failed step up
// instead (its gradients are dropped).
var ErrUpdateFailed = errors.New("zinf: the last step's update failed after Step returned")

// commitBackground ends txn's hand-over and lets its commit run on in the
// background; Step then returns. It is used with zinf.overlap_update.
// The commit's context is the runtime's, not the caller's (a Step's
// context is often cancelled as Step returns); Close waits for the commit
// before it ends that context.
func (r *Runtime) commitBackground(txn *optimizer.StepTxn) error {
	// The next forward's prefetches wait for each tensor's new values
	// rather than read the old ones and read again (held until each is
	// published, or the step ends).
	names := make([]string, len(r.model.Descs))
	for i, d := range r.model.Descs {
		names[i] = d.Name
	}
	r.Params.HoldPrefetch(names...)
	if err := txn.CommitAsync(r.bgCtx); err != nil {
		return err
	}
	t := &r.train
	bg := &bgStep{txn: txn, history: slices.Clone(t.history)}
	if t.scaler != nil {
		bg.scaler = *t.scaler
	}
	r.mu.Lock()
	bg.stats, bg.last, bg.stepCount = r.trainStats, r.last, r.stepCount
	r.mu.Unlock()
	r.bg = bg
	return nil
}

// settle waits for a step still updating in the background and returns
// the error of one that failed (ErrUpdateFailed) until Step retries it or
// AbortStep gives it up. ctx bounds the wait (the update goes on).
func (r *Runtime) settle(ctx context.Context) error {
	if bg := r.bg; bg != nil {
		if err := bg.txn.Wait(ctx); err != nil && !bg.finished() {
			return fmt.Errorf("zinf: waiting for step %d's update: %w", bg.step(), err)
		}
		r.reap()
	}
	return r.bgErr
}

// poll reaps a background step that has finished, without waiting, and
// returns the error of one that failed.
func (r *Runtime) poll() error {
	if bg := r.bg; bg != nil && bg.finished() {
		r.reap()
	}
	return r.bgErr
}

// reap ends a finished background step: on success what Step left to
// the commit (the gradients dropped, the check forgotten), on failure
// what Step changed ahead of it put back and the failure kept in bgErr.
func (r *Runtime) reap() {
	bg := r.bg
	r.bg = nil
	err := bg.txn.Wait(context.Background()) // finished: does not wait
	r.trace.optimizerDone(r.Optimizer)
	if err == nil {
		r.grads.Zero()
		r.train.pending = nil
		return
	}
	t := &r.train
	if t.scaler != nil {
		*t.scaler = bg.scaler
	}
	t.history = bg.history
	r.mu.Lock()
	r.trainStats, r.last, r.stepCount = bg.stats, bg.last, bg.stepCount
	r.mu.Unlock()
	r.bgErr = fmt.Errorf("%w (step %d): nothing of it was committed and the parameters it had published are put back; call Step to retry it from the same gradients, then run the current step again from its first layer: %w",
		ErrUpdateFailed, bg.step(), err)
	r.log.Warn("zinf: a step's update failed after Step returned; nothing of it was committed", "step", bg.step(), "error", err)
}

// waitTensors waits until the named parameters hold the values of the
// last step Step returned from (their update done, with
// zinf.overlap_update), and returns the error of a step whose update
// failed.
func (r *Runtime) waitTensors(ctx context.Context, names ...string) error {
	if r.bgErr != nil {
		return r.bgErr
	}
	bg := r.bg
	if bg == nil {
		return nil
	}
	t0 := time.Now()
	for _, n := range names {
		if err := bg.txn.WaitTensor(ctx, n); err != nil {
			if bg.finished() {
				break
			}
			return fmt.Errorf("zinf: waiting for %q's update of step %d: %w", n, bg.step(), err)
		}
	}
	r.mu.Lock()
	r.updateWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	if bg.txn.Failing() {
		// Failed, and what it published may be going back: wait for it.
		return r.settle(ctx)
	}
	return r.poll()
}

// checkRead ends a parameter read (*err nil so far) that waitTensors let
// through while a step's update ran on: if the step has failed since,
// what the read returned may be a value being put back, so the read
// returns the step's failure (ErrUpdateFailed) instead. A step not
// failing once the read is done had published what it read.
func (r *Runtime) checkRead(ctx context.Context, err *error) {
	if *err != nil {
		return
	}
	if bg := r.bg; bg != nil && bg.txn.Failing() {
		*err = r.settle(ctx)
	}
}

// stepNumber is the optimizer step count as the loop sees it: a step
// Step returned from counts although its commit may still be running.
func (r *Runtime) stepNumber() int {
	n := r.Optimizer.StepCount()
	if bg := r.bg; bg != nil && n < bg.step() {
		n = bg.step()
	}
	return n
}

// settled waits for a step updating in the background, as settle does,
// and returns only a failure to wait: for calls that read or replace what
// the last committed step left, whether or not a later one failed.
func (r *Runtime) settled(ctx context.Context) error {
	if err := r.settle(ctx); err != nil && !errors.Is(err, ErrUpdateFailed) {
		return err
	}
	return nil
}

// WaitStep waits until the update of the last step Step returned from is
// committed and returns nil, or returns the error (wrapping
// ErrUpdateFailed) of one that failed after Step returned, which stays
// until Step retries the step or AbortStep gives it up. Without
// zinf.overlap_update Step returns after the commit and WaitStep returns
// nil at once. ctx bounds the wait only: the update goes on.
func (r *Runtime) WaitStep(ctx context.Context) error {
	if err := r.closedErr("wait for the step", optimizer.ErrClosed); err != nil {
		return err
	}
	return r.settle(ctx)
}

// OverlapUpdate reports whether Step returns before its update is
// committed (zinf.overlap_update, where the plan has room for it: see
// the warning Open logs otherwise).
func (r *Runtime) OverlapUpdate() bool { return r.overlapUpdate }
