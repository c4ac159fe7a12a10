package zgomlx_test

import (
	"iter"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/plan"
)

// countingDataset counts the batches a Loop takes from it.
type countingDataset struct {
	lmDataset
	taken *int
}

func (d countingDataset) Iter() iter.Seq2[train.Batch, error] {
	return func(yield func(train.Batch, error) bool) {
		for b, err := range d.lmDataset.Iter() {
			*d.taken++
			if !yield(b, err) {
				return
			}
		}
	}
}

// TestLoopAutoMicroBatches: under gradient_accumulation_steps "auto"
// zgomlx.Loop runs its first AutoMeasureSteps steps at the plan's k (two
// while the compute is not known), then takes the planner's k at the
// compute its executors took in each pass of the last of them, per layer
// and micro-batch (zinf.Runtime.MicroBatchesToHideIOPasses: layer-major,
// each pass's compute covering its own I/O); a Loop told its
// MicroBatches keeps them.
func TestLoopAutoMicroBatches(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	b := backend(t)
	cfg := testConfig(t, 8<<20)
	cfg.GradientAccumulationAuto = true // "gradient_accumulation_steps": "auto"
	// A slow disk for the prediction (the swaps run at the real one's
	// speed), so that the I/O takes a few micro-batches to hide.
	cfg.Zinf.Bandwidth.ReadBytesPerSec, cfg.Zinf.Bandwidth.WriteBytesPerSec = 64<<20, 32<<20
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(zooModel(store, dtypes.Float32), zgomlx.TransformerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, zooBatch, zooSeq)); err != nil {
		t.Fatal(err)
	}
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	rt := tr.Offload().Runtime()
	loop := zgomlx.NewLoop(tr)
	if k := loop.MicroBatchesPerStep(); k != plan.AutoMicroBatchesUnmeasured || rt.MicroBatches() != k {
		t.Fatalf("before a step: %d micro-batches, runtime %d; want %d", k, rt.MicroBatches(), plan.AutoMicroBatchesUnmeasured)
	}
	// The runtime's compute counters after each step, to find the compute
	// of the last measured step as the loop does.
	var fwds, bwds []time.Duration
	loop.OnStep("counters", 10, func(*zgomlx.Loop, float32) error {
		tm := tr.Timings()
		fwds, bwds = append(fwds, tm.ForwardCompute), append(bwds, tm.BackwardCompute)
		return nil
	})
	if rt.Schedule() != zinf.LayerMajor {
		t.Fatalf("schedule %v, want layer-major (zinf.schedule auto with micro-batches)", rt.Schedule())
	}
	taken := 0
	ds := countingDataset{lmDataset{name: "train", n: 4, vocab: zooVocab}, &taken}
	if _, err := loop.RunSteps(ctx, ds, zgomlx.AutoMeasureSteps); err != nil {
		t.Fatal(err)
	}
	if want := zgomlx.AutoMeasureSteps * plan.AutoMicroBatchesUnmeasured; taken != want {
		t.Fatalf("the first %d steps took %d batches, want %d", zgomlx.AutoMeasureSteps, taken, want)
	}
	n := len(fwds)
	per := time.Duration(plan.AutoMicroBatchesUnmeasured * rt.Layers())
	fwd, bwd := (fwds[n-1]-fwds[n-2])/per, (bwds[n-1]-bwds[n-2])/per
	if fwd <= 0 || bwd <= 0 {
		t.Fatalf("the last measured step's compute per layer and micro-batch: forward %v, backward %v", fwd, bwd)
	}
	want := rt.MicroBatchesToHideIOPasses(fwd, bwd)
	k := loop.MicroBatchesPerStep()
	if !want.Known() || k != want.MicroBatches {
		t.Fatalf("after %d steps: %d micro-batches; want %+v at %v forward, %v backward per layer", zgomlx.AutoMeasureSteps, k, want, fwd, bwd)
	}
	if total := rt.MicroBatchesToHideIO(fwd + bwd); total.MicroBatches > k {
		t.Errorf("k %d by pass below the %d of the passes' sum", k, total.MicroBatches)
	}
	t.Logf("measured %v forward, %v backward per layer and micro-batch: %s", fwd, bwd, want)
	taken = 0
	if _, err := loop.RunSteps(ctx, ds, 1); err != nil {
		t.Fatal(err)
	}
	if taken != k || loop.MicroBatchesPerStep() != k {
		t.Fatalf("the next step took %d batches (k now %d), want %d", taken, loop.MicroBatchesPerStep(), k)
	}

	// A Loop told its micro-batches keeps them, measured or not.
	fixed := zgomlx.NewLoop(tr)
	fixed.MicroBatches = 3
	taken = 0
	if _, err := fixed.RunSteps(ctx, ds, zgomlx.AutoMeasureSteps+1); err != nil {
		t.Fatal(err)
	}
	if taken != 3*(zgomlx.AutoMeasureSteps+1) || fixed.MicroBatchesPerStep() != 3 {
		t.Fatalf("MicroBatches 3: %d batches in %d steps, k %d", taken, zgomlx.AutoMeasureSteps+1, fixed.MicroBatchesPerStep())
	}
}
