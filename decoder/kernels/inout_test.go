package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestInOutKernelsMatchScalar runs every SIMD kernel's in-out products
// against the scalar reference on random shapes (any column count, so
// the 8-column kernels and the scalar tail run too; batches 1 to 8; 1 to
// 3 workers; rows across several row blocks) and requires equal bits.
func TestInOutKernelsMatchScalar(t *testing.T) {
	if len(simdKernels) == 0 {
		t.Skip("no SIMD kernel on this machine: products use the scalar reference")
	}
	seed := seedNow()
	t.Logf("seed %d", seed)
	for _, k := range simdKernels {
		if err := diffInOut(k, seed, 400); err != nil {
			t.Error(err)
		}
	}
}

// TestInOutKernelsLongRows covers the shapes of a decoder's layers: many
// rows (inputs), wide outputs, full batches.
func TestInOutKernelsLongRows(t *testing.T) {
	seed := seedNow()
	rng := rand.New(rand.NewPCG(seed, 41))
	ref, err := NewPool(Options{Workers: 1, Kernel: KernelScalar})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	for _, k := range simdKernels {
		for _, ty := range []DType{F32, BF16} {
			for _, sh := range []struct{ ins, outs, batch int }{{1408, 520, 4}, {515, 1029, 8}, {2048, 3, 1}} {
				if err := diffInOutWith(k, ref, rng, ty, sh.ins, sh.outs, sh.batch); err != nil {
					t.Errorf("seed %d: %v", seed, err)
				}
			}
		}
	}
}

func diffInOut(k *kernel, seed uint64, trials int) error {
	rng := rand.New(rand.NewPCG(seed, 42))
	ref, err := NewPool(Options{Workers: 1, Kernel: KernelScalar})
	if err != nil {
		return err
	}
	defer ref.Close()
	for trial := range trials {
		ty := []DType{F32, BF16}[trial%2]
		ins, outs, batch := 1+rng.IntN(100), rng.IntN(300), 1+rng.IntN(MaxBatch)
		if trial < 4 {
			batch = MaxBatch
		}
		if trial%5 == 4 {
			outs = 64*(1+rng.IntN(8)) + 8*rng.IntN(8) // whole tiles and 8-column kernels, no tail
		}
		if err := diffInOutWith(k, ref, rng, ty, ins, outs, batch); err != nil {
			return fmt.Errorf("seed %d: %w", seed, err)
		}
	}
	return nil
}

func diffInOutWith(k *kernel, ref *Pool, rng *rand.Rand, ty DType, ins, outs, batch int) error {
	w := randMatrix(rng, ty, ins, outs)
	x := randVec(rng, batch*ins)
	got, want := make([]float32, batch*outs), make([]float32, batch*outs)
	for i := range got {
		got[i] = float32(math.NaN()) // every output must be written
	}
	p, err := NewPool(Options{Workers: 1 + rng.IntN(3)})
	if err != nil {
		return err
	}
	p.k = k
	err = p.MatMulInOut(got, w, x, batch)
	p.Close()
	if err != nil {
		return err
	}
	if err := ref.MatMulInOut(want, w, x, batch); err != nil {
		return err
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("%s, in-out %v %d in x %d out, batch %d: y[%d] (vector %d, output %d) = %v (%#08x), scalar %v (%#08x)",
				k.name, ty, ins, outs, batch, i, i/max(outs, 1), i%max(outs, 1), got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
	return nil
}

// TestInOutScalarDefinition: the scalar reference is the documented
// order, written out here independently: each output's sum from +0, the
// rows in increasing order, one FMA32 each; and it is within float32
// rounding of the float64 sum.
func TestInOutScalarDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, ty := range []DType{F32, BF16} {
		const ins, outs, batch = 77, 45, 3
		w := randMatrix(rng, ty, ins, outs)
		x := randVec(rng, batch*ins)
		p, err := NewPool(Options{Kernel: KernelScalar, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		y := make([]float32, batch*outs)
		if err := p.MatMulInOut(y, w, x, batch); err != nil {
			t.Fatal(err)
		}
		p.Close()
		rb, _ := RowBytes(ty, outs)
		for b := range batch {
			for c := range outs {
				var s float32
				var s64, abs float64
				for i := range ins {
					wv := weightAt(ty, w.Data[i*rb:], c)
					s = FMA32(x[b*ins+i], wv, s)
					s64 += float64(x[b*ins+i]) * float64(wv)
					abs += math.Abs(float64(x[b*ins+i]) * float64(wv))
				}
				if got := y[b*outs+c]; math.Float32bits(got) != math.Float32bits(s) {
					t.Fatalf("%v: y[%d][%d] = %v, the definition %v", ty, b, c, got, s)
				}
				if e := math.Abs(float64(s) - s64); e > float64(ins)*0x1p-24*abs {
					t.Fatalf("%v: y[%d][%d] = %v, float64 %v: error %g above the bound", ty, b, c, s, s64, e)
				}
			}
		}
	}
}

// TestInOutBadShapes: a block format, a wrong length or batch is an error
// that leaves y untouched.
func TestInOutBadShapes(t *testing.T) {
	w := Matrix{Type: F32, Rows: 4, Cols: 3, Data: make([]byte, 4*3*4)}
	for _, c := range []struct {
		name string
		y, x []float32
		w    Matrix
		b    int
	}{
		{"q8_0", make([]float32, 32), make([]float32, 4), Matrix{Type: Q8_0, Rows: 4, Cols: 32, Data: make([]byte, 4*34)}, 1},
		{"x short", make([]float32, 3), make([]float32, 3), w, 1},
		{"y short", make([]float32, 2), make([]float32, 4), w, 1},
		{"data short", make([]float32, 3), make([]float32, 4), Matrix{Type: F32, Rows: 4, Cols: 3, Data: make([]byte, 47)}, 1},
		{"batch 9", make([]float32, 27), make([]float32, 36), w, 9},
		{"batch 0", nil, nil, w, 0},
	} {
		for i := range c.y {
			c.y[i] = 5
		}
		if err := MatMulInOut(c.y, c.w, c.x, c.b); err == nil {
			t.Errorf("%s: no error", c.name)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
		for i, v := range c.y {
			if v != 5 {
				t.Fatalf("%s: y[%d] written (%v)", c.name, i, v)
			}
		}
	}
}

// TestInOutAllocs: an in-out product allocates nothing once the pool runs.
func TestInOutAllocs(t *testing.T) {
	for _, name := range Kernels() {
		p, err := NewPool(Options{Kernel: name, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		w := Matrix{Type: BF16, Rows: 64, Cols: 300, Data: make([]byte, 64*300*2)}
		x, y := make([]float32, 5*64), make([]float32, 5*300)
		allocs := testing.AllocsPerRun(20, func() {
			if err := p.MatMulInOut(y, w, x, 5); err != nil {
				t.Fatal(err)
			}
		})
		p.Close()
		if allocs != 0 {
			t.Errorf("kernel %s: %v allocations an in-out product, want 0", name, allocs)
		}
	}
}

// TestParallel: every chunk runs once, on at most the pool's workers; a
// chunk count outside 1..Workers or a closed pool is an error; a call
// allocates nothing.
func TestParallel(t *testing.T) {
	p, err := NewPool(Options{Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	var hits [3]int
	f := func(i int) { hits[i]++ }
	for chunks := 1; chunks <= 3; chunks++ {
		hits = [3]int{}
		if err := p.Parallel(chunks, f); err != nil {
			t.Fatal(err)
		}
		for i, h := range hits {
			if want := map[bool]int{true: 1, false: 0}[i < chunks]; h != want {
				t.Fatalf("%d chunks: chunk %d ran %d times", chunks, i, h)
			}
		}
	}
	if a := testing.AllocsPerRun(20, func() { _ = p.Parallel(3, f) }); a != 0 {
		t.Errorf("%v allocations a call, want 0", a)
	}
	for _, n := range []int{0, 4} {
		if err := p.Parallel(n, f); err == nil {
			t.Errorf("Parallel(%d) on 3 workers: no error", n)
		}
	}
	p.Close()
	if err := p.Parallel(1, f); err != ErrClosed {
		t.Errorf("Parallel on a closed pool: %v, want ErrClosed", err)
	}
}
