package zgomlx_test

import (
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive // graph-building code reads as math
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// lookupNet is an embedding of vocab x 64 (a Layer.Lookups, its own
// layer) and a small dense head: the table is by far the largest tensor
// and nothing but its lookup reads it. twice also adds the table's first
// row to the lookup's output (a second read of the table, which
// Layer.Lookups does not allow).
func lookupNet(vocab int, twice bool) zgomlx.Net {
	const table = "/embed/embeddings"
	embed := zgomlx.Layer{Scope: "/embed", FnN: func(scope *model.Scope, xs []*Node) []*Node {
		x := layers.Embedding(scope, xs[0], dtypes.Float32, vocab, 64)
		if twice {
			t := scope.GetVariable("embeddings").NodeValue(x.Graph())
			x = Add(x, Reshape(Slice(t, AxisRange(0, 1)), 1, 1, 64))
		}
		return []*Node{x}
	}, Lookups: []zgomlx.Lookup{{Var: table}}}
	head := zgomlx.Layer{Scope: "/out", Fn: func(scope *model.Scope, x *Node) *Node { return layers.Dense(scope, x, true, 4) }}
	return zgomlx.Net{Layers: []zgomlx.Layer{embed, head}, Loss: func(y, labels *Node) *Node {
		d := Sub(y, labels)
		return ReduceAllMean(Mul(d, d))
	}}
}

// lookupBatch has repeated ids (so a row's gradient sums several
// positions, in their order) and 4 float labels per position.
func lookupBatch(step, vocab int) (x, y *tensors.Tensor) {
	ids := make([]int32, 2*8)
	for i := range ids {
		ids[i] = int32((step*7 + i*3) % 11 * (vocab / 11))
	}
	labels := make([]float32, 2*8*4)
	for i := range labels {
		labels[i] = float32((i*5+step)%9)/9 - 0.5
	}
	return tensors.FromFlatDataAndDimensions(ids, 2, 8), tensors.FromFlatDataAndDimensions(labels, 2, 8, 4)
}

// TestLookupGradientByRows: the gradient of a float32 lookup
// (Layer.Lookups) is the gradient of its Gather's output summed per row
// by the loop, never a table-sized tensor: with the table streamed (read
// and handed over by rows) and with it whole, three steps equal the
// whole graph's (whose Gather gradient is a ScatterSum into zeros) bit
// for bit, ids repeated within a batch. A graph that also reads the
// table otherwise gets its gradient whole and trains the same bits.
func TestLookupGradientByRows(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	b := backend(t)
	for _, c := range []struct {
		name  string
		vocab int
	}{{"streamed", bigRows()}, {"whole", 1000}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, 64<<20)
			cfg.ZeroOptimization.SubGroupSize = 65_536
			store := model.NewStore()
			net := lookupNet(c.vocab, false)
			tr, wg, whole := offloadedAndWhole(ctx, t, b, cfg, store, net, shapes.Make(dtypes.Int32, 2, 8))
			if got, want := tr.Offload().Runtime().Streamed("/embed/embeddings"), c.name == "streamed"; got != want {
				t.Fatalf("table streamed: %v, want %v", got, want)
			}
			stepBoth(ctx, t, tr, wg, 3, "offloaded", func(step int) (x, y *tensors.Tensor) { return lookupBatch(step, c.vocab) })
			sameVars(ctx, t, tr.Offload(), whole)
		})
	}

	// A table its graph also reads otherwise (whole, not streamed): its
	// gradient is taken whole, as before.
	t.Run("read twice", func(t *testing.T) {
		store := model.NewStore()
		tr, wg, whole := offloadedAndWhole(ctx, t, b, testConfig(t, 64<<20), store, lookupNet(1000, true), shapes.Make(dtypes.Int32, 2, 8))
		stepBoth(ctx, t, tr, wg, 3, "offloaded", func(step int) (x, y *tensors.Tensor) { return lookupBatch(step, 1000) })
		sameVars(ctx, t, tr.Offload(), whole)
	})
}
