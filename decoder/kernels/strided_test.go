package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Dots and WeightedSum over rows a stride apart give, with every kernel,
// the bits of MatMul and MatMulInOut (scalar reference) on a dense copy
// of the rows: odd column counts (the tails), more rows than a block,
// strides past the columns.
func TestStridedMatchScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	ref, err := NewPool(Options{Workers: 1, Kernel: KernelScalar})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	kernels := append([]*kernel{scalarKernel}, simdKernels...)
	var sc Scratch
	for trial := range 200 {
		rows, cols := rng.IntN(40), rng.IntN(150)
		if trial%4 == 0 {
			cols = 16 * (1 + rng.IntN(8)) // head sizes: whole groups
		}
		stride := cols + rng.IntN(3)*cols + rng.IntN(5)
		w := randVec(rng, max(0, (rows-1)*stride+cols)+rng.IntN(3))
		x, a := randVec(rng, cols), randVec(rng, rows)
		dense := make([]float32, rows*cols)
		for r := range rows {
			copy(dense[r*cols:(r+1)*cols], w[r*stride:])
		}
		m, err := F32Matrix(rows, cols, dense)
		if err != nil {
			t.Fatal(err)
		}
		wantDots, wantSum := make([]float32, rows), make([]float32, cols)
		if cols > 0 && rows > 0 {
			if err := ref.MatMul(wantDots, m, x, 1); err != nil {
				t.Fatal(err)
			}
			if err := ref.MatMulInOut(wantSum, m, a, 1); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range kernels {
			got := make([]float32, rows)
			if err := dots(k, got, w, stride, rows, cols, x, &sc); err != nil {
				t.Fatal(err)
			}
			for r := range got {
				if math.Float32bits(got[r]) != math.Float32bits(wantDots[r]) {
					t.Fatalf("trial %d, %s: Dots %d x %d stride %d: y[%d] = %v, scalar MatMul %v", trial, k.name, rows, cols, stride, r, got[r], wantDots[r])
				}
			}
			gs := make([]float32, cols)
			for i := range gs {
				gs[i] = 99 // overwritten, not added to
			}
			if err := weightedSum(k, gs, w, stride, rows, cols, a); err != nil {
				t.Fatal(err)
			}
			for c := range gs {
				if math.Float32bits(gs[c]) != math.Float32bits(wantSum[c]) {
					t.Fatalf("trial %d, %s: WeightedSum %d x %d stride %d: y[%d] = %v, scalar MatMulInOut %v", trial, k.name, rows, cols, stride, c, gs[c], wantSum[c])
				}
			}
		}
	}
}

// Bad shapes are errors naming them, y untouched, nothing read out of
// bounds.
func TestStridedBadShapes(t *testing.T) {
	var sc Scratch
	w := make([]float32, 10)
	y := []float32{7, 7, 7}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"short w", Dots(y, w, 4, 3, 4, make([]float32, 4), &sc), "w has 10 values, want at least 12"},
		{"stride", Dots(y, w, 2, 3, 4, make([]float32, 4), &sc), "stride 2"},
		{"x", Dots(y, w, 4, 2, 2, make([]float32, 3), &sc), "y has 3 values (want 2)"},
		{"no scratch", Dots(y[:2], w, 4, 2, 2, make([]float32, 2), nil), "scratch false"},
		{"sum short w", WeightedSum(y, w, 4, 3, 3, make([]float32, 3)), "w has 10 values, want at least 11"},
		{"sum x", WeightedSum(y, w, 4, 2, 3, make([]float32, 3)), "x 3 (want 2)"},
		{"negative", WeightedSum(y, w, 4, -1, 3, nil), "rows and cols"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: %v, want an error holding %q", c.name, c.err, c.want)
		}
	}
	if y[0] != 7 || y[1] != 7 || y[2] != 7 {
		t.Fatalf("y written: %v", y)
	}
}

// A strided product allocates nothing.
func TestStridedAllocs(t *testing.T) {
	var sc Scratch
	w, x, y := make([]float32, 64*40), make([]float32, 64), make([]float32, 20)
	o, a := make([]float32, 64), make([]float32, 20)
	if n := testing.AllocsPerRun(20, func() {
		if err := errors.Join(Dots(y, w, 128, 20, 64, x, &sc), WeightedSum(o, w, 128, 20, 64, a)); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
