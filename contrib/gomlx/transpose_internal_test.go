package zgomlx

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/config"
)

// TestTransposedWeightGradients: in GoMLX's zoo transformer, every fp32
// matrix of a block (the attention's projections, the FFN's) gets its
// gradient from the backward graph as GoMLX's product in the transposed
// layout followed by a Transpose; the executors build the product with
// its operands swapped instead (swappedProduct), which gives the
// matrix's layout, so nothing is transposed. The test counts the swapped products in the
// backward graphs; a GoMLX whose DotGeneral or Transpose nodes this
// package cannot read fails here, not silently slower. That the
// gradients keep their bits is TestSwappedProductKeepsBits's and
// TestZooTransformerEqualsWholeGraph's (the whole graph's autodiff
// against the per-layer executors).
func TestTransposedWeightGradients(t *testing.T) {
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			if dt == dtypes.BFloat16 {
				t.Setenv(graph.FusionEnv, "false") // the fused dense has no bf16 kernel
			}
			backend, err := compute.NewWithConfig(DefaultBackend)
			if err != nil {
				t.Fatal(err)
			}
			store := model.NewStore()
			store.SetParam(model.ParamInitialSeed, int64(5))
			m := transformer.New(store.RootScope()).WithVocabSize(50).WithEmbedDim(16).WithNumLayers(2).
				WithNumHeads(2).WithHeadDim(8).WithFFNDim(24).WithDType(dt).WithRoPE(10000).
				WithFinalNormalization(layers.NormalizationRMSNorm)
			net, err := TransformerNet(m, TransformerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cfg := config.Default()
			cfg.SetScratchDir(t.TempDir())
			cfg.Zinf.Tiers.CPUPinnedBytes = 8 << 20
			cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
			cfg.BF16 = dt == dtypes.BFloat16
			tr, err := Create(ctx, backend, cfg, store, net, Options{}, shapes.Make(dtypes.Int32, 2, 6))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			x := make([]int32, 12)
			y := make([]int32, 12)
			for i := range x {
				x[i], y[i] = int32(i*7%50), int32((i*7+1)%50)
			}
			before := swappedProducts.Load()
			if _, err := tr.Step(ctx, tensors.FromFlatDataAndDimensions(x, 2, 6), tensors.FromFlatDataAndDimensions(y, 2, 6)); err != nil {
				t.Fatal(err)
			}
			swapped := swappedProducts.Load() - before
			matrices := 0
			for _, le := range tr.ex.layers {
				for i, v := range le.vars {
					if i < le.own && v.Shape.Rank() >= 2 && v.lookup < 0 {
						matrices++
					}
				}
			}
			want := map[bool]int64{true: 2*6 + 1, false: 0}[dt == dtypes.Float32]
			t.Logf("%d matrices; %d gradients built as swapped products", matrices, swapped)
			if swapped != want {
				t.Errorf("%d gradients built as swapped products, want %d (two blocks, each q, k, v, o and the FFN's two, and the output's)", swapped, want)
			}
		})
	}
}

// TestSwappedProductKeepsBits: the gradient of x W with respect to W, as
// GoMLX's autodiff gives it (the product dy^T x, then a Transpose), and
// as swappedProduct builds it (x^T dy), are the same bits, for products
// the backend runs with its small and its large kernels, contractions
// shorter than a SIMD register, longer than one panel of the large
// kernel's, and inputs with two batch-like axes (x [B, S, in]).
func TestSwappedProductKeepsBits(t *testing.T) {
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 9))
	for _, c := range []struct {
		lead    []int
		in, out int
	}{
		{[]int{5}, 3, 4}, {[]int{2, 6}, 16, 24}, {[]int{12}, 24, 16}, {[]int{1, 16}, 64, 256},
		{[]int{16}, 1024, 512}, {[]int{300}, 96, 40}, {[]int{2, 130}, 48, 520}, {[]int{7}, 33, 17},
	} {
		xDims := append(slices.Clone(c.lead), c.in)
		yDims := append(slices.Clone(c.lead), c.out)
		var swapped *graph.Node
		exec, err := graph.NewExec(backend, func(x, w, dy *graph.Node) []*graph.Node {
			y := graph.DotGeneral(x, []int{x.Rank() - 1}, nil, w, []int{0}, nil)
			g := graph.Gradient(graph.ReduceAllSum(graph.Mul(y, dy)), w)[0]
			swapped = swappedProduct(g)
			if swapped == nil {
				return []*graph.Node{g, g}
			}
			return []*graph.Node{g, swapped}
		})
		if err != nil {
			t.Fatal(err)
		}
		fill := func(dims []int) *tensors.Tensor {
			n := 1
			for _, d := range dims {
				n *= d
			}
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64()) * float32(math.Exp2(float64(rng.IntN(9)-4)))
			}
			return tensors.FromFlatDataAndDimensions(v, dims...)
		}
		outs, err := exec.Exec(fill(xDims), fill([]int{c.in, c.out}), fill(yDims))
		if err != nil {
			t.Fatal(err)
		}
		if swapped == nil {
			t.Errorf("x %v, W [%d %d]: swappedProduct did not take the gradient's product", xDims, c.in, c.out)
		} else {
			want, got := outs[0].Value().([][]float32), outs[1].Value().([][]float32)
			diff := 0
			for i := range want {
				for j := range want[i] {
					if math.Float32bits(want[i][j]) != math.Float32bits(got[i][j]) {
						diff++
					}
				}
			}
			if diff > 0 {
				t.Errorf("x %v, W [%d %d]: %d of %d elements differ from the autodiff's", xDims, c.in, c.out, diff, c.in*c.out)
			}
		}
		for _, o := range outs {
			o.FinalizeAll()
		}
		exec.Finalize()
	}
}

// BenchmarkGoMLXTranspose: the same matrix through the backend's
// Transpose node, what the backward graph ran before swappedMatrix.
func BenchmarkGoMLXTranspose(b *testing.B) {
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		b.Fatal(err)
	}
	rows, cols := 4096, 1024
	exec, err := graph.NewExec(backend, func(x *graph.Node) *graph.Node { return graph.TransposeAllAxes(x, 1, 0) })
	if err != nil {
		b.Fatal(err)
	}
	defer exec.Finalize()
	x := tensors.FromFlatDataAndDimensions(make([]float32, rows*cols), rows, cols)
	b.SetBytes(int64(8 * rows * cols))
	for b.Loop() {
		out, err := exec.Exec(x)
		if err != nil {
			b.Fatal(err)
		}
		out[0].FinalizeAll()
	}
}

// TestHeadGradientSkipsIdentityTranspose: GoMLX's autodiff gives a tied
// head block's table gradient as a product already in the table's layout
// followed by an identity Transpose (a 32 MiB copy at 8192 rows of
// d=1024, element by element); skipIdentity takes the product instead,
// and leaves any other permutation, which moves values, in place.
func TestHeadGradientSkipsIdentityTranspose(t *testing.T) {
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	var identity, kept, other int
	exec, err := graph.NewExec(backend, func(h, e, dl *graph.Node) []*graph.Node {
		gs := graph.Gradient(graph.ReduceAllSum(graph.Mul(headLogits(h, e), dl)), h, e)
		de := gs[1]
		if p := transposePerm(de); p != nil && p[0] == 0 && p[1] == 1 {
			identity++
		}
		if got := skipIdentity(de); got == de && identity > 0 {
			kept++
		} else if got != de && got != de.Inputs()[0] {
			t.Errorf("skipIdentity gave %s, neither the node nor its input", got)
		}
		swapped := graph.Transpose(e, 0, 1)
		if skipIdentity(swapped) != swapped {
			other++
		}
		for i, g := range gs {
			gs[i] = skipIdentity(g)
		}
		return gs
	})
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Finalize()
	h := tensors.FromFlatDataAndDimensions([]float32{1, 2, 3, 4, 5, 6}, 1, 2, 3)
	e := tensors.FromFlatDataAndDimensions([]float32{1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, 4, 3)
	dl := tensors.FromFlatDataAndDimensions([]float32{1, 0, 0, 1, 0, 1, 0, 0}, 1, 2, 4)
	outs, err := exec.Exec(h, e, dl)
	if err != nil {
		t.Fatal(err)
	}
	if identity != 1 {
		t.Fatalf("the table's gradient is not an identity Transpose in this GoMLX (%d): the head's backward no longer needs skipIdentity, or writes its permutation otherwise", identity)
	}
	if kept != 0 {
		t.Fatal("skipIdentity kept an identity Transpose")
	}
	if other != 0 {
		t.Fatal("skipIdentity dropped a Transpose that moves values")
	}
	// de[v][d] = sum over tokens of dl[t][v] h[t][d]: token 0's dl picks
	// rows 0 and 3, token 1's row 1; row 2 is zero.
	want := []float32{1, 2, 3, 4, 5, 6, 0, 0, 0, 1, 2, 3}
	got := tensors.MustCopyFlatData[float32](outs[1])
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("the table's gradient is %v, want %v", got, want)
		}
	}
}

// BenchmarkWeightGradient: the gradient of a zoo block's FFN weights (x
// [16, 1024], W [1024, 4096]: one micro-batch of 16 tokens) as GoMLX's
// autodiff gives it (the product dy^T x, then the backend's Transpose),
// as the loop took it before this package built swapped products (the
// product only, which it then transposed outside the graph, 2.3 ms more
// for this matrix on the development VM), and as
// swappedProduct builds it (x^T dy).
func BenchmarkWeightGradient(b *testing.B) {
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		b.Fatal(err)
	}
	const tokens, in, out = 16, 1024, 4096
	x := tensors.FromFlatDataAndDimensions(make([]float32, tokens*in), tokens, in)
	w := tensors.FromFlatDataAndDimensions(make([]float32, in*out), in, out)
	dy := tensors.FromFlatDataAndDimensions(make([]float32, tokens*out), tokens, out)
	for _, c := range []string{"autodiff", "product", "swapped"} {
		b.Run(c, func(b *testing.B) {
			exec, err := graph.NewExec(backend, func(x, w, dy *graph.Node) *graph.Node {
				y := graph.DotGeneral(x, []int{1}, nil, w, []int{0}, nil)
				g := graph.Gradient(graph.ReduceAllSum(graph.Mul(y, dy)), w)[0]
				switch c {
				case "product":
					pre, _, _ := swappedMatrix(g)
					return pre
				case "swapped":
					return swappedProduct(g)
				}
				return g
			})
			if err != nil {
				b.Fatal(err)
			}
			defer exec.Finalize()
			b.SetBytes(4 * in * out)
			for b.Loop() {
				o, err := exec.Exec(x, w, dy)
				if err != nil {
					b.Fatal(err)
				}
				o[0].FinalizeAll()
			}
		})
	}
}
