package generate_test

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
)

// noise is a sample.RNG of fixed draws (the same for both samplers).
type noise struct{ u []float32 }

func (n noise) RandomUniform(g *graph.Graph, shape shapes.Shape) *graph.Node {
	return graph.Reshape(graph.Const(g, n.u[:shape.Size()]), shape.Dimensions...)
}

type sampler func(rng sample.RNG, logits *graph.Node, s sample.Strategy, temperature float64, k int, p float64) *graph.Node

// TestSampleEqualsGoMLX: generate.Sample picks the tokens GoMLX's
// sample.SampleWithStrategy picks from the same logits and random draws,
// for every strategy, with ties among the logits (the masks' tie-break).
func TestSampleEqualsGoMLX(t *testing.T) {
	be := backend(t)
	const B, V = 3, 200
	r := rand.New(rand.NewSource(7))
	for trial := range 6 {
		logits := make([]float32, B*V)
		for i := range logits {
			logits[i] = float32(r.Intn(12)) / 3 // many ties
		}
		u := make([]float32, B*V)
		for i := range u {
			u[i] = r.Float32()
		}
		for _, c := range []struct {
			s    sample.Strategy
			temp float64
			k    int
			p    float64
		}{
			{sample.StrategyGreedy, 1, 0, 0}, {sample.StrategyTemperature, 1.5, 0, 0},
			{sample.StrategyTopK, 1, 1, 0}, {sample.StrategyTopK, 2, 7, 0}, {sample.StrategyTopK, 1, V, 0},
			{sample.StrategyTopP, 1, 0, 0.3}, {sample.StrategyTopP, 2, 0, 0.9}, {sample.StrategyTopP, 1, 0, 1},
		} {
			run := func(f sampler) []int32 {
				e, err := graph.NewExec(be, func(x *graph.Node) *graph.Node { return f(noise{u}, x, c.s, c.temp, c.k, c.p) })
				if err != nil {
					t.Fatal(err)
				}
				defer e.Finalize()
				in := tensors.FromFlatDataAndDimensions(logits, B, V)
				out, err := e.Exec(in)
				if err != nil {
					t.Fatal(err)
				}
				var got []int32
				if err := tensors.ConstFlatData(out[0], func(f []int32) { got = slices.Clone(f) }); err != nil {
					t.Fatal(err)
				}
				return got
			}
			want, got := run(sample.SampleWithStrategy), run(generate.Sample)
			if !slices.Equal(want, got) {
				t.Errorf("trial %d, %s (temperature %g, k %d, p %g): generate.Sample %v, GoMLX %v", trial, c.s, c.temp, c.k, c.p, got, want)
			}
		}
	}
}

// TestSampleMemory: at cl100k's vocabulary (100277) the sampling head's
// largest intermediate holds no more than batch x vocab values for every
// strategy; GoMLX's top-k and top-p masks hold batch x vocab x k (the
// 24 GiB that make demo-generate grew to with --strategy top_p), which
// the same measure catches.
func TestSampleMemory(t *testing.T) {
	be := backend(t)
	const B, V = 4, 100277
	largest := func(f sampler, s sample.Strategy, k int) int {
		g := graph.NewGraph(be, fmt.Sprintf("sample_%s", s))
		defer g.Finalize()
		x := graph.Parameter(g, "logits", shapes.Make(dtypes.Float32, B, V))
		f(noise{make([]float32, B*V)}, x, s, 1, k, 0.9)
		most := 0
		for _, n := range g.Nodes() {
			if n.NumOutputs() == 1 {
				most = max(most, n.Shape().Size())
			}
		}
		return most
	}
	for _, s := range []sample.Strategy{sample.StrategyGreedy, sample.StrategyTemperature, sample.StrategyTopK, sample.StrategyTopP} {
		if n := largest(generate.Sample, s, 50); n > B*V {
			t.Errorf("%s: the largest intermediate has %d values (bound: batch x vocab = %d)", s, n, B*V)
		}
	}
	for _, s := range []sample.Strategy{sample.StrategyTopK, sample.StrategyTopP} {
		if n := largest(sample.SampleWithStrategy, s, 50); n <= B*V {
			t.Errorf("GoMLX's %s: the largest intermediate has %d values, within the bound %d: the measure would not catch the [batch, vocab, k] mask", s, n, B*V)
		}
	}
}
