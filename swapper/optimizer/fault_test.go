package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// failedStep injects a fault and runs a step expected to fail and checks the transaction
// guarantees: the error matches and names a tensor, and states, step
// count, committed params and the store are exactly as before. heal
// removes the fault; the retried step must then equal the reference.
func failedStep(t *testing.T, r *rig, ctx context.Context, wantIs error, wantOp string, inject, heal func()) {
	t.Helper()
	before := r.states()
	params := r.sink.snapshot()
	steps := r.opt.StepCount()
	inject()
	err := r.step(ctx)
	if err == nil {
		t.Fatal("step succeeded despite the fault")
	}
	if wantIs != nil && !errors.Is(err, wantIs) {
		t.Fatalf("error %v: want errors.Is %v", err, wantIs)
	}
	var oe *optimizer.Error
	if !errors.As(err, &oe) {
		t.Fatalf("error %T %v is not an *optimizer.Error", err, err)
	}
	if wantOp != "" && oe.Op != wantOp {
		t.Fatalf("error op %q, want %q: %v", oe.Op, wantOp, err)
	}
	known := false
	for _, s := range r.cfg.specs {
		known = known || s.name == oe.Tensor
	}
	if !known || !strings.Contains(err.Error(), fmt.Sprintf("%q", oe.Tensor)) {
		t.Fatalf("error does not name a tensor: %v", err)
	}
	if oe.Step != steps+1 {
		t.Fatalf("error names step %d, want %d", oe.Step, steps+1)
	}
	t.Logf("step failed as expected: %v", err)
	if got := r.opt.StepCount(); got != steps {
		t.Fatalf("StepCount moved from %d to %d on a failed step", steps, got)
	}
	heal()
	if !equalStates(before, r.states()) {
		t.Fatal("a failed step changed the optimizer states")
	}
	after := r.sink.snapshot()
	if len(after) != len(params) {
		t.Fatal("a failed step changed the committed params")
	}
	for k, v := range params {
		if firstDiff(v, after[k]) >= 0 {
			t.Fatalf("a failed step changed committed param %s", k)
		}
	}
	r.sink.mu.Lock()
	staged := len(r.sink.staged)
	r.sink.mu.Unlock()
	if staged != 0 {
		t.Fatalf("%d staged params left after a failed step", staged)
	}
	if st := r.opt.Stats(); st.Last.Committed || st.FailedSteps == 0 {
		t.Fatalf("stats after a failed step: %+v", st)
	}
	r.checkStoreClean("after the failed step")
	r.mustStep()
	r.check("after the retried step")
}

func TestWriteNoSpace(t *testing.T) {
	for _, backend := range []string{aio.BackendPosix, aio.BackendUring} {
		for _, depth := range []int{0, 1, 3} {
			for _, nth := range []int{1, 5, 11} { // 11 sub-groups: first, middle, last write
				t.Run(fmt.Sprintf("%s/depth=%d/nth=%d", backend, depth, nth), func(t *testing.T) {
					r := newRig(t, rigConfig{backend: backend, specs: mixed, seed: uint64(nth),
						opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth}})
					r.mustStep()
					failedStep(t, r, context.Background(), aio.ErrNoSpace, "write-behind", func() {
						r.inj.Add(faults.Rule{Kind: faults.Writes, Nth: nth, Err: syscall.ENOSPC})
					}, r.inj.Clear)
					if h := r.inj.Hits(); h != 1 {
						t.Fatalf("fault fired %d times", h)
					}
					r.mustStep()
					r.check("after another step")
				})
			}
		}
	}
}

func TestReadIOError(t *testing.T) {
	for _, backend := range []string{aio.BackendPosix, aio.BackendUring} {
		for _, depth := range []int{0, 3} {
			for _, nth := range []int{1, 6, 11} {
				t.Run(fmt.Sprintf("%s/depth=%d/nth=%d", backend, depth, nth), func(t *testing.T) {
					r := newRig(t, rigConfig{backend: backend, specs: mixed, seed: 21,
						opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth, BufferCount: 2}})
					r.mustStep()
					failedStep(t, r, context.Background(), aio.ErrIO, "read-ahead", func() {
						r.inj.Add(faults.Rule{Kind: faults.Reads, Nth: nth, Err: syscall.EIO})
					}, r.inj.Clear)
				})
			}
		}
	}
}

func TestChecksumMismatch(t *testing.T) {
	for _, depth := range []int{0, 2} {
		t.Run(fmt.Sprintf("depth=%d", depth), func(t *testing.T) {
			r := newRig(t, rigConfig{checksums: true, specs: mixed, seed: 8,
				opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth}})
			r.mustStep()
			path, off, err := r.store.Locate("optimizer/w2#3", 4*1000+8) // inside exp_avg
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			orig := make([]byte, 4)
			if _, err := f.ReadAt(orig, off); err != nil {
				t.Fatal(err)
			}
			corrupt := func() {
				bad := []byte{orig[0] ^ 0xff, orig[1], orig[2], orig[3]}
				if _, err := f.WriteAt(bad, off); err != nil {
					t.Fatal(err)
				}
			}
			heal := func() {
				if _, err := f.WriteAt(orig, off); err != nil {
					t.Fatal(err)
				}
			}
			failedStep(t, r, context.Background(), swapper.ErrChecksum, "read-ahead", corrupt, heal)
		})
	}
}

func TestCancel(t *testing.T) {
	for _, memory := range []bool{false, true} {
		for _, depth := range []int{0, 3} {
			t.Run(fmt.Sprintf("memory=%v/depth=%d", memory, depth), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: memory, specs: mixed, seed: 13,
					opts: optimizer.Options{SubGroupSize: 500, PipelineDepth: depth}})
				r.mustStep()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				failedStep(t, r, ctx, context.Canceled, "", func() {
					r.grads.hook = func(_ context.Context, name string) error {
						if name == "w2" {
							cancel()
						}
						return nil
					}
				}, func() { r.grads.hook = nil })
			})
		}
	}
	r := newRig(t, rigConfig{specs: mixed, opts: optimizer.Options{SubGroupSize: 500}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.step(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Step with a cancelled context: %v", err)
	}
}

func TestGradError(t *testing.T) {
	for _, memory := range []bool{false, true} {
		r := newRig(t, rigConfig{memory: memory, specs: mixed, seed: 14,
			opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 2}})
		r.mustStep()
		boom := errors.New("grad partition lost")
		failedStep(t, r, context.Background(), boom, "grad", func() {
			r.grads.hook = func(_ context.Context, name string) error {
				if name == "b1" {
					return boom
				}
				return nil
			}
		}, func() { r.grads.hook = nil })
	}
}

func TestStageError(t *testing.T) {
	for _, memory := range []bool{false, true} {
		r := newRig(t, rigConfig{memory: memory, specs: mixed, seed: 15,
			opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
		r.mustStep()
		full := errors.New("param store full")
		failedStep(t, r, context.Background(), full, "stage", func() {
			r.sink.stageErr = func(name string) error {
				if name == "w2" {
					return full
				}
				return nil
			}
		}, func() { r.sink.stageErr = nil })
	}
}

func TestCommitError(t *testing.T) {
	for _, memory := range []bool{false, true} {
		r := newRig(t, rigConfig{memory: memory, specs: mixed, seed: 16,
			opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 3}})
		r.mustStep()
		boom := errors.New("param commit failed")
		r.sink.commitErr = boom
		before := r.states()
		err := r.step(context.Background())
		var oe *optimizer.Error
		if !errors.Is(err, boom) || !errors.As(err, &oe) || oe.Op != "commit" {
			t.Fatalf("Step with a failing param commit: %v", err)
		}
		if !equalStates(before, r.states()) || r.opt.StepCount() != 1 {
			t.Fatal("a failed commit changed the states")
		}
		r.checkStoreClean("after the failed commit")
		r.mustStep()
		r.check("after the retried step")
	}
}

// TestRandomFaults injects random write and read errors over many steps;
// every failed step must change nothing and every retry must match the
// reference. The seed is printed so a failure reproduces.
func TestRandomFaults(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	r := newRig(t, rigConfig{specs: mixed, seed: seed, checksums: true, paths: 2,
		opts: optimizer.Options{SubGroupSize: 400, PipelineDepth: 1 + rng.IntN(3), BufferCount: 1 + rng.IntN(6)}})
	failures := 0
	steps := testenv.Scale(8, 80)
	for s := 0; s < steps; s++ {
		errno := []syscall.Errno{syscall.ENOSPC, syscall.EIO}[rng.IntN(2)]
		kind := []faults.Kind{faults.Reads, faults.Writes, faults.AnyOp}[rng.IntN(3)]
		before := r.states()
		r.inj.Add(faults.Rule{Kind: kind, Probability: 0.005 + 0.03*rng.Float64(), Err: errno})
		err := r.step(context.Background())
		r.inj.Clear()
		if err != nil {
			failures++
			if !errors.Is(err, aio.ErrNoSpace) && !errors.Is(err, aio.ErrIO) {
				t.Fatalf("seed %d: unexpected error %v", seed, err)
			}
			if !equalStates(before, r.states()) || r.opt.StepCount() != r.md.step {
				t.Fatalf("seed %d: failed step %d changed the states", seed, r.md.step+1)
			}
			r.checkStoreClean("after a failed step")
			if err := r.step(context.Background()); err != nil {
				t.Fatalf("seed %d: retry: %v", seed, err)
			}
		}
		r.md.refStep()
		r.check(fmt.Sprintf("seed %d step %d", seed, r.md.step))
	}
	t.Logf("%d of %d steps failed and were retried", failures, steps)
}
