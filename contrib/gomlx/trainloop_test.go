package zgomlx_test

import (
	"bytes"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// lmDataset is a GoMLX train.Dataset of n lmBatch batches from first.
type lmDataset struct {
	name     string
	first, n int
	vocab    int
}

func (d lmDataset) Name() string { return d.name }

func (d lmDataset) Iter() iter.Seq2[train.Batch, error] {
	return func(yield func(train.Batch, error) bool) {
		for i := range d.n {
			x, y := lmBatch(d.first+i, zooBatch, zooSeq, d.vocab)
			if !yield(train.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}, nil) {
				return
			}
		}
	}
}

// TestLoopDrivesTrainer: zgomlx.Loop runs the zoo transformer over a
// GoMLX Dataset with GoMLX's habits: a global step, OnStep hooks by
// priority, a progress line per step, evaluation and checkpoints every n
// steps and at the end; its losses are the whole-graph reference's, and
// the checkpoint resumes at the loop's step with the trained weights.
func TestLoopDrivesTrainer(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	b := backend(t)
	cfg := testConfig(t, 8<<20)
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(zooModel(store, dtypes.Float32), zgomlx.TransformerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	xs := shapes.Make(dtypes.Int32, zooBatch, zooSeq)
	tr, wg, whole := offloadedAndWhole(ctx, t, b, cfg, store, net, xs)

	ds := lmDataset{name: "train", n: 3, vocab: zooVocab} // RunSteps(5) starts it again after 3
	evalDS := lmDataset{name: "held-out", first: 50, n: 2, vocab: zooVocab}
	loop := zgomlx.NewLoop(tr)
	var progress bytes.Buffer
	loop.Progress(&progress)
	var order []string
	var evals []int
	loop.EvalEvery(ctx, 2, evalDS, func(l *zgomlx.Loop, loss float32) error {
		evals = append(evals, l.LoopStep)
		return nil
	})
	dir := t.TempDir() + "/ckpt"
	loop.CheckpointEvery(ctx, 2, dir)
	step := 0
	loop.OnStep("reference", 50, func(l *zgomlx.Loop, loss float32) error {
		order = append(order, "reference")
		x, y := lmBatch(step%3, zooBatch, zooSeq, zooVocab)
		step++
		lw, err := wg.Step(x, y)
		if err != nil {
			return err
		}
		if lw != loss {
			t.Errorf("step %d: loss %v in the loop, %v whole graph", l.LoopStep, loss, lw)
		}
		return nil
	})
	loop.OnStep("after progress", 150, func(*zgomlx.Loop, float32) error { order = append(order, "after"); return nil })
	if _, err := loop.RunSteps(ctx, ds, 5); err != nil {
		t.Fatal(err)
	}
	if loop.LoopStep != 5 || strings.Count(progress.String(), "\n") != 5 || !strings.Contains(progress.String(), "step 5/5  loss") {
		t.Fatalf("global step %d, progress:\n%s", loop.LoopStep, progress.String())
	}
	if strings.Join(order[:2], ",") != "reference,after" {
		t.Fatalf("hooks ran in the order %v", order)
	}
	if len(evals) != 3 || evals[0] != 2 || evals[1] != 4 || evals[2] != 5 {
		t.Fatalf("evaluated at steps %v, want 2, 4, 5", evals)
	}
	sameVars(ctx, t, tr.Offload(), whole)

	// The checkpoint resumes at step 5 with the trained weights.
	again := model.NewStore()
	againNet, err := zgomlx.TransformerNet(zooModel(again, dtypes.Float32), zgomlx.TransformerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr2, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), again, againNet, zgomlx.Options{}, xs)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	at, err := tr2.Offload().LoadCheckpoint(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if at != 5 {
		t.Fatalf("checkpoint at step %d, want 5", at)
	}
	sameVars(ctx, t, tr2.Offload(), whole)
	if _, err := loop.RunSteps(ctx, ds, 0); err == nil || !strings.Contains(err.Error(), "steps 0") {
		t.Fatalf("RunSteps(0): %v", err)
	}
}

// TestLoopMicroBatches: with gradient_accumulation_steps 3 and
// zinf.schedule layer-major, zgomlx.Loop takes three consecutive batches
// of the Dataset per step (starting it again in the middle of a step when
// it ends) and trains them layer-major, the layer inputs through zinf's
// activation tier; each step's loss is the mean of its micro-batches',
// and the model is in-memory training's (Accumulate, Accumulate, Step)
// bit for bit.
func TestLoopMicroBatches(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	b := backend(t)
	cfg := testConfig(t, 8<<20)
	cfg.GradientAccumulationSteps = 3
	cfg.Zinf.Schedule = config.ScheduleLayerMajor
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(zooModel(store, dtypes.Float32), zgomlx.TransformerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, zooBatch, zooSeq)); err != nil {
		t.Fatal(err)
	}
	memStore := clone(t, store)
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	mt, err := reference.NewMemoryTrainer(b, memStore, net, cfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()

	loop := zgomlx.NewLoop(tr)
	var got []float32
	loop.OnStep("losses", 50, func(_ *zgomlx.Loop, loss float32) error { got = append(got, loss); return nil })
	ds := lmDataset{name: "train", n: 4, vocab: zooVocab} // step 2 takes batches 3, 0, 1
	if _, err := loop.RunSteps(ctx, ds, 2); err != nil {
		t.Fatal(err)
	}
	if loop.LoopStep != 2 || len(got) != 2 {
		t.Fatalf("global step %d, %d losses", loop.LoopStep, len(got))
	}
	for step, ids := range [][]int{{0, 1, 2}, {3, 0, 1}} {
		var sum float64
		for m, i := range ids {
			x, y := lmBatch(i, zooBatch, zooSeq, zooVocab)
			var lo float32
			if m < 2 {
				lo, err = mt.Accumulate(ctx, x, y)
			} else {
				lo, err = mt.Step(ctx, x, y)
			}
			if err != nil {
				t.Fatal(err)
			}
			sum += float64(lo)
		}
		if want := float32(sum / 3); got[step] != want {
			t.Fatalf("step %d: loss %v in the loop, %v in memory", step+1, got[step], want)
		}
	}
	sameVars(ctx, t, tr.Offload(), memStore)
	if a := tr.ActivationStats(); a.Saved == 0 || a.Loaded != a.Saved {
		t.Fatalf("the activation tier saved %d entries, loaded %d: the steps did not run layer-major", a.Saved, a.Loaded)
	}
}
