package buffers

import (
	"math"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveAVX2 says the AVX2 widening kernel may run (x/sys/cpu reports it
// only when the operating system also saves the YMM registers).
var haveAVX2 = cpu.X86.HasAVX2

// widenBF16AVX2 widens n bfloat16s at src into float32s at dst; n is a
// multiple of 16. Written in half_amd64.s.
//
//go:noescape
func widenBF16AVX2(dst *float32, src *BFloat16, n int)

// widenBF16AVX2NT is widenBF16AVX2 with non-temporal stores; dst is
// 32-byte aligned. Written in half_amd64.s.
//
//go:noescape
func widenBF16AVX2NT(dst *float32, src *BFloat16, n int)

// widenBF16 widens a prefix of src (len(dst) >= len(src)) with the AVX2
// kernels and returns how many values it did: 0 without AVX2, and the
// caller does the rest.
func widenBF16(dst []float32, src []BFloat16) int {
	if !haveAVX2 || len(src) < 16 {
		return 0
	}
	_ = dst[len(src)-1]
	if len(src)*4 < widenNTBytes {
		n := len(src) &^ 15
		widenBF16AVX2(&dst[0], &src[0], n)
		return n
	}
	// Widen up to dst's first 32-byte boundary here (at most 7 values: dst
	// is 4-byte aligned), then stream.
	head := int((32 - uintptr(unsafe.Pointer(&dst[0]))%32) % 32 / 4)
	for i, h := range src[:head] {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
	n := (len(src) - head) &^ 15
	widenBF16AVX2NT(&dst[head], &src[head], n)
	return head + n
}

// narrowBF16AVX2 rounds n float32s at src to bfloat16s at dst, as
// BFloat16FromFloat32 does; n is a multiple of 16. Written in
// half_amd64.s.
//
//go:noescape
func narrowBF16AVX2(dst *BFloat16, src *float32, n int)

// narrowBF16 rounds a prefix of src (len(dst) >= len(src)) with the AVX2
// kernel and returns how many values it did: 0 without AVX2, and the
// caller does the rest.
func narrowBF16(dst []BFloat16, src []float32) int {
	if !haveAVX2 || len(src) < 16 {
		return 0
	}
	_ = dst[len(src)-1]
	n := len(src) &^ 15
	narrowBF16AVX2(&dst[0], &src[0], n)
	return n
}
