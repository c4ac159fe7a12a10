package zgomlx_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/plan"
)

const zooVocab, zooSeq, zooBatch = 61, 8, 3

// zooModel is GoMLX's zoo transformer, small: RoPE, layer norms inside
// the blocks and a final RMS norm (a head of two scopes).
func zooModel(store *model.Store, dt dtypes.DType) *transformer.Model {
	store.SetParam(model.ParamInitialSeed, int64(5))
	return transformer.New(store.RootScope()).WithVocabSize(zooVocab).WithEmbedDim(16).WithNumLayers(2).
		WithNumHeads(2).WithHeadDim(8).WithFFNDim(24).WithDType(dt).WithRoPE(10000).
		WithFinalNormalization(layers.NormalizationRMSNorm)
}

// zooLogits is the zoo's own whole model, Model.Logits, as a GoMLX model
// function (a fresh scope per graph, as transformer.MakeNaiveModelFn does).
func zooLogits(m *transformer.Model) func(*model.Scope, []*Node) []*Node {
	return func(_ *model.Scope, ins []*Node) []*Node {
		m.Scope = m.Scope.ResetVisited()
		return []*Node{m.Logits(ins[0], transformer.CallOptions{})}
	}
}

// TestZooTransformerEqualsWholeGraph: GoMLX's zoo transformer, created
// layer by layer in zinf (every weight, master and Adam state on NVMe)
// and trained through its exported pieces, gets the weights the zoo
// creates in memory and trains bit for bit as the zoo's whole model
// (Model.Logits) in one GoMLX graph with the same optimizer: fp32, and
// bf16 weights with fp32 masters.
func TestZooTransformerEqualsWholeGraph(t *testing.T) {
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := watchdog(t, 4*time.Minute)
			noFusionForHalf(t, dt.String())
			b := backend(t)
			cfg := testConfig(t, 8<<20)
			cfg.BF16 = dt == dtypes.BFloat16

			store := model.NewStore()
			net, err := zgomlx.TransformerNet(zooModel(store, dt), zgomlx.TransformerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, zooBatch, zooSeq))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()

			// The zoo in memory: its variables as a forward pass creates
			// and initializes them.
			whole := model.NewStore()
			m := zooModel(whole, dt)
			fwd, err := model.NewExec(b, whole, func(scope *model.Scope, tokens *Node) *Node { return zooLogits(m)(scope, []*Node{tokens})[0] })
			if err != nil {
				t.Fatal(err)
			}
			x0, _ := lmBatch(0, zooBatch, zooSeq, zooVocab)
			if _, err := fwd.Call(x0); err != nil {
				t.Fatal(err)
			}
			fwd.Finalize()
			off := tr.Offload()
			var names []string
			for v := range whole.IterVariables() {
				if v.Trainable {
					names = append(names, v.Path())
				}
			}
			var ours []string
			for _, v := range off.Vars() {
				ours = append(ours, v.Name)
				got, err := off.ReadVariable(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				w := whole.GetVariable(v.Name)
				if w == nil {
					t.Fatalf("zinf holds %q, which the zoo does not create", v.Name)
				}
				sameBytes(t, v.Name+" as created", valueBytes(t, got), valueBytes(t, w.MustValue()))
			}
			slices.Sort(names)
			slices.Sort(ours)
			if !slices.Equal(names, ours) {
				t.Fatalf("zinf holds %v, the zoo creates %v", ours, names)
			}
			if len(ours) < 20 {
				t.Fatalf("only %d variables: %v", len(ours), ours)
			}

			wg, err := reference.NewWholeGraphModel(b, whole, zooLogits(m), zgomlx.TransformerLoss, reference.Adam(plan.Hyper(cfg)))
			if err != nil {
				t.Fatal(err)
			}
			defer wg.Close()
			losses := stepBoth(ctx, t, tr, wg, 4, "offloaded", func(step int) (x, y *tensors.Tensor) {
				return lmBatch(step%2, zooBatch, zooSeq, zooVocab)
			})
			if first, last := losses[0], losses[3]; !(last < first) {
				t.Fatalf("loss %v -> %v: training did not reduce it", first, last)
			}
			sameVars(ctx, t, off, whole)
			if off.Runtime().Metrics().BytesRead == 0 {
				t.Fatal("nothing was read from NVMe")
			}
		})
	}
}

// sameVars compares every variable zinf holds with the Store's.
func sameVars(ctx context.Context, t *testing.T, off *zgomlx.Offload, store *model.Store) {
	t.Helper()
	for _, v := range off.Vars() {
		got, err := off.ReadVariable(ctx, v.Name)
		if err != nil {
			t.Fatal(err)
		}
		sameBytes(t, v.Name+" after training", valueBytes(t, got), valueBytes(t, store.GetVariable(v.Name).MustValue()))
	}
}

// TestTiedEmbeddings: the zoo transformer with its output head reading
// the token embedding table: zinf holds one tensor for both uses, its
// gradient is the sum of both, and training equals the same model in one
// graph and in memory bit for bit.
func TestTiedEmbeddings(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	b := backend(t)
	cfg := testConfig(t, 8<<20)
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(zooModel(store, dtypes.Float32), zgomlx.TransformerOptions{TieEmbeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	xs := shapes.Make(dtypes.Int32, zooBatch, zooSeq)
	if _, err := zgomlx.Initialize(b, store, net, xs); err != nil {
		t.Fatal(err)
	}
	if store.GetVariable("/output/dense/weights") != nil {
		t.Fatal("a tied head made its own output weights")
	}
	memStore, wholeStore, gradStore := clone(t, store), clone(t, store), clone(t, store)

	// The tied table's gradient is both uses' sum, as in one graph.
	x, y := lmBatch(0, zooBatch, zooSeq, zooVocab)
	_, want, err := reference.WholeGraphGradients(b, gradStore, net, nil, x, y)
	if err != nil {
		t.Fatal(err)
	}
	gm, err := reference.NewMemoryTrainer(b, clone(t, store), net, cfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, got, err := gm.Gradients(ctx, x, y)
	gm.Close()
	if err != nil {
		t.Fatal(err)
	}
	const table = "/token_embed/embeddings"
	sameBits(t, table+" gradient", got[table], want[table])

	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	n := 0
	for _, v := range tr.Offload().Vars() {
		if v.Name == table {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("zinf holds %d tensors %q, want one", n, table)
	}
	mt, err := reference.NewMemoryTrainer(b, memStore, net, cfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	wg, err := reference.NewWholeGraph(b, wholeStore, net, reference.Adam(plan.Hyper(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Close()
	for step := range 3 {
		x, y := lmBatch(step, zooBatch, zooSeq, zooVocab)
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
		if lo != lm || lo != lw {
			t.Fatalf("step %d: loss offloaded %v, in memory %v, whole graph %v", step, lo, lm, lw)
		}
	}
	sameVars(ctx, t, tr.Offload(), wholeStore)
	sameVars(ctx, t, tr.Offload(), memStore)
}

// TestManyTensorsBetweenLayers: layers that pass several tensors on (two
// float ones and the int tokens, one of them unused by the next layer)
// train through zinf as the same Net in one graph, bit for bit.
func TestManyTensorsBetweenLayers(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	const vocab, dim = 23, 8
	net := zgomlx.Net{TrainLoss: zgomlx.TransformerLoss, Layers: []zgomlx.Layer{
		{Scope: "/embed", FnN: func(scope *model.Scope, xs []*Node) []*Node {
			e := layers.Embedding(scope, xs[0], dtypes.Float32, vocab, dim)
			return []*Node{e, xs[0], MulScalar(Tanh(e), 0.5)}
		}},
		{Scope: "/mix", FnN: func(scope *model.Scope, xs []*Node) []*Node {
			e, tokens, s := xs[0], xs[1], xs[2]
			a := Add(Tanh(layers.Dense(scope.In("a"), e, true, dim)), s) // a skip over the layer's dense
			return []*Node{a, tokens, layers.Dense(scope.In("b"), Mul(s, e), false, dim)}
		}},
		{Scope: "/head", FnN: func(scope *model.Scope, xs []*Node) []*Node {
			return []*Node{layers.Dense(scope, Add(xs[0], xs[2]), true, vocab)}
		}},
	}}
	xs := shapes.Make(dtypes.Int32, zooBatch, zooSeq)
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(9))
	cfg := testConfig(t, 8<<20)
	tr, wg, wholeStore := offloadedAndWhole(ctx, t, b, cfg, store, net, xs)
	stepBoth(ctx, t, tr, wg, 3, "offloaded", func(step int) (x, y *tensors.Tensor) { return lmBatch(step, zooBatch, zooSeq, vocab) })
	sameVars(ctx, t, tr.Offload(), wholeStore)
}

// TestZooRefusals: what the per-layer executors cannot run as the whole
// graph would is refused when the model is described or created, naming
// it: dropout (zoo field and a layer's graph), a regularization loss.
func TestZooRefusals(t *testing.T) {
	ctx := watchdog(t, 2*time.Minute)
	b := backend(t)
	store := model.NewStore()
	if _, err := zgomlx.TransformerNet(zooModel(store, dtypes.Float32).WithDropout(0.1), zgomlx.TransformerOptions{}); err == nil || !strings.Contains(err.Error(), "Dropout 0.1") {
		t.Fatalf("zoo dropout: %v", err)
	}
	xs := shapes.Make(dtypes.Float32, 2, 4)
	for _, c := range []struct {
		name string
		fn   zgomlx.LayerFn
		want string
	}{
		{"dropout", func(scope *model.Scope, x *Node) *Node {
			return layers.Dropout(scope, layers.Dense(scope, x, true, 3), Scalar(x.Graph(), x.DType(), 0.5))
		}, `updates variable "/#rngState"`},
		{"l2", func(scope *model.Scope, x *Node) *Node {
			scope.SetParam("l2_regularization", 0.01)
			return layers.Dense(scope, x, true, 3)
		}, "regularization loss"},
	} {
		net := zgomlx.Net{Layers: []zgomlx.Layer{{Scope: "/a", Fn: c.fn}}, Loss: mlpNet(3).Loss}
		_, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), model.NewStore(), net, zgomlx.Options{}, xs)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Create returned %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

var (
	_ = compute.Backend(nil)
	_ = (*tensors.Tensor)(nil)
	_ = config.Default
)

// TestEvalWithoutRestore: the held-out loss (EvalLoss) and the logits
// (Forward) of an offloaded model stream its weights from zinf and equal
// the zoo's whole model in memory bit for bit; the Store gets no values
// back, training goes on unchanged, and a plain model.Exec over the
// offloaded Store fails, naming the variable, instead of running on
// fresh random weights.
func TestEvalWithoutRestore(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	b := backend(t)
	cfg := testConfig(t, 8<<20)
	store := model.NewStore()
	mz := zooModel(store, dtypes.Float32)
	net, err := zgomlx.TransformerNet(mz, zgomlx.TransformerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, zooBatch, zooSeq))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()

	whole := model.NewStore()
	m := zooModel(whole, dtypes.Float32)
	logits, err := model.NewExec(b, whole, func(scope *model.Scope, tokens *Node) *Node { return zooLogits(m)(scope, []*Node{tokens})[0] })
	if err != nil {
		t.Fatal(err)
	}
	defer logits.Finalize()
	lossOf, err := model.NewExec(b, whole, func(scope *model.Scope, tokens, labels *Node) *Node {
		return zgomlx.TransformerLoss([]*Node{labels}, zooLogits(m)(scope, []*Node{tokens}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lossOf.Finalize()

	x, y := lmBatch(1, zooBatch, zooSeq, zooVocab)
	want, err := logits.Call(x)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tr.Forward(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("Forward returned %d tensors", len(got))
	}
	sameBytes(t, "logits", valueBytes(t, got[0]), valueBytes(t, want[0]))
	wl, err := lossOf.Call(x, y)
	if err != nil {
		t.Fatal(err)
	}
	el, err := tr.EvalLoss(ctx, x, y)
	if err != nil {
		t.Fatal(err)
	}
	if w := asFloat32s(t, wl[0])[0]; el != w {
		t.Fatalf("EvalLoss %v, the zoo in memory %v", el, w)
	}
	for v := range store.IterVariables() {
		if v.Trainable && v.HasValue() {
			t.Fatalf("%s got a value in the Store", v.Path())
		}
	}
	if tr.ParamReads() == 0 {
		t.Fatal("evaluation read nothing from zinf")
	}

	// A GoMLX executor over the offloaded Store refuses.
	e, err := model.NewExec(b, store, func(scope *model.Scope, tokens *Node) *Node {
		mz.Scope = mz.Scope.ResetVisited()
		return mz.Logits(tokens, transformer.CallOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Finalize()
	if _, err := e.Call(x); err == nil || !strings.Contains(err.Error(), "variable values are in zinf") {
		t.Fatalf("model.Exec over the offloaded Store: %v", err)
	}

	// Training after evaluation is training from the same weights.
	wg, err := reference.NewWholeGraphModel(b, whole, zooLogits(m), zgomlx.TransformerLoss, reference.Adam(plan.Hyper(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Close()
	lo, err := tr.Step(ctx, x, y)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := wg.Step(x, y)
	if err != nil {
		t.Fatal(err)
	}
	if lo != lw || lo != el {
		t.Fatalf("step after evaluation: loss %v offloaded, %v whole graph, %v evaluated", lo, lw, el)
	}
	sameVars(ctx, t, tr.Offload(), whole)
}
