package zgomlx_test

import (
	"context"
	"errors"
	"strings"
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
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// bigVocabModel is a one-layer zoo transformer whose tied embedding is
// its largest tensor by far.
func bigVocabModel(store *model.Store, vocab int) *transformer.Model {
	return bigVocabModelTied(store, vocab, true)
}

// bigVocabModelTied is bigVocabModel, its head tied to the embedding or
// not (the zoo's own "output" weights: then the embedding table is used
// by its lookup only).
func bigVocabModelTied(store *model.Store, vocab int, tied bool) *transformer.Model {
	_ = tied // the Net's option; the zoo model is the same
	store.SetParam(model.ParamInitialSeed, int64(8))
	return transformer.New(store.RootScope()).WithVocabSize(vocab).WithEmbedDim(64).WithNumLayers(1).
		WithNumHeads(2).WithHeadDim(32).WithFFNDim(64).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
}

// minimumPool is the least pinned pool zinf plans for the model (Open
// refuses a 1-byte pool with it).
func minimumPool(ctx context.Context, t *testing.T, b compute.Backend, cfg *config.Config, vocab int) int64 {
	t.Helper()
	return minimumPoolTied(ctx, t, b, cfg, vocab, true)
}

// minimumPoolTied is minimumPool, tied or not.
func minimumPoolTied(ctx context.Context, t *testing.T, b compute.Backend, cfg *config.Config, vocab int, tied bool) int64 {
	t.Helper()
	c := *cfg
	c.Zinf.Tiers.CPUPinnedBytes = 1
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(bigVocabModelTied(store, vocab, tied), zgomlx.TransformerOptions{TieEmbeddings: tied})
	if err != nil {
		t.Fatal(err)
	}
	_, err = zgomlx.Create(ctx, b, &c, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, 1, 8))
	var small *zinf.PoolTooSmallError
	if !errors.As(err, &small) {
		t.Fatalf("a 1-byte pool: %v", err)
	}
	return small.Res.MinPoolBytes
}

// TestBigEmbeddingPool: zinf plans a zoo transformer whose 100000-row
// (tied) embedding is its largest tensor with a pinned pool of at most
// 1.25x that embedding's bytes plus what the planner needs for the same
// model with a 1000-row one (zinf moves a tensor larger than
// zinf.Options.PieceBytes in pieces; the config's sub_group_size keeps
// the optimizer's pipeline small), and the model trains with the least
// pool planned, bit for bit as in one graph: the 100000-row one under
// make stress, the same model with bigRows rows (its table a few pieces
// long) at every run.
func TestBigEmbeddingPool(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	cfg := testConfig(t, 0)
	cfg.ZeroOptimization.SubGroupSize = 65_536 // the optimizer's pipeline in small sub-groups
	// The bound is about a table many 4 MiB pieces long (bigRows'
	// default is barely more than one): planned at 100000 rows always.
	const vocab = 100000
	embed := int64(vocab * 64 * 4)
	rest := minimumPool(ctx, t, b, cfg, 1000)
	pool := minimumPool(ctx, t, b, cfg, vocab)
	t.Logf("minimum pool %d bytes: %.2fx the %d-byte embedding, the rest %d bytes", pool, float64(pool-rest)/float64(embed), embed, rest)
	if float64(pool) > 1.25*float64(embed)+float64(rest) {
		t.Fatalf("minimum pool %d bytes > 1.25 x %d (the embedding) + %d (the rest of the model)", pool, embed, rest)
	}
	rows := bigRows()
	if rows != vocab {
		pool = minimumPool(ctx, t, b, cfg, rows)
	}
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(bigVocabModel(store, rows), zgomlx.TransformerOptions{TieEmbeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	xs := shapes.Make(dtypes.Int32, 1, 8)
	tr, wg, whole := offloadedAndWhole(ctx, t, b, cfg, store, net, xs)
	if !tr.Offload().Runtime().Streamed("/token_embed/embeddings") {
		t.Fatalf("the %d-row table is not streamed: it trains whole, not in pieces", rows)
	}
	stepBoth(ctx, t, tr, wg, 1, "offloaded", func(step int) (x, y *tensors.Tensor) { return lmBatch(step, 1, 8, rows) })
	sameVars(ctx, t, tr.Offload(), whole)
}

// repeatBatch is a batch of tokens [2, 8] spread over a vocabulary of
// vocab, with tokens used several times (an embedding's rows whose
// gradients the lookup sums) and the first and last rows.
func repeatBatch(step, vocab int) (x, y *tensors.Tensor) {
	ids := []int{5, vocab - 1, 5, 7 + step, 4242, vocab - 1, 5, 0, 99, 99, 31337 % vocab, 7 + step, 12, vocab / 2, 5, 1}
	xs := make([]int32, len(ids))
	ys := make([]int32, len(ids))
	for i, id := range ids {
		xs[i] = int32(id)
		ys[i] = int32((id*31 + step) % vocab)
	}
	return tensors.FromFlatDataAndDimensions(xs, 2, 8), tensors.FromFlatDataAndDimensions(ys, 2, 8)
}

// TestEmbeddingRows: a bigRows-row embedding table that zinf streams is
// read at the rows a batch uses only (Layer.Lookups, which
// TransformerNet sets) and its gradient handed over for those rows (a
// row used several times summed by the graph), with the tied head
// reading the whole table and without: two steps bit for bit as in one
// graph, and an evaluation reads the other variables whole and the
// table's used rows, nothing more.
func TestEmbeddingRows(t *testing.T) {
	ctx := watchdog(t, 8*time.Minute)
	b := backend(t)
	vocab := bigRows()
	for _, tied := range []bool{false, true} {
		t.Run(map[bool]string{false: "untied", true: "tied"}[tied], func(t *testing.T) {
			cfg := testConfig(t, 0)
			cfg.ZeroOptimization.SubGroupSize = 65_536
			cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(minimumPoolTied(ctx, t, b, cfg, vocab, tied)) // the least zinf plans
			store := model.NewStore()
			net, err := zgomlx.TransformerNet(bigVocabModelTied(store, vocab, tied), zgomlx.TransformerOptions{TieEmbeddings: tied})
			if err != nil {
				t.Fatal(err)
			}
			xs := shapes.Make(dtypes.Int32, 2, 8)
			tr, wg, whole := offloadedAndWhole(ctx, t, b, cfg, store, net, xs)
			const table = "/token_embed/embeddings"
			if !tr.Offload().Runtime().Streamed(table) {
				t.Fatalf("%s is not streamed: the test reads nothing by rows", table)
			}
			stepBoth(ctx, t, tr, wg, 2, "offloaded", func(step int) (x, y *tensors.Tensor) { return repeatBatch(step, vocab) })
			sameVars(ctx, t, tr.Offload(), whole)

			// One evaluation: every variable read once, the table by rows
			// (and, tied, whole again for the head, which reads it all).
			x, y := repeatBatch(5, vocab)
			ids := tensors.MustCopyFlatData[int32](x)
			used := map[int32]bool{}
			for _, id := range ids {
				used[id] = true
			}
			var want int64
			for _, v := range tr.Offload().Vars() {
				if v.Name == table {
					want += int64(len(used)) * 64 * 4
					if !tied {
						continue
					}
				}
				want += v.Bytes()
			}
			before := tr.ParamBytesRead()
			if _, err := tr.EvalLoss(ctx, x, y); err != nil {
				t.Fatal(err)
			}
			if got := tr.ParamBytesRead() - before; got != want {
				t.Fatalf("an evaluation read %d bytes of parameters, want %d (the table's %d used rows of %d bytes, the rest whole)", got, want, len(used), 64*4)
			}
		})
	}
}

// TestLookupRefusals: a Layer.Lookups that the loop cannot honour is
// refused by Open, naming the layer and what is allowed: on a layer other
// than the first, a negative input, a variable of another layer; an input
// the batch does not have fails the step, naming it.
func TestLookupRefusals(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	const table = "/token_embed/embeddings"
	for _, c := range []struct {
		name string
		edit func(*zgomlx.Net)
		want string
	}{
		{"not the first layer", func(n *zgomlx.Net) { n.Layers[1].Lookups = []zgomlx.Lookup{{Var: table}} }, "allowed: on the first layer only"},
		{"negative input", func(n *zgomlx.Net) { n.Layers[0].Lookups = []zgomlx.Lookup{{Var: table, Input: -1}} }, "Input -1 (allowed: >= 0"},
		{"another layer's variable", func(n *zgomlx.Net) {
			n.Layers[0].Lookups = []zgomlx.Lookup{{Var: "/final_norm/rms_norm/scale"}}
		}, "is not a variable of this layer"},
	} {
		store := model.NewStore()
		net, err := zgomlx.TransformerNet(bigVocabModel(store, 100), zgomlx.TransformerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, 1, 8)); err != nil {
			t.Fatal(err)
		}
		c.edit(&net)
		tr, err := zgomlx.Create(ctx, b, testConfig(t, 32<<20), store, net, zgomlx.Options{})
		if err == nil {
			tr.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Open returned %v, want an error saying %q", c.name, err, c.want)
		}
	}

	// An input the batch lacks: the table must be streamed for its rows
	// to be read, so this one has bigRows rows.
	cfg := testConfig(t, 0)
	cfg.ZeroOptimization.SubGroupSize = 65_536
	cfg.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(bigVocabModel(store, bigRows()), zgomlx.TransformerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, 1, 8)); err != nil {
		t.Fatal(err)
	}
	net.Layers[0].Lookups = []zgomlx.Lookup{{Var: table, Input: 1}}
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	x, y := repeatBatch(0, bigRows())
	if _, err := tr.Step(ctx, x, y); err == nil || !strings.Contains(err.Error(), "reads its rows from input 1; the batch has 1 inputs") {
		t.Fatalf("a Lookup of an input the batch lacks: Step returned %v", err)
	}
}
