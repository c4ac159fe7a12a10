package zgomlx_test

import (
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// TestTimingsCompute: Timings().Compute is the executors' run time: zero
// before anything ran, growing with every step and evaluation, and never
// more than the wall time of the calls that ran them.
func TestTimingsCompute(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	net := mlpNet(64, 64, 8)
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(3))
	tr, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), store, net, zgomlx.Options{}, shapes.Make(dtypes.Float32, 16, 32))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if c := tr.Timings().Compute; c != 0 {
		t.Fatalf("Compute %v before any step (want 0)", c)
	}
	var wall, last time.Duration
	for i := range 3 {
		x, y := mlpBatch(i, 16, 32, 8)
		t0 := time.Now()
		if _, err := tr.Step(ctx, x, y); err != nil {
			t.Fatal(err)
		}
		wall += time.Since(t0)
		c := tr.Timings().Compute
		if c <= last {
			t.Fatalf("step %d: Compute %v, not more than %v before it", i, c, last)
		}
		if c > wall {
			t.Fatalf("step %d: Compute %v exceeds the steps' wall time %v", i, c, wall)
		}
		last = c
		checkLayerCompute(t, tr.Timings(), len(net.Layers))
	}
	x, y := mlpBatch(9, 16, 32, 8)
	t0 := time.Now()
	if _, err := tr.EvalLoss(ctx, x, y); err != nil {
		t.Fatal(err)
	}
	wall += time.Since(t0)
	if c := tr.Timings().Compute; c <= last || c > wall {
		t.Fatalf("after EvalLoss: Compute %v (before %v, wall of all calls %v)", c, last, wall)
	}
}

// checkLayerCompute: LayerCompute has one entry per layer, each layer's
// time is positive (every layer ran forward and backward), and together
// they are at most Compute (the loss is in Compute only).
func checkLayerCompute(t *testing.T, tm zgomlx.Timings, layers int) {
	t.Helper()
	if len(tm.LayerCompute) != layers {
		t.Fatalf("LayerCompute has %d entries for %d layers", len(tm.LayerCompute), layers)
	}
	var sum time.Duration
	for l, d := range tm.LayerCompute {
		if d <= 0 {
			t.Fatalf("LayerCompute[%d] = %v after a step (want > 0)", l, d)
		}
		sum += d
	}
	if sum > tm.Compute {
		t.Fatalf("LayerCompute sums to %v, more than Compute %v", sum, tm.Compute)
	}
}

// TestMemoryTrainerTimings: MemoryTrainer.Timings counts its executors'
// compute as the Trainer's does (zero before a step, growing, within the
// wall time, one entry per layer), and times none of zinf's calls.
func TestMemoryTrainerTimings(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	net := mlpNet(64, 64, 8)
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(3))
	if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Float32, 16, 32)); err != nil {
		t.Fatal(err)
	}
	mt, err := reference.NewMemoryTrainer(b, store, net, testConfig(t, 8<<20), zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	if c := mt.Timings().Compute; c != 0 {
		t.Fatalf("Compute %v before any step (want 0)", c)
	}
	var wall, last time.Duration
	for i := range 2 {
		x, y := mlpBatch(i, 16, 32, 8)
		t0 := time.Now()
		if _, err := mt.Step(ctx, x, y); err != nil {
			t.Fatal(err)
		}
		wall += time.Since(t0)
		tm := mt.Timings()
		if tm.Compute <= last || tm.Compute > wall {
			t.Fatalf("step %d: Compute %v (before %v, wall of the steps %v)", i, tm.Compute, last, wall)
		}
		if tm.SwapIn != 0 || tm.Grads != 0 || tm.StepLayer != 0 || tm.Commit != 0 {
			t.Fatalf("step %d: zinf's calls timed in memory: %+v", i, tm)
		}
		last = tm.Compute
		checkLayerCompute(t, tm, len(net.Layers))
	}
}
