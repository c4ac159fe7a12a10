package zgomlx_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/plan"
	zopt "github.com/zinfio/zinf/swapper/optimizer"
)

// lmVocab is the tied zoo transformer's vocabulary in these tests: its
// table (lmVocab x 16 fp32) is larger than lmPiece (the swap store's
// stripe), so zinf streams it and the embedding layer reads it by rows
// (Layer.Lookups).
const lmVocab, lmPiece = 17000, 1 << 20

// schedCase is a model for the schedule tests: a Net, a Store initialized
// for it, and its micro-batches.
type schedCase struct {
	name  string
	net   zgomlx.Net
	store func(t *testing.T, b compute.Backend) *model.Store
	batch func(i int) (x, y *tensors.Tensor)
	opts  zgomlx.Options
	rows  string // a table the embedding layer reads by rows
	tune  func(*config.Config)
}

// tiedZooCase is GoMLX's zoo transformer with tied embeddings (the head
// borrows the token table, which the first layer reads by rows).
func tiedZooCase(t *testing.T) schedCase {
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(9))
	m := transformer.New(store.RootScope()).WithVocabSize(lmVocab).WithEmbedDim(16).WithNumLayers(2).
		WithNumHeads(2).WithHeadDim(8).WithFFNDim(24).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{TieEmbeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	return schedCase{name: "zoo-tied", net: net,
		store: func(t *testing.T, b compute.Backend) *model.Store {
			if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, zooBatch, zooSeq)); err != nil {
				t.Fatal(err)
			}
			return store
		},
		batch: func(i int) (x, y *tensors.Tensor) { return lmBatch(i, zooBatch, zooSeq, lmVocab) },
		opts:  zgomlx.Options{Runtime: zinf.Options{PieceBytes: lmPiece}},
		rows:  "/token_embed/embeddings",
		tune: func(cfg *config.Config) {
			// The streamed table's optimizer pipeline in sub-groups of a
			// quarter piece, as TestEmbeddingRows has it.
			cfg.ZeroOptimization.SubGroupSize = 65_536
			cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
		}}
}

// mlpChainCase is an MLP chain of five layers of one shape: they share
// the Trainer's swap-in buffers, so a layer read in one pass is read
// again in the next.
func mlpChainCase() schedCase {
	const w = 24
	net := mlpNet(w, w, w, w, w)
	return schedCase{name: "mlp", net: net,
		store: func(t *testing.T, b compute.Backend) *model.Store {
			return newStore(t, b, net, shapes.Make(dtypes.Float32, 5, w), 21)
		},
		batch: func(i int) (x, y *tensors.Tensor) { return mlpBatch(i, 5, w, w) }}
}

// microBatches are step's k micro-batches.
func (c schedCase) microBatches(step, k int) []zgomlx.MicroBatch {
	mbs := make([]zgomlx.MicroBatch, k)
	for m := range mbs {
		x, y := c.batch(step*k + m)
		mbs[m] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
	}
	return mbs
}

// config is testConfig with k micro-batches in the given order.
func (c schedCase) config(t *testing.T, k int, sched config.ScheduleMode) *config.Config {
	cfg := testConfig(t, 8<<20)
	cfg.GradientAccumulationSteps = k
	cfg.Zinf.Schedule = sched
	if c.tune != nil {
		c.tune(cfg)
	}
	return cfg
}

// stepMemory runs a step of micro-batches on the in-memory reference:
// Accumulate, ..., Step.
func stepMemory(ctx context.Context, t *testing.T, mt *reference.MemoryTrainer, mbs []zgomlx.MicroBatch) []float32 {
	t.Helper()
	out := make([]float32, len(mbs))
	for m, mb := range mbs {
		var err error
		if m < len(mbs)-1 {
			out[m], err = mt.Accumulate(ctx, mb.Inputs[0], mb.Labels[0])
		} else {
			out[m], err = mt.Step(ctx, mb.Inputs[0], mb.Labels[0])
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sameLosses(t *testing.T, what string, got, want []float32) {
	t.Helper()
	sameBits(t, what+" losses", got, want)
}

// paramBytesRead is what zinf's parameter store read from NVMe so far for
// the schedule: less the prefetched partitions given back before use
// (param.Stats.PreemptedBytes), which are read again. A prefetch whose
// goroutine takes pool memory ahead of an earlier one's on a loaded CPU
// gives way that way (a few runs in a hundred under -race beside three
// busy loops); what the schedule reads does not change.
func paramBytesRead(tr *zgomlx.Trainer) int64 {
	st := tr.Offload().Runtime().Metrics().Params
	return st.BytesRead - st.PreemptedBytes
}

// TestLayerMajorEqualsMicroBatchMajor trains the zoo transformer with
// tied embeddings (its table read by rows) and an MLP chain for steps of
// k = 1 and 3 micro-batches with StepMicroBatches, once with zinf.schedule
// layer-major and once micro-batch-major: every loss, and after the steps
// every parameter, master and Adam moment, equals in-memory training
// (Accumulate, ..., Step) bit for bit; for k = 1 the whole-graph GoMLX
// trainer too, and for k = 3 the first step's masters and moments equal
// zinf's Adam applied to the whole-graph gradients of the three
// micro-batches summed in order (every variable but the tied table, whose
// two uses zinf sums one by one). The NVMe parameter bytes a layer-major step reads are flat
// in k past one (k > 1 reads the last layer again for its backward, to hold its gradients); a
// micro-batch-major step reads them once per micro-batch.
func TestLayerMajorEqualsMicroBatchMajor(t *testing.T) {
	for _, mk := range []func(*testing.T) schedCase{tiedZooCase, func(*testing.T) schedCase { return mlpChainCase() }} {
		c := mk(t)
		t.Run(c.name, func(t *testing.T) {
			ctx := watchdog(t, 6*time.Minute)
			b := backend(t)
			init := c.store(t, b)
			perStep := map[string]int64{}
			for _, k := range []int{1, 3} {
				lmStore, mbStore, memStore, wholeStore, gradStore := clone(t, init), clone(t, init), clone(t, init), clone(t, init), clone(t, init)
				cfgLM := c.config(t, k, config.ScheduleLayerMajor)
				lm, err := zgomlx.Create(ctx, b, cfgLM, lmStore, c.net, c.opts)
				if err != nil {
					t.Fatal(err)
				}
				defer lm.Close()
				mb, err := zgomlx.Create(ctx, b, c.config(t, k, config.ScheduleMicroBatchMajor), mbStore, c.net, c.opts)
				if err != nil {
					t.Fatal(err)
				}
				defer mb.Close()
				if got := lm.Offload().Runtime().Schedule(); got != zinf.LayerMajor {
					t.Fatalf("schedule %s, want layer-major", got)
				}
				if c.rows != "" && !lm.Offload().Runtime().Streamed(c.rows) {
					t.Fatalf("%s is not streamed: nothing is read by rows", c.rows)
				}
				mt, err := reference.NewMemoryTrainer(b, memStore, c.net, cfgLM, zgomlx.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer mt.Close()
				var wg *reference.WholeGraph
				if k == 1 {
					if wg, err = reference.NewWholeGraph(b, wholeStore, c.net, reference.Adam(plan.Hyper(cfgLM))); err != nil {
						t.Fatal(err)
					}
					defer wg.Close()
				}
				const steps = 2
				for step := range steps {
					mbs := c.microBatches(step, k)
					r0, m0 := paramBytesRead(lm), paramBytesRead(mb)
					lLM, err := lm.StepMicroBatches(ctx, mbs)
					if err != nil {
						t.Fatalf("k=%d step %d layer-major: %v", k, step, err)
					}
					lMB, err := mb.StepMicroBatches(ctx, mbs)
					if err != nil {
						t.Fatalf("k=%d step %d micro-batch-major: %v", k, step, err)
					}
					perStep[fmt.Sprintf("layer-major/%d", k)] = paramBytesRead(lm) - r0
					perStep[fmt.Sprintf("micro-batch-major/%d", k)] = paramBytesRead(mb) - m0
					lMem := stepMemory(ctx, t, mt, mbs)
					sameLosses(t, fmt.Sprintf("k=%d step %d layer-major", k, step), lLM, lMem)
					sameLosses(t, fmt.Sprintf("k=%d step %d micro-batch-major", k, step), lMB, lMem)
					if wg != nil {
						lw, err := wg.Step(mbs[0].Inputs[0], mbs[0].Labels[0])
						if err != nil {
							t.Fatal(err)
						}
						sameLosses(t, fmt.Sprintf("k=1 step %d whole graph", step), []float32{lw}, lLM)
					}
					if k > 1 && step == 0 {
						wholeGraphMicroSteps(ctx, t, b, c, gradStore, cfgLM, mbs, lm)
					}
				}
				checkLayerCompute(t, lm.Timings(), len(c.net.Layers))
				checkLayerCompute(t, mb.Timings(), len(c.net.Layers))
				sameModel(ctx, t, fmt.Sprintf("k=%d layer-major", k), lm, mt, memStore)
				sameModel(ctx, t, fmt.Sprintf("k=%d micro-batch-major", k), mb, mt, memStore)
				if wg != nil {
					sameVars(ctx, t, lm.Offload(), wholeStore)
				}
				// Layer-major, a layer's micro-batches go over two at a
				// time (zinf.Runtime.AccumulateGradPair) where k allows.
				if pb := lm.Offload().Runtime().Metrics().Grads.PairedBytes; (k > 1) != (pb > 0) {
					t.Errorf("k=%d: %d gradient bytes handed over in pairs layer-major", k, pb)
				}
				if pb := mb.Offload().Runtime().Metrics().Grads.PairedBytes; pb != 0 {
					t.Errorf("k=%d: %d gradient bytes handed over in pairs micro-batch-major", k, pb)
				}
				if a := lm.ActivationStats(); a.Saved == 0 || a.Loaded != a.Saved {
					t.Fatalf("k=%d: the activation tier saved %d entries and loaded %d", k, a.Saved, a.Loaded)
				}
				if a := mb.ActivationStats(); a.Saved != 0 {
					t.Fatalf("micro-batch-major saved %d activation entries", a.Saved)
				}
			}
			t.Logf("parameter bytes read per step: %v", perStep)
			if c.rows != "" {
				return // the rows read depend on the micro-batches' tokens
			}
			lm1, lm3, mb1, mb3 := perStep["layer-major/1"], perStep["layer-major/3"], perStep["micro-batch-major/1"], perStep["micro-batch-major/3"]
			if lm1 == 0 || mb1 != lm1 {
				t.Fatalf("k=1 reads %d bytes layer-major, %d micro-batch-major (want equal, > 0)", lm1, mb1)
			}
			// Flat in k past one: k > 1 begins the last layer again for its
			// backward (its weights still in their buffers), so that its
			// micro-batches' gradients are summed in pinned memory: one of
			// the chain's five equal layers more than k = 1 reads.
			if r := float64(lm3) / float64(lm1); r < 0.97 || r > 1.25*1.03 {
				t.Errorf("layer-major reads %d bytes per step at k=3, %d at k=1 (%.2fx; want 1..1.25x: at most the last layer more)", lm3, lm1, r)
			}
			// Per micro-batch, every layer but the ones still in the swap-in
			// buffers at the turns of the passes.
			if r := float64(mb3) / float64(lm1); r < 2.4 {
				t.Errorf("micro-batch-major reads %d bytes per step at k=3, %d at k=1 (%.2fx; want about 3x)", mb3, lm1, r)
			}
		})
	}
}

// wholeGraphMicroSteps checks tr's masters after its first step of mbs
// against the whole-graph reference: each micro-batch's gradients from
// the whole Net in one graph (at the initial values in store), summed in
// micro-batch order from +0, and zinf's Adam.
func wholeGraphMicroSteps(ctx context.Context, t *testing.T, b compute.Backend, c schedCase, store *model.Store, cfg *config.Config, mbs []zgomlx.MicroBatch, tr *zgomlx.Trainer) {
	t.Helper()
	sums := map[string][]float32{}
	for _, mb := range mbs {
		_, g, err := reference.WholeGraphGradients(b, clone(t, store), c.net, nil, mb.Inputs[0], mb.Labels[0])
		if err != nil {
			t.Fatal(err)
		}
		for name, gi := range g {
			if sums[name] == nil {
				sums[name] = make([]float32, len(gi))
			}
			s := sums[name]
			for i := range s {
				s[i] = s[i] + gi[i]
			}
		}
	}
	h := plan.Hyper(cfg)
	h.EnsureDefaults()
	checked := 0
	for _, v := range tr.Offload().Vars() {
		if v.Name == c.rows {
			// The tied table: zinf sums its gradient use by use (head,
			// embedding, next micro-batch's head, ...), as micro-batch-major
			// and in-memory training do; one graph adds a micro-batch's two
			// uses first, which rounds differently once k > 1.
			continue
		}
		checked++
		g := sums[v.Name]
		if g == nil {
			t.Fatalf("no whole-graph gradient of %s", v.Name)
		}
		master := asFloat32s(t, store.GetVariable(v.Name).MustValue())
		m, sq := make([]float32, len(master)), make([]float32, len(master))
		zopt.Adam(master, g, m, sq, 1, h)
		got, gm, gsq, err := tr.Offload().Runtime().ReadOptimizerState(ctx, v.Name)
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, v.Name+" master after a step of whole-graph micro-batches", got, master)
		sameBits(t, v.Name+" exp_avg", gm, m)
		sameBits(t, v.Name+" exp_avg_sq", gsq, sq)
	}
	if checked == 0 {
		t.Fatal("no variable checked against the whole graph")
	}
}

// TestLayerMajorActivationTiers runs layer-major steps of the tied zoo
// transformer with the activation tier in memory, in pinned memory and on
// NVMe (zinf.activations.device): each tier holds the layer inputs and
// the tied table's borrowed gradients (its peak), and the models are bit
// for bit the in-memory reference's.
func TestLayerMajorActivationTiers(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	c := tiedZooCase(t)
	init := c.store(t, b)
	const k, steps = 3, 2
	memStore := clone(t, init)
	mt, err := reference.NewMemoryTrainer(b, memStore, c.net, c.config(t, k, config.ScheduleLayerMajor), zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	want := make([][]float32, steps)
	for step := range steps {
		want[step] = stepMemory(ctx, t, mt, c.microBatches(step, k))
	}
	for _, dev := range []config.ActivationsDevice{config.ActivationsMemory, config.ActivationsCPU, config.ActivationsNVMe} {
		t.Run(string(dev), func(t *testing.T) {
			cfg := c.config(t, k, config.ScheduleLayerMajor)
			cfg.Zinf.Activations.Device = dev
			tr, err := zgomlx.Create(ctx, b, cfg, clone(t, init), c.net, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			for step := range steps {
				got, err := tr.StepMicroBatches(ctx, c.microBatches(step, k))
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				sameLosses(t, fmt.Sprintf("step %d", step), got, want[step])
			}
			sameModel(ctx, t, string(dev), tr, mt, memStore)
			a := tr.ActivationStats()
			t.Logf("%s: %+v", dev, a)
			var peak int64
			switch dev {
			case config.ActivationsMemory:
				peak = a.PeakMemoryBytes
			case config.ActivationsCPU:
				peak = a.PeakPinnedBytes
			case config.ActivationsNVMe:
				peak = a.PeakNVMeBytes
				if a.BytesWritten == 0 || a.BytesRead > a.BytesWritten { // an entry loaded while its write is in flight is not read back
					t.Errorf("nvme: %d bytes written, %d read back", a.BytesWritten, a.BytesRead)
				}
			}
			// The layer inputs of k micro-batches of the blocks and the
			// head, zooBatch x zooSeq x 16 fp32 each, are held at once.
			if least := int64(3 * k * zooBatch * zooSeq * 16 * 4); peak < least {
				t.Errorf("%s tier peak %d bytes, want at least %d", dev, peak, least)
			}
			// The head's gradients of the tied table (fp32, one per
			// micro-batch) wait in the tier for the embedding layer's
			// backward pass.
			if table := int64(k * lmVocab * 16 * 4); peak < table {
				t.Errorf("%s tier peak %d bytes, want at least the tied table's %d micro-batch gradients, %d bytes", dev, peak, k, table)
			}
			if a.MemoryBytes+a.PinnedBytes+a.NVMeBytes != 0 || a.Loaded != a.Saved {
				t.Errorf("entries left after the steps: %+v", a)
			}
		})
	}
}

// TestLayerMajorFaultMidStep: a layer-major step whose activation tier's
// disk fills (ENOSPC under its write-behind) or whose parameter swap-in
// fails (EIO) is given up with nothing changed (every parameter, master
// and moment as before it, bit for bit); running it again gives the
// fault-free result, and the steps after it too.
func TestLayerMajorFaultMidStep(t *testing.T) {
	cases := []struct {
		name string
		rule faultRule
	}{
		{"activations-ENOSPC", faultRule{Kind: faultWrites, PathContains: filepath.Join("/", "zinf-act-"), Nth: 2, Err: syscall.ENOSPC}},
		{"param-read-EIO", faultRule{Kind: faultReads, PathContains: filepath.Join("/", "zinf-param-"), Nth: 5, Err: syscall.EIO}},
	}
	b := backend(t)
	c := tiedZooCase(t)
	init := c.store(t, b)
	const k = 3
	for _, fc := range cases {
		t.Run(fc.name, func(t *testing.T) {
			ctx := watchdog(t, 4*time.Minute)
			cfg := c.config(t, k, config.ScheduleLayerMajor)
			cfg.Zinf.Activations.Device = config.ActivationsNVMe
			inj := newInjector()
			opts := c.opts
			opts.Runtime.Faults = inj
			tr, err := zgomlx.Create(ctx, b, cfg, clone(t, init), c.net, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			memStore := clone(t, init)
			mt, err := reference.NewMemoryTrainer(b, memStore, c.net, cfg, zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer mt.Close()
			step := func(i int) {
				t.Helper()
				mbs := c.microBatches(i, k)
				got, err := tr.StepMicroBatches(ctx, mbs)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				sameLosses(t, fmt.Sprintf("step %d", i), got, stepMemory(ctx, t, mt, mbs))
			}
			step(0)
			inj.Add(fc.rule)
			_, err = tr.StepMicroBatches(ctx, c.microBatches(1, k))
			if err == nil || inj.Hits() == 0 {
				t.Fatalf("step 1 with %s: error %v, %d faults fired", fc.name, err, inj.Hits())
			}
			inj.Clear()
			if !errors.Is(err, zgomlx.ErrStepAborted) || !errors.Is(err, fc.rule.Err) && !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("step 1 failed with %v (want ErrStepAborted wrapping %v)", err, fc.rule.Err)
			}
			t.Logf("step 1 failed: %v", err)
			sameModel(ctx, t, "after the failed step", tr, mt, memStore)
			if a := tr.ActivationStats(); a.MemoryBytes+a.PinnedBytes+a.NVMeBytes != 0 {
				t.Fatalf("the failed step left activation entries: %+v", a)
			}
			step(1)
			step(2)
			sameModel(ctx, t, "after the retry and a step", tr, mt, memStore)
		})
	}
}

// blockedHeadCase is the zoo transformer (vocabulary 20000, d=64, one
// block) with its tied head in blocks of 4096 rows of the table (Net.Head;
// the last block 3616 rows, padded), the table the first layer's lookup;
// its micro-batches share some rows (5, 99, vocab-1, ...) and not others.
func blockedHeadCase(t *testing.T) (zgomlx.Net, *model.Store, func(step, k int) []zgomlx.MicroBatch) {
	t.Helper()
	const vocab, rows = 20000, 4096
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(bigVocabModel(store, vocab), zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zgomlx.Initialize(backend(t), store, net, shapes.Make(dtypes.Int32, 2, 8)); err != nil {
		t.Fatal(err)
	}
	mbs := func(step, k int) []zgomlx.MicroBatch {
		out := make([]zgomlx.MicroBatch, k)
		for m := range out {
			x, y := repeatBatch(step*k+m, vocab)
			out[m] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
		}
		return out
	}
	return net, store, mbs
}

// blockedHeadConfig is the config of the blocked-head schedule tests: k
// micro-batches in the given order.
func blockedHeadConfig(t *testing.T, k int, sched config.ScheduleMode) *config.Config {
	cfg := testConfig(t, 64<<20)
	cfg.ZeroOptimization.SubGroupSize = 65_536
	cfg.GradientAccumulationSteps = k
	cfg.Zinf.Schedule = sched
	return cfg
}

// sameTrainers compares two Trainers' variables, masters and Adam moments
// bit for bit.
func sameTrainers(ctx context.Context, t *testing.T, what string, got, want *zgomlx.Trainer) {
	t.Helper()
	for _, v := range want.Offload().Vars() {
		a, err := got.Offload().ReadVariable(ctx, v.Name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		b, err := want.Offload().ReadVariable(ctx, v.Name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		sameBytes(t, what+": "+v.Name, valueBytes(t, a), valueBytes(t, b))
		gm, gmm, gsq, err := got.Offload().Runtime().ReadOptimizerState(ctx, v.Name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		wm, wmm, wsq, err := want.Offload().Runtime().ReadOptimizerState(ctx, v.Name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		sameBits(t, what+": "+v.Name+" master", gm, wm)
		sameBits(t, what+": "+v.Name+" exp_avg", gmm, wmm)
		sameBits(t, what+": "+v.Name+" exp_avg_sq", gsq, wsq)
	}
}

// TestLayerMajorBlockedHead: the zoo transformer with its tied head in
// blocks of the table (Net.Head) trains layer-major — steps of k = 1 and
// 3 micro-batches, the activation tier used — with the losses, every
// parameter, master and Adam moment bit for bit those of micro-batch-major
// training (itself the head written blockwise in one graph's, see
// TestBlockedHead): the table's gradient of the rows the lookups name is
// added in the micro-batch-major order, the rest summed block by block.
// A layer-major step reads the table's blocks once a pass whatever k; a
// micro-batch-major step once a pass and micro-batch. A Net.Head whose
// table is not the first layer's lookup is refused under "layer-major",
// naming the key and the table.
func TestLayerMajorBlockedHead(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	net, init, mbs := blockedHeadCase(t)
	for _, k := range []int{1, 3} {
		lm, err := zgomlx.Create(ctx, b, blockedHeadConfig(t, k, config.ScheduleLayerMajor), clone(t, init), net, zgomlx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer lm.Close()
		mb, err := zgomlx.Create(ctx, b, blockedHeadConfig(t, k, config.ScheduleMicroBatchMajor), clone(t, init), net, zgomlx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer mb.Close()
		var readLM, readMB int64
		for step := range 2 {
			r0, m0 := lm.ParamBytesRead(), mb.ParamBytesRead()
			l1, err := lm.StepMicroBatches(ctx, mbs(step, k))
			if err != nil {
				t.Fatalf("k=%d step %d layer-major: %v", k, step, err)
			}
			l2, err := mb.StepMicroBatches(ctx, mbs(step, k))
			if err != nil {
				t.Fatalf("k=%d step %d micro-batch-major: %v", k, step, err)
			}
			sameLosses(t, fmt.Sprintf("k=%d step %d", k, step), l1, l2)
			readLM, readMB = lm.ParamBytesRead()-r0, mb.ParamBytesRead()-m0
		}
		sameTrainers(ctx, t, fmt.Sprintf("k=%d layer-major against micro-batch-major", k), lm, mb)
		if a := lm.ActivationStats(); k > 1 && a.Saved == 0 {
			t.Fatalf("k=%d: no activation saved: the steps did not run layer-major", k)
		}
		t.Logf("k=%d: parameter bytes copied a step: layer-major %d, micro-batch-major %d", k, readLM, readMB)
		if k == 3 && 2*readLM > readMB {
			t.Fatalf("k=3: layer-major copied %d parameter bytes a step, micro-batch-major %d (want at most half: the table's blocks once a pass, not once a micro-batch)", readLM, readMB)
		}
	}

	// The table read whole by its own layer (no Lookups): refused.
	whole := net
	whole.Layers = slices.Clone(net.Layers)
	whole.Layers[0].Lookups = nil
	tr, err := zgomlx.Create(ctx, b, blockedHeadConfig(t, 2, config.ScheduleLayerMajor), clone(t, init), whole, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	_, err = tr.StepMicroBatches(ctx, mbs(0, 2))
	if err == nil || !strings.Contains(err.Error(), `zinf.schedule "layer-major" with a Net.Head`) || !strings.Contains(err.Error(), "/token_embed/embeddings") {
		t.Fatalf("layer-major with a Net.Head whose table is no lookup: %v", err)
	}
	if a := tr.ActivationStats(); a.Saved != 0 {
		t.Fatalf("the refused step saved %d activation entries", a.Saved)
	}
}

// TestLayerMajorBlockedHeadMemory is the regression test of the Go memory
// a large vocabulary takes: the zoo transformer with a 32768 x 512 fp32
// table (64 MiB) streamed by zinf and read by rows, its tied head in
// blocks of 1024 rows (2 MiB), created and stepped layer-major in steps
// of 2 micro-batches. One Trainer serves both checks below: each needs
// the table's full size, and Create and a step of it are the slowest
// part of the package's tests: it runs under make stress (ZINF_STRESS=1)
// only. Every run checks the lookup's buffer is mapped outside the Go heap
// (TestCreateMakesRowTableBuffersFirst); this one checks what that buys.
//
// The lookup's swap-in buffer has the whole table's shape and lies
// outside the Go heap, so the live Go heap after Create and two steps
// holds less than half the table more than before Create. Made in the
// Go heap (as it was), the buffer alone was the table's size of live
// heap, and the collector let as much garbage again build up before it
// ran.
//
// After those steps (which make the buffers a step reuses) the Go heap,
// sampled through two more steps with the collector run often (GOGC 10),
// never holds half the table more than before them: the head's blocks,
// each micro-batch's logits and their gradient [2, 8, 32768] (1 MiB
// each), the rows the lookups name; nothing of the table's size (its
// gradient, a copy for the head) is made. The swap-in buffers are the
// lookup's one table-shaped buffer (written and resident at the step's
// rows only) and less than a quarter of the table more.
func TestLayerMajorBlockedHeadMemory(t *testing.T) {
	if !testenv.Stress() {
		t.Skipf("a 64 MiB table: scale-sized, runs under make stress (%s=1)", testenv.StressEnv)
	}
	ctx := watchdog(t, 8*time.Minute)
	b := backend(t)
	const vocab, dim, rows, k = 32768, 512, 1024, 2
	const table = vocab * dim * 4
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	heap := func() int64 {
		metrics.Read(sample)
		return int64(sample[0].Value.Uint64())
	}
	live := func() int64 {
		runtime.GC()
		runtime.GC() // the pools' idle buffers (sync.Pool) dropped
		return heap()
	}
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(8))
	m := transformer.New(store.RootScope()).WithVocabSize(vocab).WithEmbedDim(dim).WithNumLayers(1).
		WithNumHeads(4).WithHeadDim(dim / 4).WithFFNDim(dim).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	cfg := blockedHeadConfig(t, k, config.ScheduleLayerMajor)
	cfg.Zinf.Tiers.CPUPinnedBytes = 256 << 20
	created := live()
	// Created straight into zinf: the Store never holds the table.
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, 2, 8))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	step := func(s int) {
		t.Helper()
		mbs := make([]zgomlx.MicroBatch, k)
		for i := range mbs {
			x, y := repeatBatch(s*k+i, vocab)
			mbs[i] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
		}
		if _, err := tr.StepMicroBatches(ctx, mbs); err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
	}

	// The lookup's table-shaped buffer, outside the Go heap.
	step(0)
	step(1)
	stepped := live()
	grow := stepped - created
	t.Logf("live Go heap %d MiB before Create, %d MiB after two steps (%+.1f MiB); the table %d MiB; swap-in buffers %d MiB",
		created>>20, stepped>>20, float64(grow)/(1<<20), table>>20, tr.SwapBufferBytes()>>20)
	if tr.SwapBufferBytes() < table {
		t.Fatalf("swap-in buffers %d MiB: the lookup's table-shaped one (%d MiB) is missing", tr.SwapBufferBytes()>>20, table>>20)
	}
	if grow >= table/2 {
		t.Fatalf("the live Go heap grew %.1f MiB over Create and two steps: half the %d MiB table or more (the lookup's buffer is in the Go heap)",
			float64(grow)/(1<<20), table>>20)
	}

	// Two more steps: nothing of the table's size made in the Go heap.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	before := live()
	var peak atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if h := heap(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	step(2)
	step(3)
	close(stop)
	<-done
	if a := tr.ActivationStats(); a.Saved == 0 {
		t.Fatal("no activation saved: the steps did not run layer-major")
	}
	grow = peak.Load() - before
	t.Logf("Go heap %d MiB before the steps, peak %d MiB (+%.1f MiB); the table %d MiB; swap-in buffers %d MiB",
		before>>20, peak.Load()>>20, float64(grow)/(1<<20), table>>20, tr.SwapBufferBytes()>>20)
	if grow >= table/2 {
		t.Fatalf("the Go heap grew %.1f MiB in two layer-major steps: half the %d MiB table or more", float64(grow)/(1<<20), table>>20)
	}
	if sb := tr.SwapBufferBytes(); sb >= table+table/4 {
		t.Fatalf("swap-in buffers %d MiB: the lookup's %d MiB and more than a quarter of it again", sb>>20, table>>20)
	}
}

// TestLayerMajorOptimizers: what the in-memory reference does not mirror
// — gradient clipping, a learning-rate schedule, bf16 parameters, every
// optimizer rule zinf has — runs in zinf's commit whatever the order, so
// layer-major and micro-batch-major steps of k = 8 micro-batches give
// the same losses, parameters, masters and optimizer states bit for bit.
func TestLayerMajorOptimizers(t *testing.T) {
	b := backend(t)
	c := mlpChainCase()
	init := c.store(t, b)
	const k, steps = 8, 2
	for _, opt := range []config.OptimizerType{config.OptimizerAdamW, config.OptimizerSGD, config.OptimizerAdagrad, config.OptimizerLion} {
		t.Run(string(opt), func(t *testing.T) {
			ctx := watchdog(t, 3*time.Minute)
			var trs []*zgomlx.Trainer
			for _, sched := range []config.ScheduleMode{config.ScheduleLayerMajor, config.ScheduleMicroBatchMajor} {
				cfg := c.config(t, k, sched)
				cfg.Optimizer.Type = opt
				cfg.GradientClipping = 0.05
				cfg.BF16 = true
				cfg.Scheduler.Type = config.SchedulerWarmupLR
				cfg.Scheduler.WarmupNumSteps = 3
				tr, err := zgomlx.Create(ctx, b, cfg, clone(t, init), c.net, c.opts)
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				trs = append(trs, tr)
			}
			for step := range steps {
				mbs := c.microBatches(step, k)
				l0, err := trs[0].StepMicroBatches(ctx, mbs)
				if err != nil {
					t.Fatalf("step %d layer-major: %v", step, err)
				}
				l1, err := trs[1].StepMicroBatches(ctx, mbs)
				if err != nil {
					t.Fatalf("step %d micro-batch-major: %v", step, err)
				}
				sameLosses(t, fmt.Sprintf("step %d", step), l0, l1)
			}
			lm, mb := trs[0].Offload(), trs[1].Offload()
			for _, v := range lm.Vars() {
				got, err := lm.ReadVariable(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				want, err := mb.ReadVariable(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				sameBytes(t, v.Name, valueBytes(t, got), valueBytes(t, want))
				m0, s0, err := lm.Runtime().ReadOptimizerStates(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				m1, s1, err := mb.Runtime().ReadOptimizerStates(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				sameBits(t, v.Name+" master", m0, m1)
				if len(s0) != len(s1) {
					t.Fatalf("%s: %d states layer-major, %d micro-batch-major", v.Name, len(s0), len(s1))
				}
				for i := range s0 {
					sameBits(t, fmt.Sprintf("%s state %d", v.Name, i), s0[i], s1[i])
				}
			}
		})
	}
}

// TestLayerMajorActivationsSpill: under zinf.activations.device auto a
// tight budget spills the layer inputs of a layer-major step from memory
// (memory_bytes: two entries) to pinned memory (cpu_bytes: the NVMe
// staging plus two blocks) to NVMe, all three in one step, and the steps
// are in-memory training's bit for bit.
func TestLayerMajorActivationsSpill(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	c := mlpChainCase()
	init := c.store(t, b)
	const k, steps = 3, 2
	cfg := c.config(t, k, config.ScheduleLayerMajor)
	entry := int64(5 * 24 * 4) // a layer input: batch 5 x 24 fp32
	g := plan.GranuleBytes()
	cfg.Zinf.Activations = config.Activations{Device: config.ActivationsAuto, MemoryBytes: config.Size(2 * entry),
		CPUBytes: config.Size(4*(1<<20) + 2*g)} // 4 MiB: staging for entries of up to 1 MiB
	tr, err := zgomlx.Create(ctx, b, cfg, clone(t, init), c.net, c.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	memStore := clone(t, init)
	mt, err := reference.NewMemoryTrainer(b, memStore, c.net, cfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	for step := range steps {
		mbs := c.microBatches(step, k)
		got, err := tr.StepMicroBatches(ctx, mbs)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		sameLosses(t, fmt.Sprintf("step %d", step), got, stepMemory(ctx, t, mt, mbs))
	}
	sameModel(ctx, t, "activations spilled", tr, mt, memStore)
	a := tr.ActivationStats()
	t.Logf("%+v", a)
	// An entry loaded while its write is in flight comes from its staging,
	// not from the disk.
	if a.PeakMemoryBytes != 2*entry || a.PeakPinnedBytes == 0 || a.PeakNVMeBytes == 0 || a.BytesWritten == 0 || a.BytesRead > a.BytesWritten || a.Loaded != a.Saved {
		t.Fatalf("a tight budget: peak %d bytes in memory (want %d), %d pinned, %d on NVMe (want > 0); %d written, %d read back; %d saved, %d loaded",
			a.PeakMemoryBytes, 2*entry, a.PeakPinnedBytes, a.PeakNVMeBytes, a.BytesWritten, a.BytesRead, a.Saved, a.Loaded)
	}
}
