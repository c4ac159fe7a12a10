package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// pubSink is rangeSink as an optimizer.Publisher: PublishUpdate makes a
// staged tensor visible (published) and records the order; CommitUpdates
// and DiscardUpdates end the step's publications.
type pubSink struct {
	*rangeSink
	pmu       sync.Mutex
	published map[string][]float32
	order     []string
	reverted  int
	pubErr    func(name string) error
}

var _ optimizer.Publisher = (*pubSink)(nil)

func (s *pubSink) PublishUpdate(name string) error {
	s.pmu.Lock()
	hook := s.pubErr
	s.pmu.Unlock()
	if hook != nil {
		if err := hook(name); err != nil {
			return err
		}
	}
	s.mu.Lock()
	v, ok := s.staged[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("publish %s: nothing staged", name)
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.published[name] = append([]float32(nil), v...)
	s.order = append(s.order, name)
	return nil
}

func (s *pubSink) CommitUpdates() error {
	if err := s.rangeSink.CommitUpdates(); err != nil {
		return err
	}
	s.pmu.Lock()
	clear(s.published)
	s.pmu.Unlock()
	return nil
}

func (s *pubSink) DiscardUpdates() {
	s.rangeSink.DiscardUpdates()
	s.pmu.Lock()
	s.reverted += len(s.published)
	clear(s.published)
	s.pmu.Unlock()
}

func (s *pubSink) take() (order []string, published map[string][]float32) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	order, s.order = s.order, nil
	published = map[string][]float32{}
	for k, v := range s.published {
		published[k] = v
	}
	return order, published
}

// TestCommitAsync: a transaction committed with CommitAsync equals Step
// bit for bit; with nothing handed over it publishes every tensor in
// registration order, each one's values the step's before the commit
// (WaitTensor returns once it is published); tensors handed over last
// layer first and not yet stepped are stepped in registration order too.
func TestCommitAsync(t *testing.T) {
	for _, depth := range []int{0, 1, 3} {
		for _, mode := range []string{"none", "reverse"} {
			t.Run(fmt.Sprintf("depth=%d/%s", depth, mode), func(t *testing.T) {
				r := newRig(t, rigConfig{publish: true, specs: mixed, seed: uint64(depth),
					opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth, Hyper: hypers[depth%len(hypers)]}})
				ctx := testCtx(t)
				all := names(mixed)
				for step := 1; step <= 3; step++ {
					r.grads.set(r.md.grads(step))
					txn, err := r.opt.BeginStep(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if err := txn.WaitTensor(ctx, all[0]); !errors.Is(err, optimizer.ErrNotAsync) {
						t.Fatalf("WaitTensor before CommitAsync: %v", err)
					}
					if mode == "reverse" {
						rev := slices.Clone(all)
						slices.Reverse(rev)
						for _, n := range rev {
							if err := txn.Tensor(n); err != nil {
								t.Fatal(err)
							}
						}
					}
					if err := txn.CommitAsync(ctx); err != nil {
						t.Fatal(err)
					}
					if err := txn.CommitAsync(ctx); !errors.Is(err, optimizer.ErrStepEnded) {
						t.Fatalf("CommitAsync twice: %v", err)
					}
					txn.Abort() // does nothing after CommitAsync
					r.md.refStep()
					for _, n := range all {
						if err := txn.WaitTensor(ctx, n); err != nil {
							t.Fatalf("WaitTensor(%s): %v", n, err)
						}
						if r.opt.StepCount() == step {
							continue // committed already: nothing left to see published
						}
						_, pub := r.psink.take()
						if v, ok := pub[n]; ok {
							if i := firstDiff(v, r.md.p[n]); i >= 0 {
								t.Fatalf("step %d: published %s differs at %d", step, n, i)
							}
						}
					}
					if err := txn.Wait(ctx); err != nil {
						t.Fatal(err)
					}
					r.psink.take()
					r.check(fmt.Sprintf("step %d", step))
				}
			})
		}
	}
}

// TestCommitAsyncOrder: with nothing handed over, every tensor is
// published, once, in registration order.
func TestCommitAsyncOrder(t *testing.T) {
	r := newRig(t, rigConfig{publish: true, specs: mixed, seed: 7, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 2}})
	ctx := testCtx(t)
	r.grads.set(r.md.grads(1))
	txn, err := r.opt.BeginStep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.CommitAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := txn.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	r.md.refStep()
	r.check("step 1")
	if order, _ := r.psink.take(); !slices.Equal(order, names(mixed)) {
		t.Fatalf("published %v, want registration order %v", order, names(mixed))
	}
}

// TestCommitAsyncFailure: a staging failure of the last tensor after
// the first ones were published fails the step: Wait and WaitTensor of a
// tensor not published return the *Error naming it, every publication is
// discarded, states and the step count are unchanged, and a retry equals
// the reference. A publish failure does the same.
func TestCommitAsyncFailure(t *testing.T) {
	for _, what := range []string{"stage", "publish"} {
		t.Run(what, func(t *testing.T) {
			r := newRig(t, rigConfig{publish: true, specs: mixed, seed: 9, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
			ctx := testCtx(t)
			r.mustStep()
			before := r.states()
			lastName := mixed[len(mixed)-1].name
			boom := errors.New("boom")
			hook := func(name string) error {
				if name == lastName {
					return boom
				}
				return nil
			}
			if what == "stage" {
				r.sink.mu.Lock()
				r.sink.stageErr = hook
				r.sink.mu.Unlock()
			} else {
				r.psink.pubErr = hook
			}
			r.grads.set(r.md.grads(2))
			txn, err := r.opt.BeginStep(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := txn.CommitAsync(ctx); err != nil {
				t.Fatal(err)
			}
			err = txn.WaitTensor(ctx, lastName)
			var oe *optimizer.Error
			if !errors.Is(err, boom) || !errors.As(err, &oe) || oe.Tensor != lastName {
				t.Fatalf("WaitTensor(%s): %v", lastName, err)
			}
			if err := txn.Wait(ctx); !errors.Is(err, boom) {
				t.Fatalf("Wait: %v", err)
			}
			// What retired before the failure was published, in order, and
			// all of it put back; the failing tensor never was.
			order, _ := r.psink.take()
			if len(order) == 0 || len(order) >= len(mixed) || !slices.Equal(order, names(mixed)[:len(order)]) || r.psink.reverted != len(order) {
				t.Fatalf("published %v, reverted %d: want a first part of %v, all put back", order, r.psink.reverted, names(mixed))
			}
			if !equalStates(before, r.states()) || r.opt.StepCount() != 1 {
				t.Fatalf("the failed step changed the states (step count %d)", r.opt.StepCount())
			}
			r.sink.mu.Lock()
			r.sink.stageErr = nil
			r.sink.mu.Unlock()
			r.psink.pubErr = nil
			r.mustStep()
			r.check("retry")
		})
	}
}

// TestCommitAsyncClose: Close while an asynchronous commit runs ends it
// (discarded, ErrClosed) without hanging.
func TestCommitAsyncClose(t *testing.T) {
	r := newRig(t, rigConfig{publish: true, specs: mixed, seed: 3, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
	ctx := testCtx(t)
	r.grads.set(r.md.grads(1))
	r.sink.mu.Lock()
	r.sink.stageErr = func(string) error { time.Sleep(20 * time.Millisecond); return nil }
	r.sink.mu.Unlock()
	txn, err := r.opt.BeginStep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.CommitAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.opt.Close(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := txn.Wait(wctx); err != nil && !errors.Is(err, optimizer.ErrClosed) {
		t.Fatalf("Wait after Close: %v", err)
	}
	select {
	case <-txn.Done():
	default:
		t.Fatal("the commit did not end with Close")
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
