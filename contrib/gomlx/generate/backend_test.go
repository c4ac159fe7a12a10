package generate_test

import (
	"math"
	"slices"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/dtypes/bfloat16"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
)

// TestKVCacheOpsUpdate: the stand-in DynamicUpdateSlice writes one
// position along one axis at a dynamic start, clamped as XLA clamps it,
// bit for bit (a NaN, an infinity and a negative zero in the update
// included), and leaves every other value as it was, for the dtypes it
// scatters and for one it masks (int32); a chain of updates (a KV cache's
// prefill) writes each of its positions.
func TestKVCacheOpsUpdate(t *testing.T) {
	be := generate.WithKVCacheOps(backend(t))
	const B, H, N, D = 2, 3, 5, 4
	operand := make([]float32, B*H*N*D)
	for i := range operand {
		operand[i] = float32(i%13) - 6.5
	}
	update := make([]float32, B*H*D)
	for i := range update {
		update[i] = 100 + float32(i)
	}
	update[1], update[2], update[3] = float32(math.NaN()), float32(math.Inf(-1)), float32(math.Copysign(0, -1))
	// want is operand with position p along axis 2 replaced by update.
	want := func(p int, upd []float32) []float32 {
		p = min(max(p, 0), N-1)
		w := slices.Clone(operand)
		for b := range B {
			for h := range H {
				for d := range D {
					w[((b*H+h)*N+p)*D+d] = upd[(b*H+h)*D+d]
				}
			}
		}
		return w
	}
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16, dtypes.Int32} {
		t.Run(dt.String(), func(t *testing.T) {
			e, err := graph.NewExec(be, func(op, up, pos *graph.Node) *graph.Node {
				z := graph.Const(op.Graph(), int32(0))
				return graph.DynamicUpdateSlice(op, up, []*graph.Node{z, z, pos, z})
			})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Finalize()
			upd := slices.Clone(update)
			if dt == dtypes.Int32 {
				upd[1], upd[2], upd[3] = 7, -8, 9
			}
			for _, p := range []int{-3, 0, 2, 4, 9} {
				op := tensorOf(dt, operand, B, H, N, D)
				u := tensorOf(dt, upd, B, H, 1, D)
				out, err := e.Call(op, u, int32(p))
				if err != nil {
					t.Fatal(err)
				}
				got, wantV := floats(t, out[0]), floats(t, tensorOf(dt, want(p, upd), B, H, N, D))
				if !sameBits(got, wantV) {
					t.Fatalf("position %d:\n got %v\nwant %v", p, got, wantV)
				}
			}
		})
	}
	// A chain of updates at consecutive dynamic positions, as
	// kvcache.Update writes a prefill's keys.
	e, err := graph.NewExec(be, func(op, up, pos *graph.Node) *graph.Node {
		z := graph.Const(op.Graph(), int32(0))
		for i := range 3 {
			u := graph.Slice(up, graph.AxisRange(), graph.AxisRange(), graph.AxisElem(i), graph.AxisRange())
			op = graph.DynamicUpdateSlice(op, u, []*graph.Node{z, z, graph.AddScalar(pos, i), z})
		}
		return op
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Finalize()
	op := tensorOf(dtypes.Float32, operand, B, H, N, D)
	ups := make([]float32, B*H*3*D)
	for i := range ups {
		ups[i] = 1000 + float32(i)
	}
	u := tensorOf(dtypes.Float32, ups, B, H, 3, D)
	out, err := e.Call(op, u, int32(1))
	if err != nil {
		t.Fatal(err)
	}
	w := slices.Clone(operand)
	for b := range B {
		for h := range H {
			for i := range 3 {
				for d := range D {
					w[((b*H+h)*N+1+i)*D+d] = ups[((b*H+h)*3+i)*D+d]
				}
			}
		}
	}
	if got := floats(t, out[0]); !sameBits(got, w) {
		t.Fatalf("a chain of 3 updates at 1:\n got %v\nwant %v", got, w)
	}
}

// tensorOf is values as a tensor of dtype dt (bfloat16 rounded, int32
// truncated).
func tensorOf(dt dtypes.DType, values []float32, dims ...int) *tensors.Tensor {
	switch dt {
	case dtypes.BFloat16:
		flat := make([]bfloat16.BFloat16, len(values))
		for i, v := range values {
			flat[i] = bfloat16.FromFloat32(v)
		}
		return tensors.FromFlatDataAndDimensions(flat, dims...)
	case dtypes.Int32:
		flat := make([]int32, len(values))
		for i, v := range values {
			flat[i] = int32(v)
		}
		return tensors.FromFlatDataAndDimensions(flat, dims...)
	}
	return tensors.FromFlatDataAndDimensions(slices.Clone(values), dims...)
}

// floats is a tensor's values widened to float32.
func floats(t *testing.T, x *tensors.Tensor) []float32 {
	t.Helper()
	var out []float32
	var err error
	switch x.DType() {
	case dtypes.BFloat16:
		err = tensors.ConstFlatData(x, func(flat []bfloat16.BFloat16) {
			for _, v := range flat {
				out = append(out, v.Float32())
			}
		})
	case dtypes.Int32:
		err = tensors.ConstFlatData(x, func(flat []int32) {
			for _, v := range flat {
				out = append(out, float32(v))
			}
		})
	default:
		err = tensors.ConstFlatData(x, func(flat []float32) { out = slices.Clone(flat) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameBits compares float32 values bit for bit (NaN equals NaN, -0 is
// not 0).
func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}
