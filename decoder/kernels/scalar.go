package kernels

import "math"

// Lanes is the number of partial sums of the accumulation order contract:
// column c of a dot product feeds partial sum c mod Lanes.
const Lanes = 16

// MaxBatch is the largest number of vectors one product multiplies.
const MaxBatch = 8

// FMA32 returns a*b + c rounded once to binary32 (round to nearest, ties
// to even), the result of the VFMADD instructions on binary32 lanes. Go
// has no binary32 fused multiply-add, and float32(math.FMA(a, b, c))
// rounds twice: to float64, then to binary32. That is still the correct
// result unless the float64 lands exactly on a binary32 midpoint (a tie
// the exact value may not be) or in binary32's subnormal range, where the
// midpoints lie elsewhere; those rare cases take fma32Odd.
func FMA32(a, b, c float32) float32 {
	s := math.FMA(float64(a), float64(b), float64(c))
	// A binary32 midpoint of the normal range has a 1 followed by 28
	// zeros below binary32's 24 significant bits.
	if math.Float64bits(s)&(1<<29-1) != 1<<28 && math.Abs(s) >= 0x1p-126 {
		return float32(s)
	}
	return fma32Odd(a, b, c)
}

// fma32Odd computes a*b + c exactly as a float64 sum and its error term
// (a*b is exact in float64), rounds that sum to odd in float64, and
// rounds the result to binary32: rounding to odd first makes the second
// rounding correct, since float64 carries more than 24+2 bits (Boldo and
// Melquiond).
func fma32Odd(a, b, c float32) float32 {
	p := float64(a) * float64(b) // exact: 24+24 bits fit in 53
	cc := float64(c)
	s := p + cc
	// TwoSum: s + e == p + cc exactly.
	bb := s - p
	e := (p - (s - bb)) + (cc - bb)
	if e != 0 && !math.IsInf(s, 0) {
		bits := math.Float64bits(s)
		if bits&1 == 0 {
			// Move s one unit towards the exact value, onto the odd
			// neighbour; e's sign says which side the exact value lies.
			if (e > 0) == (s > 0) {
				bits++
			} else {
				bits--
			}
			s = math.Float64frombits(bits)
		}
	}
	return float32(s)
}

// reduce16 sums the 16 partial sums in the contract's fixed tree: halves
// first (lane j with lane j+8), then quarters, then pairs, then the last
// two, the lower lane first in every addition.
func reduce16(acc *[Lanes]float32) float32 {
	var s8 [8]float32
	for j := range 8 {
		s8[j] = acc[j] + acc[j+8]
	}
	var s4 [4]float32
	for j := range 4 {
		s4[j] = s8[j] + s8[j+4]
	}
	s2 := [2]float32{s4[0] + s4[2], s4[1] + s4[3]}
	return s2[0] + s2[1]
}

// rowFunc adds, for a run of n columns of one row of weights (w holds
// them from the run's first column on, in the kernel's dtype; n a multiple
// of Lanes, and of BlockSize for the block formats) and nb ≤ MaxBatch
// vectors (vector b's values for those columns from x[b*xstride] on), the
// products into the vectors' partial sums: acc[b][j] takes the run's
// columns c ≡ j mod Lanes, in increasing order, one FMA32 each. A run that
// starts at a multiple of Lanes thus continues the contract's partial sums
// where the previous run left them, which lets a product take its rows in
// column tiles.
type rowFunc func(w []byte, n int, x []float32, xstride, nb int, acc *accs)

// accs holds the partial sums of up to MaxBatch vectors for one row.
type accs = [MaxBatch][Lanes]float32

// blockFunc is a rowFunc over nrows ≤ rowBlock rows: row r's weights
// from w[r*wstride] on, its partial sums acc[r]. Kernels take several rows
// at once for the independent chains of fused multiply-adds they give.
type blockFunc func(w []byte, wstride, nrows, n int, x []float32, xstride, nb int, acc *[rowBlock]accs)

// perRow makes a blockFunc of a rowFunc, one row after the other.
func perRow(f rowFunc) blockFunc {
	return func(w []byte, wstride, nrows, n int, x []float32, xstride, nb int, acc *[rowBlock]accs) {
		for r := range nrows {
			f(w[r*wstride:], n, x, xstride, nb, &acc[r])
		}
	}
}

// The scalar reference kernels. They define the results every SIMD kernel
// must reproduce bit for bit.

func rowF32Scalar(w []byte, n int, x []float32, xstride, nb int, acc *accs) {
	var wv [Lanes]float32
	for c := 0; c < n; c += Lanes {
		for j := range Lanes {
			wv[j] = f32At(w, c+j)
		}
		lanesFMA(&wv, c, x, xstride, nb, acc)
	}
}

func rowBF16Scalar(w []byte, n int, x []float32, xstride, nb int, acc *accs) {
	var wv [Lanes]float32
	for c := 0; c < n; c += Lanes {
		for j := range Lanes {
			wv[j] = BF16ToFloat32(le16(w[2*(c+j):]))
		}
		lanesFMA(&wv, c, x, xstride, nb, acc)
	}
}

func rowQ8Scalar(w []byte, n int, x []float32, xstride, nb int, acc *accs) {
	var wv [Lanes]float32
	for c := 0; c < n; c += BlockSize {
		blk := w[c/BlockSize*q8BlockBytes:]
		d := HalfToFloat32(le16(blk))
		for h := 0; h < BlockSize; h += Lanes {
			for j := range Lanes {
				wv[j] = float32(int8(blk[2+h+j])) * d
			}
			lanesFMA(&wv, c+h, x, xstride, nb, acc)
		}
	}
}

func rowQ4Scalar(w []byte, n int, x []float32, xstride, nb int, acc *accs) {
	var wv [Lanes]float32
	for c := 0; c < n; c += BlockSize {
		blk := w[c/BlockSize*q4BlockBytes:]
		d := HalfToFloat32(le16(blk))
		for j := range Lanes {
			wv[j] = float32(int32(blk[2+j]&0xf)-8) * d
		}
		lanesFMA(&wv, c, x, xstride, nb, acc)
		for j := range Lanes {
			wv[j] = float32(int32(blk[2+j]>>4)-8) * d
		}
		lanesFMA(&wv, c+Lanes, x, xstride, nb, acc)
	}
}

// lanesFMA adds w[j]*x[b][c+j] into partial sum j of every vector b, with
// one rounding each (FMA32).
func lanesFMA(w *[Lanes]float32, c int, x []float32, xstride, nb int, acc *accs) {
	for b := range nb {
		xb := x[b*xstride+c : b*xstride+c+Lanes]
		a := &acc[b]
		for j := range Lanes {
			a[j] = FMA32(w[j], xb[j], a[j])
		}
	}
}
