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

// qrowFunc is a rowFunc of the block formats, which multiply their
// weights with the vectors quantized to blocks of 8-bit integers
// (quantizeActs): qx holds vector b's quants for the run's columns from
// qx[b*xstride] on, xd its blocks' scales from xd[b*dstride] on. It adds
// into partial sums 0-7 only: partial sum j takes, block after block, the
// integer dot product of the block's columns 4j..4j+3, times the product
// of the two blocks' scales, one FMA32 each (see the package
// documentation); partial sums 8-15 stay as they are.
type qrowFunc func(w []byte, n int, qx []byte, xd []float32, xstride, dstride, nb int, acc *accs)

// qblockFunc is a qrowFunc over nrows ≤ rowBlock rows, row r's weights
// from w[r*wstride] on, its partial sums acc[r].
type qblockFunc func(w []byte, wstride, nrows, n int, qx []byte, xd []float32, xstride, dstride, nb int, acc *[rowBlock]accs)

// perQRow makes a qblockFunc of a qrowFunc, one row after the other.
func perQRow(f qrowFunc) qblockFunc {
	return func(w []byte, wstride, nrows, n int, qx []byte, xd []float32, xstride, dstride, nb int, acc *[rowBlock]accs) {
		for r := range nrows {
			f(w[r*wstride:], n, qx, xd, xstride, dstride, nb, &acc[r])
		}
	}
}

// QLanes is the number of partial sums of a block format's products: a
// block of BlockSize columns feeds each of them the integer dot product
// of 4 consecutive columns.
const QLanes = 8

func rowQ8Scalar(w []byte, n int, qx []byte, xd []float32, xstride, dstride, nb int, acc *accs) {
	var q [BlockSize]int32
	for c := 0; c < n; c += BlockSize {
		blk := w[c/BlockSize*q8BlockBytes:]
		for i := range BlockSize {
			q[i] = int32(int8(blk[2+i]))
		}
		blockDot(&q, HalfToFloat32(le16(blk)), c, qx, xd, xstride, dstride, nb, acc)
	}
}

func rowQ4Scalar(w []byte, n int, qx []byte, xd []float32, xstride, dstride, nb int, acc *accs) {
	var q [BlockSize]int32
	for c := 0; c < n; c += BlockSize {
		blk := w[c/BlockSize*q4BlockBytes:]
		for j := range BlockSize / 2 {
			q[j] = int32(blk[2+j]&0xf) - 8
			q[j+BlockSize/2] = int32(blk[2+j]>>4) - 8
		}
		blockDot(&q, HalfToFloat32(le16(blk)), c, qx, xd, xstride, dstride, nb, acc)
	}
}

// blockDot adds one block of weights (quants q, scale dw; the block's
// first column c) times every vector's quantized block into partial sums
// 0-7: partial sum j takes float32(sum of q[4j+i]*qx[4j+i], i < 4), an
// exact integer, times dw*dx (exact: two binary16 significands), one
// FMA32.
func blockDot(q *[BlockSize]int32, dw float32, c int, qx []byte, xd []float32, xstride, dstride, nb int, acc *accs) {
	for b := range nb {
		xb := qx[b*xstride+c : b*xstride+c+BlockSize]
		s := dw * xd[b*dstride+c/BlockSize]
		a := &acc[b]
		for j := range QLanes {
			var dot int32
			for i := 4 * j; i < 4*j+4; i++ {
				dot += q[i] * int32(int8(xb[i]))
			}
			a[j] = FMA32(float32(dot), s, a[j])
		}
	}
}

// quantizeActs quantizes the values of x (a multiple of BlockSize of
// them) to blocks of 8-bit integers, as the block formats' products
// multiply them: for each block, amax = max |x|, the scale
// d = amax/127 rounded to binary16 (widened back into xd), id = 127/amax
// (0 when amax is 0), and quant i = x[i]*id (binary32) rounded to the
// nearest integer, ties to even, clamped to ±127 (a NaN gives 0). The
// rounding is VCVTPS2DQ's under the default rounding mode, so that the
// SIMD quantizers write the same bytes.
func quantizeActs(qx []byte, xd []float32, x []float32) {
	for c := 0; c+BlockSize <= len(x); c += BlockSize {
		v := (*[BlockSize]float32)(x[c : c+BlockSize])
		// The largest magnitude by its bits: for numbers their order is
		// the bits' order, and a NaN's bits lie above every number's.
		var bits uint32
		for _, f := range v {
			bits = max(bits, math.Float32bits(f)&^(1<<31))
		}
		amax := math.Float32frombits(bits)
		xd[c/BlockSize] = HalfToFloat32(Float32ToHalf(amax / 127))
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		q := (*[BlockSize]byte)(qx[c : c+BlockSize])
		for i, f := range v {
			// |p| ≤ amax*id < 127.5, or p is a NaN (a NaN or an
			// infinity in the block), or an infinity (a subnormal amax,
			// whose 127/amax overflows). Adding 1.5*2^23 rounds p to an
			// integer, ties to even, in the significand's low bits.
			p := float32(f * id)
			if p != p {
				q[i] = 0
				continue
			}
			r := float32(max(-127, min(127, p)) + 0x1.8p23)
			q[i] = byte(int32(math.Float32bits(r)) - 0x4b40_0000)
		}
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
