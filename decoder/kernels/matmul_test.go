package kernels_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/decoder/kernels"
)

// A linear layer quantized to Q8_0 and multiplied through the public API
// gives the float64 product of the dequantized weights within the
// package's bound for the block formats (the vectors' quantization to
// 8-bit blocks plus the sums' rounding), with every kernel the machine
// has, bit for bit the same.
func TestMatMulQuantizedLayer(t *testing.T) {
	const rows, cols, batch = 40, 256, 3
	rng := rand.New(rand.NewPCG(3, 4))
	wf := make([]float32, rows*cols)
	for i := range wf {
		wf[i] = float32(rng.NormFloat64())
	}
	rb, err := kernels.RowBytes(kernels.Q8_0, cols)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, rows*rb)
	if _, err := kernels.QuantizeQ8_0(data, wf); err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, rows*cols)
	if err := kernels.Dequantize(deq, kernels.Q8_0, data); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, batch*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	w := kernels.Matrix{Type: kernels.Q8_0, Rows: rows, Cols: cols, Data: data}
	y := make([]float32, batch*rows)
	if err := kernels.MatMul(y, w, x, batch); err != nil {
		t.Fatal(err)
	}
	for b := range batch {
		for r := range rows {
			var exact, mag float64
			for c := range cols {
				v := float64(deq[r*cols+c]) * float64(x[b*cols+c])
				exact += v
				mag += math.Abs(v)
			}
			if e, bound := math.Abs(float64(y[b*rows+r])-exact), quantBound(deq[r*cols:(r+1)*cols], x[b*cols:(b+1)*cols], mag); e > bound {
				t.Fatalf("y[%d][%d] = %v, float64 %v: error %g > bound %g", b, r, y[b*rows+r], exact, e, bound)
			}
			// Quantization itself stays close to the original weights.
			var orig float64
			for c := range cols {
				orig += float64(wf[r*cols+c]) * float64(x[b*cols+c])
			}
			if math.Abs(orig-exact) > 0.02*mag {
				t.Fatalf("Q8_0 product %v is far from the fp32 product %v", exact, orig)
			}
		}
	}
	for _, name := range kernels.Kernels() {
		p, err := kernels.NewPool(kernels.Options{Kernel: name, Workers: 3})
		if err != nil {
			t.Fatal(err)
		}
		y2 := make([]float32, len(y))
		err = p.MatMul(y2, w, x, batch)
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		for i := range y {
			if math.Float32bits(y[i]) != math.Float32bits(y2[i]) {
				t.Fatalf("kernel %s: y[%d] = %v, default kernel %v", name, i, y2[i], y[i])
			}
		}
	}
}

// quantBound is the package documentation's bound on the error of a
// block format's dot product of the weights w (dequantized) and x:
// sum over the blocks of (0.5/127 + 2^-11) * max |x| of the block * sum
// |w| of the block (the quantization of x to 8-bit blocks), plus
// (cols/16 + 19) * 2^-24 * mag (the sums' rounding), times 1.01.
func quantBound(w, x []float32, mag float64) float64 {
	var q float64
	for c0 := 0; c0 < len(w); c0 += kernels.BlockSize {
		var amax, wsum float64
		for c := c0; c < c0+kernels.BlockSize; c++ {
			amax = max(amax, math.Abs(float64(x[c])))
			wsum += math.Abs(float64(w[c]))
		}
		q += (0.5/127 + math.Ldexp(1, -11)) * amax * wsum
	}
	return 1.01 * (q + float64(len(w)/16+19)*math.Ldexp(1, -24)*mag)
}

// Bad shapes are errors that name what is wrong, never panics, and leave
// y untouched.
func TestMatMulBadShapes(t *testing.T) {
	f32 := func(rows, cols int) kernels.Matrix {
		return kernels.Matrix{Type: kernels.F32, Rows: rows, Cols: cols, Data: make([]byte, 4*rows*cols)}
	}
	for _, c := range []struct {
		name  string
		w     kernels.Matrix
		x, y  int
		batch int
		want  string
	}{
		{"batch 0", f32(2, 3), 0, 0, 0, "batch 0"},
		{"batch 9", f32(2, 3), 27, 18, 9, "batch 9"},
		{"short x", f32(2, 3), 2, 2, 1, "x has 2 values"},
		{"long y", f32(2, 3), 3, 3, 1, "y has 3 values"},
		{"short data", kernels.Matrix{Type: kernels.F32, Rows: 2, Cols: 3, Data: make([]byte, 23)}, 3, 2, 1, "Data has 23 bytes"},
		{"q8 odd cols", kernels.Matrix{Type: kernels.Q8_0, Rows: 1, Cols: 48, Data: make([]byte, 51)}, 48, 1, 1, "not a multiple of 32"},
		{"q4 data", kernels.Matrix{Type: kernels.Q4_0, Rows: 2, Cols: 32, Data: make([]byte, 35)}, 32, 2, 1, "Data has 35 bytes"},
		{"negative", kernels.Matrix{Type: kernels.F32, Rows: -1, Cols: 3}, 3, 0, 1, "outside"},
		{"huge", kernels.Matrix{Type: kernels.F32, Rows: math.MaxInt, Cols: 1 << 2}, 4, 0, 1, "outside"},
		{"huge rows of 0 cols", kernels.Matrix{Type: kernels.F32, Rows: kernels.MaxDim + 1, Cols: 0}, 0, 0, 1, "outside"},
		{"unknown dtype", kernels.Matrix{Type: 0, Rows: 1, Cols: 1, Data: make([]byte, 4)}, 1, 1, 1, "unknown dtype"},
	} {
		y := make([]float32, c.y)
		for i := range y {
			y[i] = 42
		}
		err := kernels.MatMul(y, c.w, make([]float32, c.x), c.batch)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
		for i := range y {
			if y[i] != 42 {
				t.Fatalf("%s: y was written", c.name)
			}
		}
	}
	if _, err := kernels.NewPool(kernels.Options{Kernel: "avx9000"}); err == nil || !strings.Contains(err.Error(), "avx9000") {
		t.Errorf("NewPool with an unknown kernel: %v", err)
	}
	if _, err := kernels.NewPool(kernels.Options{Workers: -1}); err == nil || !strings.Contains(err.Error(), "Workers") {
		t.Errorf("NewPool with -1 workers: %v", err)
	}
	p, err := kernels.NewPool(kernels.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close()
	if err := p.MatMul(make([]float32, 2), f32(2, 3), make([]float32, 3), 1); !errors.Is(err, kernels.ErrClosed) {
		t.Errorf("MatMul on a closed pool: %v", err)
	}
}

// Zero-sized products are valid: no columns give zeros.
func TestMatMulEmpty(t *testing.T) {
	for _, ty := range []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0, kernels.Q4_0} {
		y := []float32{5, 6}
		if err := kernels.MatMul(y, kernels.Matrix{Type: ty, Rows: 1, Cols: 0}, nil, 2); err != nil || y[0] != 0 || y[1] != 0 {
			t.Errorf("%v with 0 columns: y %v err %v", ty, y, err)
		}
		if err := kernels.MatMul(nil, kernels.Matrix{Type: ty, Rows: 0, Cols: 32, Data: nil}, make([]float32, 32), 1); err != nil {
			t.Errorf("%v with 0 rows: %v", ty, err)
		}
	}
}

// A product allocates nothing once the pool runs.
func TestMatMulAllocs(t *testing.T) {
	for _, name := range kernels.Kernels() {
		p, err := kernels.NewPool(kernels.Options{Kernel: name, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		w := kernels.Matrix{Type: kernels.Q4_0, Rows: 64, Cols: 128, Data: make([]byte, 64*4*18)}
		x := make([]float32, 5*128)
		y := make([]float32, 5*64)
		allocs := testing.AllocsPerRun(20, func() {
			if err := p.MatMul(y, w, x, 5); err != nil {
				t.Fatal(err)
			}
		})
		p.Close()
		if allocs != 0 {
			t.Errorf("kernel %s: %v allocations a product, want 0", name, allocs)
		}
	}
}

// Products from many goroutines on one pool each get their own result.
func TestMatMulConcurrent(t *testing.T) {
	p, err := kernels.NewPool(kernels.Options{Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const rows, cols = 50, 48
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			data := make([]byte, rows*cols*4)
			for r := range rows {
				b := math.Float32bits(float32(g + 1))
				for c := range cols {
					i := 4 * (r*cols + c)
					data[i], data[i+1], data[i+2], data[i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
				}
			}
			x := make([]float32, cols)
			for i := range x {
				x[i] = 1
			}
			y := make([]float32, rows)
			for range 50 {
				if err := p.MatMul(y, kernels.Matrix{Type: kernels.F32, Rows: rows, Cols: cols, Data: data}, x, 1); err != nil {
					t.Error(err)
					return
				}
				for r, v := range y {
					if v != float32((g+1)*cols) {
						t.Errorf("goroutine %d: y[%d] = %v", g, r, v)
						return
					}
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("concurrent products did not finish in 2 minutes")
	}
}

// F32Matrix views float32 weights without a copy; the product matches
// the plain sum for small integers (exact in any order).
func TestF32Matrix(t *testing.T) {
	w := []float32{1, 2, 3, 4, 5, 6}
	m, err := kernels.F32Matrix(2, 3, w)
	if err != nil {
		t.Fatal(err)
	}
	y := make([]float32, 2)
	if err := kernels.MatMul(y, m, []float32{1, 1, 1}, 1); err != nil {
		t.Fatal(err)
	}
	if y[0] != 6 || y[1] != 15 {
		t.Fatalf("y = %v, want [6 15]", y)
	}
	if _, err := kernels.F32Matrix(2, 2, w); err == nil {
		t.Error("F32Matrix with 6 values for 2 x 2: no error")
	}
	if _, err := kernels.F32Matrix(-1, 2, nil); err == nil {
		t.Error("F32Matrix with -1 rows: no error")
	}
}

// Random shapes, lengths and types, mostly wrong, never panic: the
// product either returns an error or fills y.
func TestMatMulNeverPanics(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pick := func() int {
		switch rng.IntN(6) {
		case 0:
			return -rng.IntN(3) - 1
		case 1:
			return 0
		case 2:
			return math.MaxInt - rng.IntN(3)
		}
		return rng.IntN(70)
	}
	for range 5000 {
		w := kernels.Matrix{Type: kernels.DType(rng.IntN(6)), Rows: pick(), Cols: pick()}
		if n := pick(); n >= 0 && n < 1<<16 {
			w.Data = make([]byte, n*rng.IntN(40))
		}
		batch := rng.IntN(11) - 1
		var x, y []float32
		if n := pick(); n >= 0 && n < 1<<16 {
			x = make([]float32, n*rng.IntN(9))
		}
		if n := pick(); n >= 0 && n < 1<<16 {
			y = make([]float32, n*rng.IntN(9))
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("MatMul(%d y, %v %d x %d with %d bytes, %d x, batch %d) panicked: %v", len(y), w.Type, w.Rows, w.Cols, len(w.Data), len(x), batch, r)
				}
			}()
			_ = kernels.MatMul(y, w, x, batch)
		}()
	}
}

// A shape whose product overflows an int is not mistaken for a match.
func TestF32MatrixOverflow(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int: MaxDim is small")
	}
	// MaxDim * MaxDim/2^16 = 2^64 (where int has 64 bits), which wraps to 0.
	rows, cols := kernels.MaxDim, kernels.MaxDim>>16
	if _, err := kernels.F32Matrix(rows, cols, nil); err == nil {
		t.Errorf("F32Matrix(%d, %d, nil): no error", rows, cols)
	}
}
