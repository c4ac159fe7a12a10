package kernels

import (
	"fmt"
	"math"
)

// DType is the storage type of a weight matrix.
type DType int

// The storage types the kernels read.
const (
	// F32 stores each weight as a little-endian IEEE 754 binary32.
	F32 DType = iota + 1
	// BF16 stores each weight as the upper 16 bits of a binary32
	// (bfloat16), little-endian.
	BF16
	// Q8_0 stores blocks of 32 weights as llama.cpp does: a little-endian
	// binary16 scale d, then 32 signed bytes q; weight i is q[i]*d.
	Q8_0
	// Q4_0 stores blocks of 32 weights as llama.cpp does: a little-endian
	// binary16 scale d, then 16 bytes; weight i < 16 is the low nibble of
	// byte i, weight i+16 its high nibble, and a nibble n stands for
	// (n-8)*d.
	Q4_0
)

// MaxDim bounds a matrix's rows and columns, so that no size computed
// from them overflows an int: 2^40 where int has 64 bits, 2^24 where it
// has 32.
const MaxDim = 1 << 24 << (16 * (^uint(0) >> 63))

// BlockSize is the number of weights in one Q8_0 or Q4_0 block.
const BlockSize = 32

// Bytes of one block, scale included.
const (
	q8BlockBytes = 2 + BlockSize
	q4BlockBytes = 2 + BlockSize/2
)

// String returns the name llama.cpp and Hugging Face use for the type.
func (t DType) String() string {
	switch t {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case Q8_0:
		return "q8_0"
	case Q4_0:
		return "q4_0"
	}
	return fmt.Sprintf("DType(%d)", int(t))
}

// quantized reports whether t stores blocks of BlockSize weights.
func (t DType) quantized() bool { return t == Q8_0 || t == Q4_0 }

// RowBytes returns the bytes one row of cols weights takes in type t, or
// an error if t is unknown, cols is negative, or t is a block format and
// cols is not a multiple of BlockSize.
func RowBytes(t DType, cols int) (int, error) {
	if cols < 0 || cols > MaxDim {
		return 0, fmt.Errorf("kernels: cols %d is outside 0..%d", cols, MaxDim)
	}
	if t.quantized() && cols%BlockSize != 0 {
		return 0, fmt.Errorf("kernels: cols %d of a %v matrix is not a multiple of %d (the block size)", cols, t, BlockSize)
	}
	switch t {
	case F32:
		return 4 * cols, nil
	case BF16:
		return 2 * cols, nil
	case Q8_0:
		return cols / BlockSize * q8BlockBytes, nil
	case Q4_0:
		return cols / BlockSize * q4BlockBytes, nil
	}
	return 0, fmt.Errorf("kernels: unknown dtype %v (allowed: f32, bf16, q8_0, q4_0)", t)
}

// HalfToFloat32 returns the binary16 value h as a binary32; every binary16
// value, subnormals included, is exact in binary32. A NaN keeps its sign
// and its payload (shifted into the wider fraction), as F16C's VCVTPH2PS
// converts it.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f80_0000 | frac<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
	case frac == 0: // ±0
		return math.Float32frombits(sign)
	}
	// Subnormal: frac * 2^-24, exact in binary32.
	v := float32(frac) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// Float32ToHalf rounds f to the nearest binary16, ties to even (the
// rounding of F16C's VCVTPS2PH with mode 0 and of ggml's conversion):
// magnitudes past the largest finite binary16 become ±Inf, tiny ones
// subnormals or ±0; a NaN stays a (quiet) NaN.
func Float32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	frac := b & 0x7f_ffff
	if exp == 0xff {
		if frac != 0 {
			return sign | 0x7e00 | uint16(frac>>13)
		}
		return sign | 0x7c00
	}
	// e is the binary16 biased exponent of a normal result.
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	var mant uint32 // significand with the implicit bit, 24 bits
	var shift uint32
	if e <= 0 {
		// Subnormal (or zero) in binary16: the value is mant*2^(exp-150),
		// a binary16 subnormal unit is 2^-24.
		if exp == 0 {
			return sign // binary32 subnormals are far below binary16's range
		}
		mant = frac | 0x80_0000
		s := int32(14 - e) // 13 + (1 - e)
		if s > 24 {
			return sign
		}
		shift = uint32(s)
	} else {
		mant = frac | 0x80_0000
		shift = 13
	}
	q := mant >> shift
	rem := mant & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	if e <= 0 {
		// q is the subnormal significand; a carry into 0x400 is the
		// smallest normal, which the same encoding expresses.
		return sign | uint16(q)
	}
	// q has the implicit bit at 0x400; a carry to 0x800 bumps the exponent.
	return sign | uint16(uint32(e)<<10+q-0x400)
}

// BF16ToFloat32 widens a bfloat16 exactly: its 16 bits become the upper
// half of a binary32.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds f to the nearest bfloat16, ties to even; a NaN
// stays a quiet NaN.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fff_ffff > 0x7f80_0000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// QuantizeQ8_0 writes src (a multiple of BlockSize values) into dst as
// Q8_0 blocks and returns the bytes written. Each block follows llama.cpp's
// reference quantizer: amax = max |x|, d = amax/127 (binary32), id = 1/d
// (0 when d is 0), q = round(x*id) with halves away from zero, and the
// scale stored is d rounded to binary16. Values that are not finite give
// unspecified (but in-range) bytes.
func QuantizeQ8_0(dst []byte, src []float32) (int, error) {
	n, err := quantCheck(Q8_0, dst, src)
	if err != nil {
		return 0, err
	}
	for b := 0; b < len(src)/BlockSize; b++ {
		x := src[b*BlockSize : (b+1)*BlockSize]
		out := dst[b*q8BlockBytes : (b+1)*q8BlockBytes]
		var amax float32
		for _, v := range x {
			amax = max(amax, abs32(v))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		h := Float32ToHalf(d)
		out[0], out[1] = byte(h), byte(h>>8)
		for i, v := range x {
			out[2+i] = byte(int8(clampRound(v*id, -127, 127)))
		}
	}
	return n, nil
}

// QuantizeQ4_0 writes src (a multiple of BlockSize values) into dst as
// Q4_0 blocks and returns the bytes written. Each block follows llama.cpp's
// reference quantizer: max is the value of largest magnitude (the first
// one on a tie), with its sign; d = max / -8, id = 1/d (0 when d is 0);
// each nibble is min(15, trunc(x*id + 8.5)) computed in binary32 (x*id
// lies in [-8, 8], so the truncation is a floor and never negative), and
// the scale stored is d rounded to binary16. The value of largest
// magnitude thus maps to nibble 0 (-8*d exactly, up to the scale's
// rounding), values of the other sign up to +8 clamp at 15. Values that
// are not finite give unspecified (but in-range) bytes.
func QuantizeQ4_0(dst []byte, src []float32) (int, error) {
	n, err := quantCheck(Q4_0, dst, src)
	if err != nil {
		return 0, err
	}
	for b := 0; b < len(src)/BlockSize; b++ {
		x := src[b*BlockSize : (b+1)*BlockSize]
		out := dst[b*q4BlockBytes : (b+1)*q4BlockBytes]
		var amax, mx float32
		for _, v := range x {
			if amax < abs32(v) {
				amax, mx = abs32(v), v
			}
		}
		d := mx / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		h := Float32ToHalf(d)
		out[0], out[1] = byte(h), byte(h>>8)
		for j := range BlockSize / 2 {
			x0 := x[j]*id + 8.5
			x1 := x[j+BlockSize/2]*id + 8.5
			out[2+j] = nibble(x0) | nibble(x1)<<4
		}
	}
	return n, nil
}

// nibble is min(15, trunc(v)) for v ≥ 0, and 0 for anything else (a NaN
// from a non-finite input).
func nibble(v float32) byte {
	if !(v >= 0) {
		return 0
	}
	if v >= 15 {
		return 15
	}
	return byte(v)
}

// clampRound rounds v to the nearest integer, halves away from zero (C's
// roundf), and clamps it to [lo, hi]; a NaN gives 0.
func clampRound(v float32, lo, hi float64) float64 {
	if v != v {
		return 0
	}
	r := math.Round(float64(v))
	return max(lo, min(hi, r))
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// quantCheck checks the lengths of a quantization and returns the bytes
// it writes.
func quantCheck(t DType, dst []byte, src []float32) (int, error) {
	if len(src)%BlockSize != 0 {
		return 0, fmt.Errorf("kernels: %v quantization of %d values: the count must be a multiple of %d", t, len(src), BlockSize)
	}
	n, err := RowBytes(t, len(src))
	if err != nil {
		return 0, err
	}
	if len(dst) < n {
		return 0, fmt.Errorf("kernels: %v quantization of %d values needs %d bytes, dst has %d", t, len(src), n, len(dst))
	}
	return n, nil
}

// Encode returns src stored in type t: little-endian binary32 for F32,
// each value rounded to bfloat16 (Float32ToBF16) for BF16, QuantizeQ8_0's
// and QuantizeQ4_0's blocks for the block formats (len(src) then a
// multiple of BlockSize). Rows of a matrix are encoded by encoding its
// values in row-major order, since a row of a block format holds whole
// blocks. Dequantize reads the result back: exactly for F32, to the
// rounded values for the others.
func Encode(t DType, src []float32) ([]byte, error) {
	n, err := RowBytes(t, len(src))
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	switch t {
	case F32:
		for i, f := range src {
			u := math.Float32bits(f)
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
	case BF16:
		for i, f := range src {
			h := Float32ToBF16(f)
			b[2*i], b[2*i+1] = byte(h), byte(h>>8)
		}
	case Q8_0:
		_, err = QuantizeQ8_0(b, src)
	case Q4_0:
		_, err = QuantizeQ4_0(b, src)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Dequantize writes the len(dst) weights that src holds in type t (a
// block format, or BF16 or F32) into dst as binary32 values: q*d for Q8_0,
// (n-8)*d for Q4_0 (both products exact in binary32), the exact widening
// for BF16. len(dst) must be a multiple of BlockSize for the block
// formats, and src must hold at least RowBytes(t, len(dst)) bytes.
func Dequantize(dst []float32, t DType, src []byte) error {
	n, err := RowBytes(t, len(dst))
	if err != nil {
		return err
	}
	if len(src) < n {
		return fmt.Errorf("kernels: %d %v values need %d bytes, src has %d", len(dst), t, n, len(src))
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le32(src[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToFloat32(le16(src[2*i:]))
		}
	case Q8_0:
		for b := 0; b < len(dst)/BlockSize; b++ {
			blk := src[b*q8BlockBytes:]
			d := HalfToFloat32(le16(blk))
			for i := range BlockSize {
				dst[b*BlockSize+i] = float32(int8(blk[2+i])) * d
			}
		}
	case Q4_0:
		for b := 0; b < len(dst)/BlockSize; b++ {
			blk := src[b*q4BlockBytes:]
			d := HalfToFloat32(le16(blk))
			for j := range BlockSize / 2 {
				q := blk[2+j]
				dst[b*BlockSize+j] = float32(int32(q&0xf)-8) * d
				dst[b*BlockSize+j+BlockSize/2] = float32(int32(q>>4)-8) * d
			}
		}
	}
	return nil
}

func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func f32At(b []byte, i int) float32 { return math.Float32frombits(le32(b[4*i:])) }
