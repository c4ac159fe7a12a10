package zgomlx_test

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// TestOverlapUpdate trains a transformer with zinf.overlap_update, the
// whole update after the backward pass (clipping, speculation off), so
// that each step's update runs on under the next step's forward: every
// loss, variable, master and moment equals in-memory training bit for
// bit. Then a step's update fails after its Step returned (ENOSPC under
// its parameter writes): the next Step returns ErrCommitPending with
// nothing of the failed step committed, Commit retries it, the next step
// runs again, and the model is again in-memory training's, bit for bit.
func TestOverlapUpdate(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	tc := lmCase(dtypes.Float32, 2)
	b := backend(t)
	store := newStore(t, b, tc.net, tc.x, 5)
	memStore := clone(t, store)
	cfg := testConfig(t, 8<<20)
	cfg.GradientClipping = 1e9
	cfg.Zinf.Speculate = config.SpeculateNever
	cfg.Zinf.OverlapUpdate = true
	inj := newInjector()
	tr, err := zgomlx.Create(ctx, b, cfg, store, tc.net, zgomlx.Options{Runtime: zinf.Options{Faults: inj}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	rt := tr.Offload().Runtime()
	if !rt.OverlapUpdate() {
		t.Fatalf("zinf.overlap_update is set but the runtime does not overlap (plan: overlap step %v)", rt.Placement().OverlapStep)
	}
	// The in-memory reference does not clip; a threshold that never
	// triggers leaves the gradients as they are (factor 1).
	memCfg := *cfg
	memCfg.GradientClipping = 0
	mt, err := reference.NewMemoryTrainer(b, memStore, tc.net, &memCfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	step := func(i int) {
		t.Helper()
		stepWithMemory(ctx, t, tc, tr, mt, i)
		if !rt.LastStep().Overlapped {
			t.Fatalf("step %d did not overlap: %+v", i, rt.LastStep())
		}
	}
	step(0)
	step(1)
	sameModel(ctx, t, "two steps", tr, mt, memStore)
	step(2)
	if err := rt.WaitStep(ctx); err != nil { // step 2's update is done
		t.Fatal(err)
	}
	// Step 3's update fails after Step returned: its optimizer writes are
	// slow, so Step returns first, and a parameter write fails.
	inj.Add(faultRule{Kind: faultWrites, PathContains: filepath.Join("/", "zinf-optim-"), Delay: 20 * time.Millisecond})
	inj.Add(faultRule{Kind: faultWrites, PathContains: filepath.Join("/", "zinf-param-"), Nth: 4, Times: 1, Err: syscall.ENOSPC})
	x3, y3 := tc.batch(3)
	if _, err := tr.Step(ctx, x3, y3); err != nil {
		t.Fatalf("step 3 failed in Step (%d faults fired): the failure should come after it: %v", inj.Hits(), err)
	}
	x4, y4 := tc.batch(4)
	_, err = tr.Step(ctx, x4, y4)
	if !errors.Is(err, zgomlx.ErrCommitPending) || !errors.Is(err, zinf.ErrUpdateFailed) {
		t.Fatalf("step 4 after step 3's update failed (%d faults fired): %v; want ErrCommitPending wrapping zinf.ErrUpdateFailed", inj.Hits(), err)
	}
	t.Logf("step 4: %v", err)
	inj.Clear()
	if _, err := tr.Step(ctx, x4, y4); !errors.Is(err, zgomlx.ErrCommitPending) {
		t.Fatalf("a new step with a commit pending: %v", err)
	}
	if err := tr.Commit(ctx); err != nil {
		t.Fatalf("Commit retrying step 3: %v", err)
	}
	if _, err := mt.Step(ctx, x3, y3); err != nil {
		t.Fatal(err)
	}
	if lo, err := tr.Step(ctx, x4, y4); err != nil {
		t.Fatalf("step 4 again: %v", err)
	} else if lm, _ := mt.Step(ctx, x4, y4); lm != lo {
		t.Fatalf("step 4: loss %v offloaded, %v in memory", lo, lm)
	}
	sameModel(ctx, t, "after the retry", tr, mt, memStore)
	if m := rt.Metrics(); m.Params.Reverted == 0 || m.UpdateWait <= 0 {
		t.Errorf("metrics: %d tensors put back, update wait %v", m.Params.Reverted, m.UpdateWait)
	}
}
