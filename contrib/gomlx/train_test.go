package zgomlx_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/plan"
)

// TestPerLayerGradientsEqualWholeGraph: the per-layer executors
// (recompute + vector-Jacobian product, layer by layer) give every
// variable's gradient bit for bit as the whole model in one graph does,
// for a deep MLP and a transformer, in fp32 and bf16.
func TestPerLayerGradientsEqualWholeGraph(t *testing.T) {
	type tc struct {
		name  string
		net   zgomlx.Net
		x     shapes.Shape
		batch func() (x, y *tensors.Tensor)
	}
	cases := []tc{
		{"mlp", mlpNet(33, 64, 17, 5), shapes.Make(dtypes.Float32, 6, 9), func() (x, y *tensors.Tensor) { return mlpBatch(1, 6, 9, 5) }},
	}
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16} {
		cases = append(cases, tc{"lm-" + dt.String(), lmNet(23, 8, 16, 2, 2, dt), shapes.Make(dtypes.Int32, 3, 8), func() (x, y *tensors.Tensor) { return lmBatch(1, 3, 8, 23) }})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := watchdog(t, 2*time.Minute)
			noFusionForHalf(t, c.name)
			b := backend(t)
			store := newStore(t, b, c.net, c.x, 3)
			x, y := c.batch()
			wantLoss, want, err := reference.WholeGraphGradients(b, clone(t, store), c.net, nil, x, y)
			if err != nil {
				t.Fatal(err)
			}
			mt, err := reference.NewMemoryTrainer(b, store, c.net, testConfig(t, 8<<20), zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer mt.Close()
			loss, got, err := mt.Gradients(ctx, x, y)
			if err != nil {
				t.Fatal(err)
			}
			if loss != wantLoss {
				t.Errorf("loss %v per layer, %v whole", loss, wantLoss)
			}
			if len(got) != len(want) || len(got) == 0 {
				t.Fatalf("%d gradients per layer, %d whole", len(got), len(want))
			}
			for name, w := range want {
				sameBits(t, fmt.Sprintf("gradient of %s", name), got[name], w)
			}
		})
	}
}

// trainCase is a model, its input shape and its batches.
type trainCase struct {
	name  string
	net   zgomlx.Net
	x     shapes.Shape
	batch func(step int) (x, y *tensors.Tensor)
	bf16  bool // zinf stores bf16 params (the Store's dtype is bf16 too)
}

func lmCase(dt dtypes.DType, blocks int) trainCase {
	const vocab, seq, batch = 29, 8, 4
	return trainCase{name: "lm-" + dt.String(), net: lmNet(vocab, seq, 16, 2, blocks, dt), x: shapes.Make(dtypes.Int32, batch, seq),
		batch: func(step int) (x, y *tensors.Tensor) { return lmBatch(step, batch, seq, vocab) }, bf16: dt == dtypes.BFloat16}
}

func mlpCase() trainCase {
	return trainCase{name: "mlp", net: mlpNet(48, 31, 64, 7), x: shapes.Make(dtypes.Float32, 5, 11),
		batch: func(step int) (x, y *tensors.Tensor) { return mlpBatch(step, 5, 11, 7) }}
}

// TestOffloadedEqualsInMemory trains the same model offloaded (params and
// Adam states on NVMe through a small pinned pool) and in memory (same
// executors, zinf's Adam in Go): every loss, and at the end every
// parameter, master weight and Adam moment, is equal bit for bit — for
// fp32 params, and bf16 params with fp32 masters. A whole-graph GoMLX
// trainer with zinf's Adam as its optimizer lands on the same bits.
func TestOffloadedEqualsInMemory(t *testing.T) {
	for _, c := range []trainCase{mlpCase(), lmCase(dtypes.Float32, 2), lmCase(dtypes.BFloat16, 2)} {
		t.Run(c.name, func(t *testing.T) {
			ctx := watchdog(t, 3*time.Minute)
			noFusionForHalf(t, c.name)
			b := backend(t)
			const steps = 6
			store := newStore(t, b, c.net, c.x, 11)
			memStore, wholeStore := clone(t, store), clone(t, store)
			cfg := testConfig(t, 8<<20)
			cfg.BF16 = c.bf16
			tr, err := zgomlx.Create(ctx, b, cfg, store, c.net, zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			mt, err := reference.NewMemoryTrainer(b, memStore, c.net, cfg, zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer mt.Close()
			wg, err := reference.NewWholeGraph(b, wholeStore, c.net, reference.Adam(plan.Hyper(cfg)))
			if err != nil {
				t.Fatal(err)
			}
			defer wg.Close()
			for step := range steps {
				x, y := c.batch(step)
				lo, err := tr.Step(ctx, x, y)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				lm, err := mt.Step(ctx, x, y)
				if err != nil {
					t.Fatal(err)
				}
				lw, err := wg.Step(x, y)
				if err != nil {
					t.Fatal(err)
				}
				if lo != lm || lw != lm {
					t.Fatalf("step %d: loss offloaded %v, in memory %v, whole graph %v", step, lo, lm, lw)
				}
			}
			off := tr.Offload()
			for _, v := range off.Vars() {
				got, err := off.ReadVariable(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				sameBytes(t, v.Name, valueBytes(t, got), valueBytes(t, memStore.GetVariable(v.Name).MustValue()))
				sameBytes(t, v.Name+" (whole graph)", valueBytes(t, got), valueBytes(t, wholeStore.GetVariable(v.Name).MustValue()))
				master, m, sq, err := off.Runtime().ReadOptimizerState(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				wm, wmm, wsq, err := mt.State(v.Name)
				if err != nil {
					t.Fatal(err)
				}
				sameBits(t, v.Name+" master", master, wm)
				sameBits(t, v.Name+" exp_avg", m, wmm)
				sameBits(t, v.Name+" exp_avg_sq", sq, wsq)
			}
			if tr.ParamReads() == 0 || off.Runtime().Metrics().BytesRead == 0 {
				t.Fatal("nothing was read from NVMe")
			}
		})
	}
}

// TestStorageDTypeAndMicroSteps: float32 variables stored by zinf as bf16
// (swapped in converted, no Go heap buffer), and steps of three
// micro-steps (Accumulate, Accumulate, Step): offloaded training equals
// in-memory training, which rounds its parameters through bf16 the same
// way and accumulates gradients in the same order, bit for bit.
func TestStorageDTypeAndMicroSteps(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	c := lmCase(dtypes.Float32, 1)
	b := backend(t)
	store := newStore(t, b, c.net, c.x, 17)
	memStore := clone(t, store)
	cfg := testConfig(t, 8<<20)
	cfg.BF16 = true // zinf's param dtype; the Store's variables stay float32
	tr, err := zgomlx.Create(ctx, b, cfg, store, c.net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	mt, err := reference.NewMemoryTrainer(b, memStore, c.net, cfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	if dt := tr.Offload().Runtime().DType; dt.String() != "bf16" {
		t.Fatalf("zinf stores %s", dt)
	}
	for step := range 3 {
		for micro := range 3 {
			x, y := c.batch(3*step + micro)
			var lo, lm float32
			if micro < 2 {
				lo, err = tr.Accumulate(ctx, x, y)
				if err == nil {
					lm, err = mt.Accumulate(ctx, x, y)
				}
			} else {
				lo, err = tr.Step(ctx, x, y)
				if err == nil {
					lm, err = mt.Step(ctx, x, y)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if lo != lm {
				t.Fatalf("step %d micro-step %d: loss %v offloaded, %v in memory", step, micro, lo, lm)
			}
		}
	}
	sameModel(ctx, t, "after 3 steps of 3 micro-steps", tr, mt, memStore)
	// The parameters are bf16 values widened to float32.
	v, err := tr.Offload().ReadVariable(ctx, "/block_0/fc1/dense/weights")
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range asFloat32s(t, v) {
		if math.Float32bits(w)&0xffff != 0 {
			t.Fatalf("element %d = %v is not a bf16 value", i, w)
		}
	}
}

// TestCreateLayerByLayer: Create makes a transformer's variables and
// initializes them one layer at a time straight into zinf (the Store
// keeps the shapes only); layers of the same shapes get different values
// (each its own seed), the same seed gives the same values again, and
// the model trains bit for bit as in memory from those values.
func TestCreateLayerByLayer(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	c := lmCase(dtypes.Float32, 2)
	b := backend(t)
	create := func() *zgomlx.Trainer {
		store := model.NewStore()
		store.SetParam(model.ParamInitialSeed, int64(12))
		tr, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), store, c.net, zgomlx.Options{}, c.x)
		if err != nil {
			t.Fatal(err)
		}
		for v := range store.IterVariables() {
			if v.Trainable && v.HasValue() {
				t.Fatalf("%s has a value in the Store after Create", v.Path())
			}
		}
		return tr
	}
	tr := create()
	defer tr.Close()
	again := create()
	defer again.Close()
	off := tr.Offload()
	w0, err := off.ReadVariable(ctx, "/block_0/fc1/dense/weights")
	if err != nil {
		t.Fatal(err)
	}
	w1, err := off.ReadVariable(ctx, "/block_1/fc1/dense/weights")
	if err != nil {
		t.Fatal(err)
	}
	if string(valueBytes(t, w0)) == string(valueBytes(t, w1)) {
		t.Fatal("two blocks got the same initial weights")
	}
	for _, v := range off.Vars() {
		a, err := off.ReadVariable(ctx, v.Name)
		if err != nil {
			t.Fatal(err)
		}
		bb, err := again.Offload().ReadVariable(ctx, v.Name)
		if err != nil {
			t.Fatal(err)
		}
		sameBytes(t, v.Name+" created twice from one seed", valueBytes(t, a), valueBytes(t, bb))
	}
	// The in-memory reference starts from the created values.
	if err := off.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	memStore := clone(t, off.Store())
	mt, err := reference.NewMemoryTrainer(b, memStore, c.net, testConfig(t, 8<<20), zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	for i := range 3 {
		x, y := c.batch(i)
		lo, err := tr.Step(ctx, x, y)
		if err != nil {
			t.Fatal(err)
		}
		if lm, _ := mt.Step(ctx, x, y); lm != lo {
			t.Fatalf("step %d: loss %v offloaded, %v in memory", i, lo, lm)
		}
	}
	sameModel(ctx, t, "after 3 steps", tr, mt, memStore)
}
