package zgomlx_test

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// sameModel fails the test unless the Trainer's variables, masters and
// Adam moments equal the MemoryTrainer's bit for bit.
func sameModel(ctx context.Context, t *testing.T, what string, tr *zgomlx.Trainer, mt *reference.MemoryTrainer, memStore *model.Store) {
	t.Helper()
	off := tr.Offload()
	for _, v := range off.Vars() {
		got, err := off.ReadVariable(ctx, v.Name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		sameBytes(t, what+": "+v.Name, valueBytes(t, got), valueBytes(t, memStore.GetVariable(v.Name).MustValue()))
		master, m, sq, err := off.Runtime().ReadOptimizerState(ctx, v.Name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		wm, wmm, wsq, _ := mt.State(v.Name)
		sameBits(t, what+": "+v.Name+" master", master, wm)
		sameBits(t, what+": "+v.Name+" exp_avg", m, wmm)
		sameBits(t, what+": "+v.Name+" exp_avg_sq", sq, wsq)
	}
}

// TestFaultMidStep injects faults into one training step of a
// transformer — ENOSPC under the optimizer's writes (the updates started
// during backward, then the commit), ENOSPC under the gradient
// write-behind, EIO under a parameter swap-in — and checks that the
// failed step leaves the model (parameters, masters, moments) exactly as
// the step before, and that retrying as the error says (Commit for
// ErrCommitPending, the step from the start otherwise) gives the
// fault-free result, bit for bit with in-memory training, for this and
// the following steps; each case with the loop overlapping swap-ins and
// hand-overs with compute and with Options.OneLayerResident.
func TestFaultMidStep(t *testing.T) {
	cases := []faultCase{
		{name: "commit-ENOSPC", rule: faultRule{Kind: faultWrites, PathContains: filepath.Join("/", "zinf-optim-"), Nth: 3, Err: syscall.ENOSPC}, serial: true},
		{name: "optimizer-ENOSPC", rule: faultRule{Kind: faultWrites, PathContains: filepath.Join("/", "zinf-optim-"), Nth: 3, Err: syscall.ENOSPC}},
		{name: "gradient-ENOSPC", rule: faultRule{Kind: faultWrites, PathContains: filepath.Join("/", "zinf-grad-"), Err: syscall.ENOSPC}},
		{name: "gradient-ENOSPC-once", rule: faultRule{Kind: faultWrites, PathContains: filepath.Join("/", "zinf-grad-"), Nth: 5, Err: syscall.ENOSPC}, transient: true},
		{name: "param-read-EIO", rule: faultRule{Kind: faultReads, PathContains: filepath.Join("/", "zinf-param-"), Nth: 9, Err: syscall.EIO}},
	}
	for _, c := range cases {
		for _, one := range []bool{false, true} {
			if one {
				c.name += "/one-layer-resident"
			}
			faultMidStep(t, c, one)
		}
	}
}

// stepWithMemory runs step i of tc on the Trainer and on the MemoryTrainer
// and fails the test unless both succeed with the same loss.
func stepWithMemory(ctx context.Context, t *testing.T, tc trainCase, tr *zgomlx.Trainer, mt *reference.MemoryTrainer, i int) {
	t.Helper()
	x, y := tc.batch(i)
	lo, err := tr.Step(ctx, x, y)
	if err != nil {
		t.Fatalf("step %d: %v", i, err)
	}
	if lm, _ := mt.Step(ctx, x, y); lm != lo {
		t.Fatalf("step %d: loss %v offloaded, %v in memory", i, lo, lm)
	}
}

// faultCase is a fault TestFaultMidStep injects.
type faultCase struct {
	name      string
	rule      faultRule
	transient bool // zinf rewrites the failed write itself: the step succeeds
	serial    bool // every update in the commit (zinf.Options.SerialStep): the commit fails
}

// faultMidStep is one case of TestFaultMidStep; one trains with
// Options.OneLayerResident.
func faultMidStep(t *testing.T, c faultCase, one bool) {
	t.Run(c.name, func(t *testing.T) {
		ctx := watchdog(t, 3*time.Minute)
		tc := lmCase(dtypes.Float32, 2)
		b := backend(t)
		store := newStore(t, b, tc.net, tc.x, 5)
		memStore := clone(t, store)
		cfg := testConfig(t, 8<<20)
		// The faults hit the gradient store and the optimizer's records
		// during the backward: the gradients take their NVMe round trip.
		cfg.Zinf.PinnedGrads = config.PinnedGradsOff
		inj := newInjector()
		tr, err := zgomlx.Create(ctx, b, cfg, store, tc.net, zgomlx.Options{OneLayerResident: one, Runtime: zinf.Options{Faults: inj, SerialStep: c.serial}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		mt, err := reference.NewMemoryTrainer(b, memStore, tc.net, cfg, zgomlx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer mt.Close()
		step := func(i int) {
			t.Helper()
			stepWithMemory(ctx, t, tc, tr, mt, i)
		}
		step(0)
		step(1)
		// Step 2 fails.
		inj.Add(c.rule)
		x, y := tc.batch(2)
		_, err = tr.Step(ctx, x, y)
		if c.transient {
			if err != nil || inj.Hits() == 0 {
				t.Fatalf("a write that failed once: %v (%d faults fired)", err, inj.Hits())
			}
			inj.Clear()
			if _, err := mt.Step(ctx, x, y); err != nil {
				t.Fatal(err)
			}
			sameModel(ctx, t, "after the step a failed write was redone in", tr, mt, memStore)
			return
		}
		if err == nil {
			t.Fatalf("no error with %s (%d faults fired)", c.name, inj.Hits())
		}
		if inj.Hits() == 0 {
			t.Fatalf("the step failed without the fault firing: %v", err)
		}
		inj.Clear()
		if c.rule.Err == syscall.ENOSPC && !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, aio.ErrNoSpace) {
			t.Fatalf("not ENOSPC: %v", err)
		}
		t.Logf("step 2 failed: %v", err)
		if c.serial != errors.Is(err, zgomlx.ErrCommitPending) || c.serial == errors.Is(err, zgomlx.ErrStepAborted) {
			t.Fatalf("serial step %v, but the error is %v", c.serial, err)
		}
		sameModel(ctx, t, "after the failed step", tr, mt, memStore)
		if errors.Is(err, zgomlx.ErrCommitPending) {
			if _, err := tr.Step(ctx, x, y); !errors.Is(err, zgomlx.ErrCommitPending) {
				t.Fatalf("a new step with a commit pending: %v", err)
			}
			if err := tr.Commit(ctx); err != nil {
				t.Fatalf("retried commit: %v", err)
			}
		} else if _, err := tr.Step(ctx, x, y); err != nil {
			t.Fatalf("step 2 again: %v", err)
		}
		if _, err := mt.Step(ctx, x, y); err != nil {
			t.Fatal(err)
		}
		sameModel(ctx, t, "after the retry", tr, mt, memStore)
		step(3)
		step(4)
		sameModel(ctx, t, "two steps later", tr, mt, memStore)
	})
}
