package zgomlx

import (
	"context"
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

// TestTransposeInto: every element lands at its transposed place, for
// shapes smaller than, equal to and not multiples of the tile, and
// nothing past the matrix is written.
func TestTransposeInto(t *testing.T) {
	for _, sh := range [][2]int{{1, 1}, {1, 7}, {7, 1}, {3, 5}, {8, 8}, {9, 17}, {32, 32}, {33, 31}, {64, 96}, {100, 37}, {257, 65}, {512, 8}, {513, 515}, {1030, 9}, {17, 1100}} {
		rows, cols := sh[0], sh[1]
		src := make([]float32, rows*cols)
		for i := range src {
			src[i] = float32(i) + 0.5
		}
		dst := make([]float32, rows*cols+3)
		for i := range dst {
			dst[i] = -1
		}
		transposeInto(dst[:rows*cols], src, rows, cols)
		for i := range rows {
			for j := range cols {
				if got, want := dst[j*rows+i], src[i*cols+j]; got != want {
					t.Fatalf("%dx%d: dst[%d*%d+%d] = %v, want src[%d*%d+%d] = %v", rows, cols, j, rows, i, got, i, cols, j, want)
				}
			}
		}
		for i := rows * cols; i < len(dst); i++ {
			if dst[i] != -1 {
				t.Fatalf("%dx%d: dst[%d] written past the matrix", rows, cols, i)
			}
		}
	}
	transposeInto(nil, nil, 0, 5) // an empty matrix: nothing to do
}

// BenchmarkTransposeInto: a zoo block's FFN weight gradient (4096 x 1024
// fp32, 16 MiB).
func BenchmarkTransposeInto(b *testing.B) {
	rows, cols := 4096, 1024
	src, dst := make([]float32, rows*cols), make([]float32, rows*cols)
	b.SetBytes(int64(8 * rows * cols))
	for b.Loop() {
		transposeInto(dst, src, rows, cols)
	}
}

// TestTransposedWeightGradients: in GoMLX's zoo transformer, every fp32
// matrix of a block (the attention's projections, the FFN's) gets its
// gradient from the backward graph as the product's result, transposed
// (swappedMatrix), which the loop puts back; vectors, the embedding
// table (a lookup) and bf16 weights keep the graph's own. A GoMLX whose
// Transpose nodes this package cannot read fails here, not silently
// slower. That the gradients keep their bits is
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
			if _, err := tr.Step(ctx, tensors.FromFlatDataAndDimensions(x, 2, 6), tensors.FromFlatDataAndDimensions(y, 2, 6)); err != nil {
				t.Fatal(err)
			}
			matrices := 0
			for _, le := range tr.ex.layers {
				for i, v := range le.vars {
					r, c, ok := le.transposedGrad(v)
					want := i < le.own && v.Shape.Rank() >= 2 && v.lookup < 0 && dt == dtypes.Float32
					if ok != want {
						t.Errorf("%s (%s, layer %d): transposed %v, want %v", v.Name, v.Shape, le.index, ok, want)
						continue
					}
					if ok {
						matrices++
						if r*c != v.numel || r < 2 || c < 2 {
							t.Errorf("%s (%s): given as %d x %d", v.Name, v.Shape, r, c)
						}
						t.Logf("%s %s: its gradient given as the %d x %d transpose", v.Name, v.Shape, r, c)
					}
				}
			}
			if want := map[bool]int{true: 2 * 6, false: 0}[dt == dtypes.Float32]; matrices < want {
				t.Errorf("%d matrices with their gradients given transposed, want at least %d (two blocks, each q, k, v, o and the FFN's)", matrices, want)
			}
		})
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
