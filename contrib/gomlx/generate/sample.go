package generate

import (
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"
)

// Sample picks the next token from logits [batch, vocab] by strategy, as
// GoMLX's sample.SampleWithStrategy does (the same masks, the same random
// draws from rng, so the same tokens), but in memory of the logits' order
// (a few [batch, vocab] tensors) where GoMLX's top-k and top-p masks
// compare every position with every one of the k top indices: a
// [batch, vocab, k] tensor per mask, and top-p builds one per power of two
// up to the vocabulary, 13 GB per sequence for cl100k's 100277 tokens
// (what took make demo-generate to 24 GiB of RSS with --strategy top_p).
// It also sorts the logits once where top-p sorted them twice per
// candidate k.
func Sample(rng sample.RNG, logits *graph.Node, strategy sample.Strategy, temperature float64, topK int, topP float64) *graph.Node {
	switch strategy {
	case sample.StrategyTemperature:
		return sample.Temperature(rng, logits, temperature)
	case sample.StrategyTopK:
		s := sortedDesc(logits)
		return sample.Temperature(rng, graph.Where(s.mask(topK), logits, graph.Infinity(logits.Graph(), logits.DType(), -1)), temperature)
	case sample.StrategyTopP:
		return nucleus(rng, logits, topP, temperature)
	default:
		return sample.Greedy(logits)
	}
}

// sorted is x [batch, vocab] sorted on its last axis, descending and
// stable (ties in index order), as graph.TopK sorts.
type sorted struct {
	x, values *graph.Node
}

func sortedDesc(x *graph.Node) sorted {
	g := x.Graph()
	dtype := x.DType()
	idx := x.Shape().Clone()
	idx.DType = dtypes.Int32
	cmp := graph.NewClosure(g, func(g *graph.Graph) []*graph.Node {
		l := graph.Parameter(g, "lhs_val", shapes.Make(dtype))
		r := graph.Parameter(g, "rhs_val", shapes.Make(dtype))
		_ = graph.Parameter(g, "lhs_idx", shapes.Make(dtypes.Int32))
		_ = graph.Parameter(g, "rhs_idx", shapes.Make(dtypes.Int32))
		return []*graph.Node{graph.GreaterThan(l, r)}
	})
	out := graph.SortFunc(cmp, -1, true, x, graph.Iota(g, idx, -1))
	return sorted{x: x, values: out[0]}
}

// top is the sum of the k largest values (graph.TopK's values summed).
func (s sorted) top(k int) *graph.Node {
	return graph.ReduceSum(graph.Slice(s.values, graph.AxisRange(), graph.AxisRange(0, k)), -1)
}

// mask is graph.TopKMask(x, k, -1) without its [batch, vocab, k]
// comparison: with t the k-th largest value, the positions above t and,
// of those equal to t, the first k - #above in index order (the stable
// sort's tie-break).
func (s sorted) mask(k int) *graph.Node {
	x := s.x
	g := x.Graph()
	V := x.Shape().Dimensions[x.Rank()-1]
	if k >= V {
		b := x.Shape().Clone()
		b.DType = dtypes.Bool
		return graph.Ones(g, b)
	}
	t := graph.Slice(s.values, graph.AxisRange(), graph.AxisRange(k-1, k)) // [batch, 1]
	above := graph.GreaterThan(x, t)
	equal := graph.Equal(x, t)
	need := graph.Sub(graph.Scalar(g, dtypes.Int32, k), graph.ReduceSum(graph.ConvertDType(above, dtypes.Int32), -1))
	rank := graph.CumSum(graph.ConvertDType(equal, dtypes.Int32), -1) // 1-based among the equal ones
	return graph.Or(above, graph.And(equal, graph.LessOrEqual(rank, graph.ExpandDims(need, -1))))
}

// nucleus is sample.TopP: the smallest power-of-two k whose top-k
// probability mass reaches p, then temperature sampling over it.
func nucleus(rng sample.RNG, logits *graph.Node, p, temperature float64) *graph.Node {
	g := logits.Graph()
	probs := graph.Softmax(logits)
	V := logits.Shape().Dimensions[logits.Rank()-1]
	ks := []int{1}
	for ks[len(ks)-1] < V {
		ks = append(ks, min(2*ks[len(ks)-1], V))
	}
	s := sortedDesc(probs)
	selected := s.mask(V)
	pNode := graph.ConstAs(graph.ReduceSum(probs, -1), p)
	for _, k := range ks[:len(ks)-1] {
		cond := graph.BroadcastToShape(graph.ExpandDims(graph.GreaterOrEqual(s.top(k), pNode), -1), probs.Shape())
		selected = graph.Where(cond, s.mask(k), selected)
	}
	return sample.Temperature(rng, graph.Where(selected, logits, graph.Infinity(g, logits.DType(), -1)), temperature)
}
