package kernels

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// fma32Exact is a*b + c rounded once to binary32, computed with
// math/big at a precision that holds every such sum exactly.
func fma32Exact(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(1200).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetFloat64(float64(c)))
	f, _ := x.Float32()
	if f == 0 && x.Sign() == 0 {
		// An exact zero's sign: +0 unless both a*b and c are -0 (round
		// to nearest); big.Float does not track it.
		return a*b + c
	}
	return f
}

// TestFMA32 checks FMA32 against an exact computation on random operands
// (normal, subnormal and cancelling), and on a case where rounding the
// float64 fused result to binary32 rounds twice and errs.
func TestFMA32(t *testing.T) {
	// a*b = 1 + 2^-11 + 2^-24, a binary32 tie; c = 2^-70 breaks it upwards.
	a := float32(1 + 1.0/4096)
	c := float32(math.Ldexp(1, -70))
	want := float32(1 + 1.0/2048 + 1.0/(1<<23))
	if got := FMA32(a, a, c); got != want {
		t.Fatalf("FMA32 double-rounding case = %v, want %v", got, want)
	}
	// The same tie broken downwards, and an exact tie (to even).
	if got, want := FMA32(a, a, -c), float32(1+1.0/2048); got != want {
		t.Fatalf("FMA32 double-rounding case below = %v, want %v", got, want)
	}
	if got, want := FMA32(a, a, 0), float32(1+1.0/2048); got != want {
		t.Fatalf("FMA32 exact tie = %v, want %v", got, want)
	}
	// Results in binary32's subnormal range.
	tiny := float32(math.Ldexp(1, -75))
	for _, c := range []float32{0, math.Float32frombits(1), -math.Float32frombits(3)} {
		if got, want := FMA32(tiny, tiny*1.5, c), fma32Exact(tiny, tiny*1.5, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("FMA32 subnormal case = %v, want %v", got, want)
		}
	}
	if naive := float32(math.FMA(float64(a), float64(a), float64(c))); naive == want {
		t.Fatalf("the double-rounding case does not tell the naive fused float64 apart")
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	r := func() float32 {
		switch rng.IntN(8) {
		case 0:
			return math.Float32frombits(rng.Uint32() & 0x807f_ffff) // subnormal
		case 1:
			return 0
		}
		return float32((rng.Float64()*2 - 1) * math.Ldexp(1, rng.IntN(80)-40))
	}
	for range 200000 {
		a, b, c := r(), r(), r()
		if rng.IntN(4) == 0 {
			c = -a * b // cancellation
		}
		want := fma32Exact(a, b, c)
		if got := FMA32(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("FMA32(%v, %v, %v) = %v, want %v", a, b, c, got, want)
		}
		if got := fma32Odd(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32Odd(%v, %v, %v) = %v, want %v", a, b, c, got, want)
		}
	}
}

// TestScalarAgainstFloat64 bounds the scalar reference's error against
// the float64 dot product of the same (dequantized) weights and, for the
// block formats, the vectors as quantizeActs quantizes them: |ref - exact|
// ≤ k * 2^-24 * sum |w*x| with k = ceil(cols/16) + 4 + 15, the roundings
// on the longest path of the contract (a lane's fused multiply-adds, the
// four additions of the tree, the tail's fused multiply-adds), times 1.01
// for the higher-order terms.
func TestScalarAgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	p, err := NewPool(Options{Kernel: KernelScalar})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for trial := range 400 {
		ty := allTypes[trial%4]
		rows, cols, batch := randShape(rng, ty)
		w := randMatrix(rng, ty, rows, cols)
		x := randVec(rng, batch*cols)
		y := make([]float32, batch*rows)
		if err := p.MatMul(y, w, x, batch); err != nil {
			t.Fatal(err)
		}
		wf := make([]float32, rows*cols)
		if err := Dequantize(wf, ty, w.Data); err != nil {
			t.Fatal(err)
		}
		if ty.quantized() {
			// The block formats multiply the vectors quantized: the
			// bound holds against the quantized values.
			x = quantizedValues(x)
		}
		k := float64((cols+15)/16 + 4 + 15)
		for b := range batch {
			for r := range rows {
				var exact, mag float64
				for c := range cols {
					v := float64(wf[r*cols+c]) * float64(x[b*cols+c])
					exact += v
					mag += math.Abs(v)
				}
				bound := 1.01 * k * math.Ldexp(1, -24) * mag
				if e := math.Abs(float64(y[b*rows+r]) - exact); e > bound {
					t.Fatalf("%v %d x %d: y[%d][%d] = %v, float64 %v: error %g > bound %g", ty, rows, cols, b, r, y[b*rows+r], exact, e, bound)
				}
			}
		}
	}
}

// TestReduceTree pins the reduction tree with partial sums whose sum
// depends on the order.
func TestReduceTree(t *testing.T) {
	var acc [Lanes]float32
	big, one := float32(1<<24), float32(1)
	acc[0], acc[8] = big, one // s8[0] = 2^24 + 1 rounds to 2^24
	acc[4], acc[12] = one, one
	acc[1], acc[9] = -big, 0
	// Tree: s8 = {2^24, -2^24, 0, 0, 2, 0, 0, 0}; s4 = {2^24+2, -2^24, 0, 0};
	// s2 = {2^24+2, -2^24}; sum 2.
	if got := reduce16(&acc); got != 2 {
		t.Fatalf("reduce16 = %v, want 2", got)
	}
}

// quantizedValues returns the values quantizeActs gives x (a multiple of
// BlockSize long): each quant times its block's scale.
func quantizedValues(x []float32) []float32 {
	qx, xd := make([]byte, len(x)), make([]float32, len(x)/BlockSize)
	quantizeActs(qx, xd, x)
	out := make([]float32, len(x))
	for i := range out {
		out[i] = float32(int8(qx[i])) * xd[i/BlockSize]
	}
	return out
}

// TestQuantizeActsGolden quantizes hand-computed blocks: the scale is
// amax/127 rounded to binary16, the quants x*127/amax rounded to the
// nearest integer with ties to even, and a block of zeros is all zeros.
func TestQuantizeActsGolden(t *testing.T) {
	x := make([]float32, 3*BlockSize)
	// Block 0: amax 127, so id = 1 and the quants are x rounded, ties to even.
	copy(x, []float32{127, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.49, -126.6, 100.5})
	// Block 1: amax 1 (id 127, d = 1/127 rounded to binary16).
	copy(x[BlockSize:], []float32{1, -1, 0.5, -0.25, 1.0 / 254})
	// Block 2: zeros.
	qx, xd := make([]byte, len(x)), make([]float32, len(x)/BlockSize)
	quantizeActs(qx, xd, x)
	want0 := []int8{127, 2, 4, -2, -4, 0, 0, 1, -127, 100}
	for i, w := range want0 {
		if int8(qx[i]) != w {
			t.Errorf("block 0 quant %d of %v: %d, want %d", i, x[i], int8(qx[i]), w)
		}
	}
	if xd[0] != 1 {
		t.Errorf("block 0 scale %v, want 1", xd[0])
	}
	// 127*0.5 = 63.5 rounds to 64; 127*-0.25 = -31.75 to -32; 127/254 = 0.5 to 0.
	want1 := []int8{127, -127, 64, -32, 0}
	for i, w := range want1 {
		if int8(qx[BlockSize+i]) != w {
			t.Errorf("block 1 quant %d of %v: %d, want %d", i, x[BlockSize+i], int8(qx[BlockSize+i]), w)
		}
	}
	if want := HalfToFloat32(Float32ToHalf(float32(1) / 127)); xd[1] != want || xd[1] == float32(1)/127 {
		t.Errorf("block 1 scale %v, want %v (1/127 rounded to binary16)", xd[1], want)
	}
	for i := 2 * BlockSize; i < len(x); i++ {
		if qx[i] != 0 {
			t.Fatalf("quant %d of a block of zeros: %d", i, int8(qx[i]))
		}
	}
	if xd[2] != 0 {
		t.Errorf("scale of a block of zeros %v", xd[2])
	}
}

// quantizeActsRef is quantizeActs written plainly: the rounding by
// math.RoundToEven, the clamps explicit.
func quantizeActsRef(qx []byte, xd []float32, x []float32) {
	for b := 0; b < len(x)/BlockSize; b++ {
		v := x[b*BlockSize : (b+1)*BlockSize]
		var amax float32
		for _, f := range v {
			if a := abs32(f); a > amax || a != a {
				amax = a
			}
		}
		xd[b] = HalfToFloat32(Float32ToHalf(amax / 127))
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		for i, f := range v {
			p := float32(f * id)
			switch {
			case p != p:
				qx[b*BlockSize+i] = 0
			case p >= 127:
				qx[b*BlockSize+i] = 127
			case p <= -127:
				qx[b*BlockSize+i] = byte(0x81) // -127
			default:
				qx[b*BlockSize+i] = byte(int8(math.RoundToEven(float64(p))))
			}
		}
	}
}

// TestQuantizeActsMatchesRef holds quantizeActs to quantizeActsRef on
// quantTestData's blocks: the same quants, and the same scales (NaN for
// NaN).
func TestQuantizeActsMatchesRef(t *testing.T) {
	x := quantTestData(4000)
	q, d := make([]byte, len(x)), make([]float32, len(x)/BlockSize)
	qr, dr := make([]byte, len(x)), make([]float32, len(x)/BlockSize)
	quantizeActs(q, d, x)
	quantizeActsRef(qr, dr, x)
	if err := sameQuants(x, q, d, qr, dr); err != nil {
		t.Fatal(err)
	}
}

// TestQuantizeKernelsMatch holds every SIMD kernel's quantizer of the
// vectors to quantizeActs on TestQuantizeActsMatchesRef's blocks and on
// random lengths.
func TestQuantizeKernelsMatch(t *testing.T) {
	x := quantTestData(4000)
	for _, k := range simdKernels {
		for _, n := range []int{len(x), BlockSize, 3 * BlockSize} {
			x := x[len(x)-n:]
			q, d := make([]byte, n), make([]float32, n/BlockSize)
			qr, dr := make([]byte, n), make([]float32, n/BlockSize)
			k.quantize(q, d, x)
			quantizeActs(qr, dr, x)
			if err := sameQuants(x, q, d, qr, dr); err != nil {
				t.Fatalf("%s, %v", k.name, err)
			}
		}
	}
}

// sameQuants compares two quantizations of x: the same quants, and the
// same scales (NaN for NaN).
func sameQuants(x []float32, q []byte, d []float32, qr []byte, dr []float32) error {
	for i := range q {
		if q[i] != qr[i] {
			return fmt.Errorf("quant %d of %v (block %v): %d, reference %d", i, x[i], x[i/BlockSize*BlockSize:][:BlockSize], int8(q[i]), int8(qr[i]))
		}
	}
	for b := range d {
		if d[b] != dr[b] && !(d[b] != d[b] && dr[b] != dr[b]) {
			return fmt.Errorf("scale of block %d: %v, reference %v", b, d[b], dr[b])
		}
	}
	return nil
}

// quantTestData returns blocks blocks of values for the quantizers'
// tests: random blocks of every scale, blocks of exact ties (halves at
// amax 127), zeros, subnormals and non-finite values.
func quantTestData(blocks int) []float32 {
	rng := rand.New(rand.NewPCG(11, 12))
	x := make([]float32, blocks*BlockSize)
	for b := range blocks {
		v := x[b*BlockSize : (b+1)*BlockSize]
		switch b % 8 {
		case 0: // halves: amax 127, so x*id is x
			for i := range v {
				v[i] = float32(rng.IntN(254)-127) + 0.5
			}
			v[rng.IntN(BlockSize)] = 127
		case 1: // zeros and signed zeros
			for i := range v {
				v[i] = float32(math.Copysign(0, float64(rng.IntN(2)*2-1)))
			}
		case 2: // subnormals and tiny values
			for i := range v {
				v[i] = math.Float32frombits(uint32(rng.IntN(1<<23))) * float32(rng.IntN(3)-1)
			}
		case 3: // a non-finite value among numbers
			for i := range v {
				v[i] = randF32(rng)
			}
			v[rng.IntN(BlockSize)] = []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}[rng.IntN(3)]
		default:
			scale := math.Ldexp(1, rng.IntN(80)-40)
			for i := range v {
				v[i] = float32(rng.NormFloat64() * scale)
			}
		}
	}
	return x
}
