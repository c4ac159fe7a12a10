package zgomlx_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/plan"
)

// TestOneLayerResident: with Options.OneLayerResident a Trainer swaps a
// layer in only after the layer before it computed and hands a layer's
// gradients over before the next backward runs. Trained that way, the zoo
// transformer with tied embeddings (its table read by rows) and an MLP
// chain give in-memory training's bits — every loss, and after the steps
// every parameter, master and Adam moment — with Step (k = 1) and with
// StepMicroBatches of k = 3 in both orders; the swap-in buffers hold one
// layer where the overlapped Trainer holds two (the MLP chain's layers
// share a shape: exactly half).
func TestOneLayerResident(t *testing.T) {
	for _, mk := range []func(*testing.T) schedCase{tiedZooCase, func(*testing.T) schedCase { return mlpChainCase() }} {
		c := mk(t)
		t.Run(c.name, func(t *testing.T) {
			ctx := watchdog(t, 6*time.Minute)
			b := backend(t)
			init := c.store(t, b)
			one := c.opts
			one.OneLayerResident = true
			for _, run := range []struct {
				k     int
				sched config.ScheduleMode
			}{{1, config.ScheduleMicroBatchMajor}, {3, config.ScheduleLayerMajor}, {3, config.ScheduleMicroBatchMajor}} {
				what := fmt.Sprintf("k=%d %s", run.k, run.sched)
				cfg := c.config(t, run.k, run.sched)
				serial, err := zgomlx.Create(ctx, b, cfg, clone(t, init), c.net, one)
				if err != nil {
					t.Fatal(err)
				}
				defer serial.Close()
				overlap, err := zgomlx.Create(ctx, b, c.config(t, run.k, run.sched), clone(t, init), c.net, c.opts)
				if err != nil {
					t.Fatal(err)
				}
				defer overlap.Close()
				memStore := clone(t, init)
				mt, err := reference.NewMemoryTrainer(b, memStore, c.net, cfg, zgomlx.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer mt.Close()
				for step := range 2 {
					mbs := c.microBatches(step, run.k)
					var lS, lO []float32
					if run.k == 1 {
						s, err := serial.Step(ctx, mbs[0].Inputs[0], mbs[0].Labels[0])
						if err != nil {
							t.Fatalf("%s step %d, one layer resident: %v", what, step, err)
						}
						o, err := overlap.Step(ctx, mbs[0].Inputs[0], mbs[0].Labels[0])
						if err != nil {
							t.Fatalf("%s step %d, overlapped: %v", what, step, err)
						}
						lS, lO = []float32{s}, []float32{o}
					} else {
						if lS, err = serial.StepMicroBatches(ctx, mbs); err != nil {
							t.Fatalf("%s step %d, one layer resident: %v", what, step, err)
						}
						if lO, err = overlap.StepMicroBatches(ctx, mbs); err != nil {
							t.Fatalf("%s step %d, overlapped: %v", what, step, err)
						}
					}
					lMem := stepMemory(ctx, t, mt, mbs)
					sameLosses(t, fmt.Sprintf("%s step %d one layer resident", what, step), lS, lMem)
					sameLosses(t, fmt.Sprintf("%s step %d overlapped", what, step), lO, lMem)
				}
				sameModel(ctx, t, what+" one layer resident", serial, mt, memStore)
				sameModel(ctx, t, what+" overlapped", overlap, mt, memStore)
				// Evaluation runs the same loop.
				x, y := c.batch(99)
				eS, err := serial.EvalLoss(ctx, x, y)
				if err != nil {
					t.Fatal(err)
				}
				eO, err := overlap.EvalLoss(ctx, x, y)
				if err != nil {
					t.Fatal(err)
				}
				sameLosses(t, what+" evaluation", []float32{eS}, []float32{eO})
				s, o := serial.SwapBufferBytes(), overlap.SwapBufferBytes()
				t.Logf("%s: swap-in buffers %d bytes one layer resident, %d overlapped", what, s, o)
				if s <= 0 || s >= o {
					t.Fatalf("%s: swap-in buffers %d bytes with one layer resident, %d overlapped (want fewer)", what, s, o)
				}
				if c.rows == "" && 2*s != o {
					t.Fatalf("%s: swap-in buffers %d bytes with one layer resident, %d overlapped: the chain's layers share a shape, want exactly half", what, s, o)
				}
			}
		})
	}
}

// TestOneLayerResidentBlockedHead: the zoo transformer with its tied head
// in blocks (bench-llm-big's shape, small) trains with OneLayerResident
// bit for bit as the whole graph, and its swap-in buffers hold less than
// the overlapped Trainer's.
func TestOneLayerResidentBlockedHead(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	const vocab, rows = 20000, 4096
	cfg := testConfig(t, 64<<20)
	cfg.ZeroOptimization.SubGroupSize = 65_536
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(bigVocabModel(store, vocab), zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	xs := shapes.Make(dtypes.Int32, 2, 8)
	if _, err := zgomlx.Initialize(b, store, net, xs); err != nil {
		t.Fatal(err)
	}
	whole := clone(t, store)
	overlapStore := clone(t, store)
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{OneLayerResident: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	wg, err := reference.NewWholeGraph(b, whole, net, reference.Adam(plan.Hyper(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Close()
	batch := func(step int) (x, y *tensors.Tensor) { return repeatBatch(step, vocab) }
	stepBoth(ctx, t, tr, wg, 3, "one layer resident, the head in blocks", batch)
	sameVars(ctx, t, tr.Offload(), whole)

	cfg2 := testConfig(t, 64<<20)
	cfg2.ZeroOptimization.SubGroupSize = 65_536
	ov, err := zgomlx.Create(ctx, b, cfg2, overlapStore, net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ov.Close()
	for step := range 3 {
		x, y := batch(step)
		if _, err := ov.Step(ctx, x, y); err != nil {
			t.Fatal(err)
		}
	}
	s, o := tr.SwapBufferBytes(), ov.SwapBufferBytes()
	t.Logf("swap-in buffers %d bytes one layer resident, %d overlapped", s, o)
	if s >= o {
		t.Fatalf("swap-in buffers %d bytes with one layer resident, %d overlapped (want fewer)", s, o)
	}
}
