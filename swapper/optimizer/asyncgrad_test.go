package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// asyncGrads is an AsyncGradSource over the fake: each read runs on its
// own goroutine, so the step's read-ahead really has several in flight.
// It counts the reads started and waited for, and can fail a read at its
// start (failStart) or at Wait (failWait).
type asyncGrads struct {
	f *fakeGrads

	mu                  sync.Mutex
	started, waited     int
	inFlight, maxFlight int
	failStart           func(name string, lo int) error
	failWait            func(name string, lo int) error
	// gate, when not nil, holds every read until it is closed.
	gate chan struct{}
}

var _ optimizer.AsyncGradSource = (*asyncGrads)(nil)

func (a *asyncGrads) RangeBufferBytes(lo, hi int) int { return a.f.RangeBufferBytes(lo, hi) }

func (a *asyncGrads) ReadRange(ctx context.Context, name string, lo, hi int, dst []byte) ([]float32, error) {
	return nil, errors.New("asyncGrads: the step must use ReadRangeAsync")
}

type asyncRead struct {
	a    *asyncGrads
	done chan struct{}
	out  []float32
	err  error
	fail error
	once bool
}

func (r *asyncRead) Wait() ([]float32, error) {
	<-r.done
	r.a.mu.Lock()
	defer r.a.mu.Unlock()
	if r.once {
		return nil, errors.New("asyncGrads: Wait called twice")
	}
	r.once = true
	r.a.waited++
	r.a.inFlight--
	if r.fail != nil {
		return nil, r.fail
	}
	return r.out, r.err
}

func (a *asyncGrads) ReadRangeAsync(ctx context.Context, name string, lo, hi int, dst []byte) (optimizer.RangeRead, error) {
	a.mu.Lock()
	failStart, failWait := a.failStart, a.failWait
	a.mu.Unlock()
	if failStart != nil {
		if err := failStart(name, lo); err != nil {
			return nil, err
		}
	}
	r := &asyncRead{a: a, done: make(chan struct{})}
	if failWait != nil {
		r.fail = failWait(name, lo)
	}
	a.mu.Lock()
	a.started++
	a.inFlight++
	a.maxFlight = max(a.maxFlight, a.inFlight)
	gate := a.gate
	a.mu.Unlock()
	go func() {
		if gate != nil {
			<-gate
		}
		r.out, r.err = a.f.ReadRange(ctx, name, lo, hi, dst)
		close(r.done)
	}()
	return r, nil
}

func (a *asyncGrads) counts() (started, waited, maxFlight int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.started, a.waited, a.maxFlight
}

// TestAsyncGradSource: with an AsyncGradSource the step starts gradient
// reads without waiting (several in flight with a deep pipeline), waits
// for each exactly once, and is bit for bit the reference; a read that
// fails at its start or at Wait fails the step, naming the tensor, with
// states unchanged, every started read still waited for, and the retried
// step exact.
func TestAsyncGradSource(t *testing.T) {
	for _, memory := range []bool{false, true} {
		for _, depth := range []int{0, 1, 3} {
			t.Run(fmt.Sprintf("memory=%v/depth=%d", memory, depth), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: memory, asyncGrads: true, specs: mixed, seed: 9,
					opts: optimizer.Options{SubGroupSize: 500, PipelineDepth: depth}})
				r.mustStep()
				r.check("after step 1")
				started, waited, maxFlight := r.async.counts()
				if started != r.subGroups() || waited != started {
					t.Fatalf("%d reads started, %d waited for, %d sub-groups", started, waited, r.subGroups())
				}
				if depth >= 3 && maxFlight < 2 {
					t.Errorf("at depth %d at most %d gradient reads were in flight at once", depth, maxFlight)
				}
				for _, where := range []string{"start", "wait"} {
					before := r.states()
					fail := func(name string, lo int) error {
						if name == "w2" && lo == 1000 {
							return syscall.EIO
						}
						return nil
					}
					r.async.mu.Lock()
					if where == "start" {
						r.async.failStart = fail
					} else {
						r.async.failWait = fail
					}
					r.async.mu.Unlock()
					err := r.step(context.Background())
					var oe *optimizer.Error
					if !errors.As(err, &oe) || oe.Tensor != "w2" || !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "grad") {
						t.Fatalf("a gradient read failing at its %s: %v; want an *Error naming w2 and EIO", where, err)
					}
					if !equalStates(before, r.states()) {
						t.Fatalf("states changed by a step whose gradient read failed at its %s", where)
					}
					if s, w, _ := r.async.counts(); s != w {
						t.Fatalf("after the failed step: %d reads started, %d waited for", s, w)
					}
					r.async.mu.Lock()
					r.async.failStart, r.async.failWait = nil, nil
					r.async.mu.Unlock()
					r.mustStep()
					r.check("after the retried step")
				}
			})
		}
	}
}

// TestWindowsWeighSubGroups: the step's windows count a sub-group by the
// block its buffer takes, so with large tensors alternating with small
// ones, depth 2 reads the next large tensor's small companion ahead too:
// with every gradient read held, four reads are started (W0, b0, W1, b1)
// where counting sub-groups allowed three. The step is then exact.
func TestWindowsWeighSubGroups(t *testing.T) {
	specs := []spec{{"W0", 100000}, {"b0", 10}, {"W1", 100000}, {"b1", 10}, {"W2", 100000}, {"b2", 10}, {"W3", 100000}}
	r := newRig(t, rigConfig{asyncGrads: true, specs: specs, seed: 3, poolBytes: 64 << 20,
		opts: optimizer.Options{SubGroupSize: 1 << 20, PipelineDepth: 2}})
	gate := make(chan struct{})
	r.async.mu.Lock()
	r.async.gate = gate
	r.async.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- r.step(context.Background()) }()
	// Wait until the read-ahead stops starting reads.
	var started int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		s, _, _ := r.async.counts()
		if s == started && s > 0 {
			time.Sleep(50 * time.Millisecond)
			if s2, _, _ := r.async.counts(); s2 == s {
				break
			}
		}
		started = s
		time.Sleep(10 * time.Millisecond)
	}
	if started != 4 {
		t.Errorf("%d gradient reads started while all were held; want 4 (W0, b0, W1, b1)", started)
	}
	close(gate)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the step did not finish after the reads were let go")
	}
	r.md.refStep()
	r.check("after the gated step")
}
