package kernels_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/zinfio/zinf/decoder/kernels"
)

// randWeights returns a random rows x cols matrix of type t, quantized
// from normal values through the package's encoder.
func randWeights(t *testing.T, rng *rand.Rand, ty kernels.DType, rows, cols int) kernels.Matrix {
	t.Helper()
	wf := make([]float32, rows*cols)
	for i := range wf {
		wf[i] = float32(rng.NormFloat64())
	}
	data, err := kernels.Encode(ty, wf)
	if err != nil {
		t.Fatal(err)
	}
	return kernels.Matrix{Type: ty, Rows: rows, Cols: cols, Data: data}
}

// MatMuls gives, for each of its matrices, the bits MatMul gives for it
// alone, with every kernel, worker count and batch, whatever the
// matrices' types and row counts (so wherever the split of their rows
// over the workers falls).
func TestMatMulsSameBitsAsMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	types := []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0, kernels.Q4_0}
	for trial := range 40 {
		cols := kernels.BlockSize * (1 + rng.IntN(12))
		nw := 1 + rng.IntN(kernels.MaxShared)
		batch := 1 + rng.IntN(kernels.MaxBatch)
		ws := make([]kernels.Matrix, nw)
		for i := range ws {
			ty := types[rng.IntN(len(types))]
			if trial%2 == 0 {
				ty = types[trial/2%len(types)] // one type for all, as a layer's
			}
			ws[i] = randWeights(t, rng, ty, 1+rng.IntN(90), cols)
		}
		x := make([]float32, batch*cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for _, name := range kernels.Kernels() {
			for _, workers := range []int{1, 2, 3, 5} {
				p, err := kernels.NewPool(kernels.Options{Kernel: name, Workers: workers})
				if err != nil {
					t.Fatal(err)
				}
				ys := make([][]float32, nw)
				for i, w := range ws {
					ys[i] = make([]float32, batch*w.Rows)
				}
				if err := p.MatMuls(ys, ws, x, batch); err != nil {
					t.Fatal(err)
				}
				for i, w := range ws {
					want := make([]float32, batch*w.Rows)
					if err := p.MatMul(want, w, x, batch); err != nil {
						t.Fatal(err)
					}
					for k := range want {
						if math.Float32bits(ys[i][k]) != math.Float32bits(want[k]) {
							t.Fatalf("trial %d, kernel %s, %d workers: matrix %d (%v %d x %d), batch %d: y[%d] = %v, MatMul %v",
								trial, name, workers, i, w.Type, w.Rows, w.Cols, batch, k, ys[i][k], want[k])
						}
					}
				}
				p.Close()
			}
		}
	}
}

// MatMuls refuses mismatched inputs with an error naming what is wrong
// and leaves the outputs untouched.
func TestMatMulsBadInputs(t *testing.T) {
	w := kernels.Matrix{Type: kernels.F32, Rows: 2, Cols: 4, Data: make([]byte, 32)}
	w3 := kernels.Matrix{Type: kernels.F32, Rows: 2, Cols: 3, Data: make([]byte, 24)}
	x := []float32{1, 2, 3, 4}
	y := []float32{7, 7}
	for _, c := range []struct {
		name string
		ys   [][]float32
		ws   []kernels.Matrix
		want string
	}{
		{"none", nil, nil, "0 matrices"},
		{"too many", make([][]float32, kernels.MaxShared+1), make([]kernels.Matrix, kernels.MaxShared+1), "matrices"},
		{"outputs", [][]float32{y}, []kernels.Matrix{w, w}, "2 matrices and 1 outputs"},
		{"cols", [][]float32{y, {7, 7}}, []kernels.Matrix{w, w3}, "matrix 1 has 3 columns"},
		{"short y", [][]float32{y, {7}}, []kernels.Matrix{w, w}, "matrix 1"},
	} {
		err := kernels.MatMuls(c.ys, c.ws, x, 1)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one containing %q", c.name, err, c.want)
		}
		if y[0] != 7 || y[1] != 7 {
			t.Fatalf("%s: y written: %v", c.name, y)
		}
	}
}

// MatMuls allocates nothing once the pool runs.
func TestMatMulsAllocs(t *testing.T) {
	p, err := kernels.NewPool(kernels.Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ws := []kernels.Matrix{
		{Type: kernels.BF16, Rows: 64, Cols: 128, Data: make([]byte, 64*256)},
		{Type: kernels.BF16, Rows: 32, Cols: 128, Data: make([]byte, 32*256)},
	}
	x := make([]float32, 2*128)
	ys := [][]float32{make([]float32, 2*64), make([]float32, 2*32)}
	allocs := testing.AllocsPerRun(20, func() {
		if err := p.MatMuls(ys, ws, x, 2); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations a product, want 0", allocs)
	}
}
