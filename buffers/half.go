package buffers

import (
	"math"
	"unsafe"

	"github.com/zinfio/zinf/tensor"
)

// BFloat16 is a brain float: the top 16 bits of an IEEE float32 (1 sign,
// 8 exponent, 7 mantissa bits). Same range as float32, less precision.
type BFloat16 uint16

// Float16 is an IEEE 754 binary16 half float (1 sign, 5 exponent, 10
// mantissa bits): largest finite 65504, smallest subnormal 2^-24.
type Float16 uint16

// BFloat16FromFloat32 rounds f to the nearest bfloat16, ties to even.
// Values beyond the largest bfloat16 round to ±Inf as IEEE rounding says;
// ±Inf stays ±Inf; a NaN stays a NaN with its sign and top payload bits and
// the quiet bit set (rounding must not carry a NaN into Inf).
func BFloat16FromFloat32(f float32) BFloat16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return BFloat16(u>>16 | 0x0040)
	}
	// Add just under half an ulp, plus one when the kept part is odd: the
	// carry then rounds up exactly when the dropped part is above half, or
	// exactly half with an odd kept part.
	u += 0x7fff + (u>>16)&1
	return BFloat16(u >> 16)
}

// Float32 widens h exactly.
func (h BFloat16) Float32() float32 { return math.Float32frombits(uint32(h) << 16) }

// Float16FromFloat32 rounds f to the nearest binary16, ties to even:
// magnitudes that round past 65504 become ±Inf, small ones become correctly
// rounded subnormals or ±0, ±Inf stays ±Inf. A NaN keeps its sign and its top
// 10 payload bits (so every half NaN survives a round trip through float32
// bit for bit); if those bits are all zero the quiet bit is set so the result
// is still a NaN. (Checked against a slow reference on all 2^32 inputs.)
func Float16FromFloat32(f float32) Float16 {
	u := math.Float32bits(f)
	sign := Float16(u>>16) & 0x8000
	mag := u & 0x7fffffff
	switch {
	case mag >= 0x47800000: // |f| >= 65536: overflow, Inf or NaN
		if mag > 0x7f800000 {
			payload := Float16(mag>>13) & 0x3ff
			if payload == 0 {
				payload = 0x200
			}
			return sign | 0x7c00 | payload
		}
		return sign | 0x7c00
	case mag < 0x38800000: // |f| < 2^-14: a subnormal half, or zero
		// In [0.5, 1) a float32's ulp is 2^-24, the half subnormal step, so
		// adding 0.5 makes the FPU round |f| to that step, ties to even; the
		// sum's low bits are then the half's mantissa (1024 = the smallest
		// normal, which is the right encoding too).
		s := math.Float32frombits(mag) + 0.5
		return sign | Float16(math.Float32bits(s)-0x3f000000)
	}
	// A normal half: rebias the exponent, then round the 13 dropped mantissa
	// bits to nearest even by adding just under half, plus one when the kept
	// part is odd. A carry may run into the exponent, up to Inf: correct.
	mag -= (127 - 15) << 23
	mag += 0xfff + (mag>>13)&1
	return sign | Float16(mag>>13)
}

// Float32 widens h exactly (NaN payloads kept).
func (h Float16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	mag := uint32(h&0x7fff) << 13
	if mag >= 0x7c00<<13 { // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mag)
	}
	// Read in place, the shifted bits are a float32 (normal, or subnormal for
	// a subnormal half) exactly 2^112 times too small; the product is exact.
	f := math.Float32frombits(mag) * 0x1p112
	return math.Float32frombits(math.Float32bits(f) | sign)
}

// Float32ToBFloat16 converts min(len(dst), len(src)) values; it never panics
// on mismatched lengths. On amd64 with AVX2 it rounds 16 values a loop
// (the bf16 parameters written back after every update), bit for bit as
// BFloat16FromFloat32.
func Float32ToBFloat16(dst []BFloat16, src []float32) {
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	done := narrowBF16(dst, src)
	for i, f := range src[done:] {
		dst[done+i] = BFloat16FromFloat32(f)
	}
}

// BFloat16ToFloat32 converts min(len(dst), len(src)) values. The
// conversion is exact (a bfloat16 is a float32's upper half), so every bit
// pattern, NaNs and subnormals included, widens to the same float32 by any
// method; on amd64 with AVX2 it runs 16 values an instruction loop (the
// hot path of a bf16 model computed in fp32: every weight of every pass).
func BFloat16ToFloat32(dst []float32, src []BFloat16) {
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	done := widenBF16(dst, src)
	for i, h := range src[done:] {
		dst[done+i] = math.Float32frombits(uint32(h) << 16)
	}
}

// widenNTBytes is the widening (in destination bytes) above which the
// amd64 kernel writes with non-temporal stores: far beyond the caches,
// where a regular store first reads each line it writes (on the
// development VM a 160 MiB bf16 tensor widened in 50-59 ms with regular
// stores, 18-20 ms streamed).
const widenNTBytes = 4 << 20

// bf16ToFloat32Scalar is BFloat16ToFloat32 without the vector kernel: the
// reference its tests compare the kernel with.
func bf16ToFloat32Scalar(dst []float32, src []BFloat16) {
	n := min(len(dst), len(src))
	for i, h := range src[:n] {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// Float32ToFloat16 converts min(len(dst), len(src)) values.
func Float32ToFloat16(dst []Float16, src []float32) {
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	for i, f := range src {
		dst[i] = Float16FromFloat32(f)
	}
}

// Float16ToFloat32 converts min(len(dst), len(src)) values.
func Float16ToFloat32(dst []float32, src []Float16) {
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	for i, h := range src {
		dst[i] = h.Float32()
	}
}

// Encode converts src (fp32) into dst as len(src) little-endian elements of
// d; dst must hold len(src)*d.Size() bytes and start on a multiple of
// d.Size() (Transcode takes any alignment).
func Encode(d tensor.DType, dst []byte, src []float32) {
	switch d {
	case tensor.BFloat16:
		Float32ToBFloat16(BFloat16Bytes(dst), src)
	case tensor.Float16:
		Float32ToFloat16(Float16Bytes(dst), src)
	default:
		copy(Float32Bytes(dst), src)
	}
}

// Decode converts len(dst) little-endian elements of d in src to fp32;
// src must start on a multiple of d.Size() (Transcode takes any
// alignment).
func Decode(d tensor.DType, dst []float32, src []byte) {
	switch d {
	case tensor.BFloat16:
		BFloat16ToFloat32(dst, BFloat16Bytes(src))
	case tensor.Float16:
		Float16ToFloat32(dst, Float16Bytes(src))
	default:
		copy(dst, Float32Bytes(src))
	}
}

// transcodeChunk is how many elements Transcode converts at a time through
// a float32 array on the stack: big enough to amortize the calls, small
// enough for any goroutine stack.
const transcodeChunk = 512

// Transcode converts the little-endian elements of from in src into dst
// as elements of to: len(src)/from.Size() elements, and dst must hold as
// many of to. Conversions go through float32 (exact for bf16 and fp16),
// rounding to nearest even where to is narrower, as Encode does; nothing
// is allocated, so a swap-in into a caller's buffer of another dtype costs
// no Go heap. src and dst need no alignment.
func Transcode(from tensor.DType, src []byte, to tensor.DType, dst []byte) {
	if from == to {
		copy(dst, src)
		return
	}
	fs, ts := from.Size(), to.Size()
	n := len(src) / fs
	if to == tensor.Float32 && aligned(src, fs) && aligned(dst, ts) {
		// Widening to float32 (a narrower model computed in fp32): decode
		// straight into dst, no stack round trip.
		Decode(from, Float32Bytes(dst[:n*ts]), src[:n*fs])
		return
	}
	var tmp [transcodeChunk]float32
	var raw [transcodeChunk]float32 // aligned bytes for a misaligned src or dst chunk
	for n > 0 {
		c := min(transcodeChunk, n)
		s, d := src[:c*fs], dst[:c*ts]
		if !aligned(s, fs) {
			s = AsBytes(raw[:])[:c*fs]
			copy(s, src)
		}
		Decode(from, tmp[:c], s)
		if aligned(d, ts) {
			Encode(to, d, tmp[:c])
		} else {
			r := AsBytes(raw[:])[:c*ts]
			Encode(to, r, tmp[:c])
			copy(d, r)
		}
		src, dst, n = src[c*fs:], dst[c*ts:], n-c
	}
}

// aligned says b starts on a multiple of size bytes (Decode and Encode
// view the bytes as elements, and a misaligned view is refused).
func aligned(b []byte, size int) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(size) == 0
}
