package optimizer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Publisher is a ParamSink that can make one tensor's staged update
// current before the step commits, keeping the version it replaces until
// CommitUpdates drops it or DiscardUpdates puts it back (swapper/param's
// Swapper does). With one, StepTxn.CommitAsync publishes each tensor's
// new parameters as soon as they are written.
type Publisher interface {
	PublishUpdate(name string) error
}

// publisherOf returns p's Publisher, looking through SinkOf's adapters;
// nil when p cannot publish.
func publisherOf(p ParamSink) Publisher {
	if u, ok := p.(interface{ stager() any }); ok {
		if pub, ok := u.stager().(Publisher); ok {
			return pub
		}
		return nil
	}
	pub, _ := p.(Publisher)
	return pub
}

func (a sinkAdapter[W]) stager() any { return a.s }

// ErrNotAsync is returned by StepTxn.WaitTensor before CommitAsync.
var ErrNotAsync = errors.New("optimizer: the step is not committing asynchronously (call CommitAsync first)")

// pubState is what a step committing asynchronously publishes, and when.
type pubState struct {
	mu      sync.Mutex
	sink    Publisher                 // nil: nothing is visible before the commit
	retired map[*tensor]bool          // every sub-group written and staged, no failure
	on      bool                      // CommitAsync was called
	ch      map[*tensor]chan struct{} // closed once the tensor is published
}

// tensorRetired is called once t's last sub-group has retired without a
// failure: t is published now when the step commits asynchronously, else
// when CommitAsync is called.
func (r *stepRun) tensorRetired(t *tensor) {
	p := &r.pub
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retired[t] = true
	if p.on {
		r.publishLocked(t)
	}
}

// publishLocked makes t's new parameters current; r.pub.mu is held.
func (r *stepRun) publishLocked(t *tensor) {
	p := &r.pub
	ch := p.ch[t]
	if ch == nil || p.sink == nil || r.failed() {
		return
	}
	if err := p.sink.PublishUpdate(t.name); err != nil {
		r.fail(&Error{Op: "publish", Tensor: t.name, SubGroup: -1, SubGroups: len(t.sgs), Step: r.step, Err: err})
		return
	}
	close(ch)
	p.ch[t] = nil
}

// CommitAsync ends the hand-over as Commit does and returns at once; the
// commit runs on when the pipeline is done, on the transaction's own
// goroutine. The tensors not stepped yet are stepped in registration order
// (the forward order of a model registered layer by layer), whatever order
// they were handed over in, and — when the Params sink is a Publisher —
// each tensor's new parameters are published as soon as it is written
// (those written already at once), so that a forward pass can read the
// first layers' new values while the last ones still update: WaitTensor
// waits for one tensor. Wait returns the commit's result, which is
// Commit's: on any failure every published tensor is put back
// (DiscardUpdates) and states, parameters and the step counter are
// unchanged. Without a Publisher nothing is visible before the commit and
// WaitTensor waits for it.
//
// ctx governs the background work until the commit: cancelling it fails
// the step. CommitAsync after Commit, Abort or CommitAsync fails with
// ErrStepEnded (ErrClosed after Close); Abort after CommitAsync does
// nothing.
func (t *StepTxn) CommitAsync(ctx context.Context) error {
	r := t.r
	t.mu.Lock()
	handed, err := t.closeHandOver()
	if err != nil {
		t.mu.Unlock()
		return err
	}
	// Take back what the pipeline has not picked up yet, and queue it with
	// the tensors not handed over, in registration order.
	var backlog []*tensor
drain:
	for {
		select {
		case tn := <-r.queue:
			backlog = append(backlog, tn)
		default:
			break drain
		}
	}
	queued := make(map[*tensor]bool, len(backlog))
	for _, tn := range backlog {
		queued[tn] = true
	}
	for _, tn := range r.tensors {
		if queued[tn] || !t.handed[tn] {
			r.queue <- tn // room for every tensor: each is in it at most once
		}
	}
	close(r.queue)
	p := &r.pub
	p.mu.Lock()
	p.ch = make(map[*tensor]chan struct{}, len(r.tensors))
	for _, tn := range r.tensors {
		ch := make(chan struct{})
		p.ch[tn] = ch
		if len(tn.sgs) == 0 {
			close(ch) // nothing to update
			p.ch[tn] = nil
		}
	}
	p.on = true
	for _, tn := range r.tensors {
		if p.retired[tn] {
			r.publishLocked(tn)
		}
	}
	p.mu.Unlock()
	t.async = make(chan struct{})
	t.mu.Unlock()

	drainStart := time.Now()
	go func() {
		t.asyncErr = t.await(ctx, handed, drainStart, false)
		close(t.async)
	}()
	return nil
}

// Failing reports that the step has failed (or been aborted), from the
// moment of the failure — before anything it published is put back, so
// a value read from a published tensor and then followed by Failing()
// false was the step's new value. Wait returns the failure once the
// step is discarded.
func (t *StepTxn) Failing() bool { return t.r.failed() || t.r.undoing.Load() }

// Done is closed once a transaction committing asynchronously has
// finished (committed or discarded); nil before CommitAsync.
func (t *StepTxn) Done() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.async
}

// Wait waits for the commit CommitAsync started and returns its result
// (nil: committed). It fails with ErrNotAsync before CommitAsync; ctx
// bounds the wait only (the step goes on).
func (t *StepTxn) Wait(ctx context.Context) error {
	done := t.Done()
	if done == nil {
		return &Error{Op: "step", SubGroup: -1, Step: t.r.step, Err: ErrNotAsync}
	}
	select {
	case <-done:
		return t.asyncErr
	case <-ctx.Done():
		return &Error{Op: "step", SubGroup: -1, Step: t.r.step, Err: fmt.Errorf("waiting for the step's commit: %w", context.Cause(ctx))}
	}
}

// WaitTensor waits until the named tensor's new parameters are current
// (published, or the step committed) and returns nil, or returns the
// step's failure if it finished without committing. A tensor published
// may still be put back by a later failure of the step: Wait tells. ctx
// bounds the wait only.
func (t *StepTxn) WaitTensor(ctx context.Context, name string) error {
	r := t.r
	done := t.Done()
	if done == nil {
		return &Error{Op: "step", Tensor: name, SubGroup: -1, Step: r.step, Err: ErrNotAsync}
	}
	tn, ok := t.o.lookup(name)
	if !ok {
		return &Error{Op: "step", Tensor: name, SubGroup: -1, Step: r.step, Err: ErrNotRegistered}
	}
	r.pub.mu.Lock()
	ch := r.pub.ch[tn]
	r.pub.mu.Unlock()
	if ch == nil {
		ch = closedCh
	}
	select {
	case <-done:
		return t.asyncErr
	default:
	}
	select {
	case <-ch:
		return nil
	case <-done:
		return t.asyncErr
	case <-ctx.Done():
		return &Error{Op: "step", Tensor: name, SubGroup: -1, Step: r.step, Err: fmt.Errorf("waiting for the tensor's update: %w", context.Cause(ctx))}
	}
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
