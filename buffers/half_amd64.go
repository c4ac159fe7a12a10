package buffers

import "golang.org/x/sys/cpu"

// haveAVX2 says the AVX2 widening kernel may run (x/sys/cpu reports it
// only when the operating system also saves the YMM registers).
var haveAVX2 = cpu.X86.HasAVX2

// widenBF16AVX2 widens n bfloat16s at src into float32s at dst; n is a
// multiple of 16. Written in half_amd64.s.
//
//go:noescape
func widenBF16AVX2(dst *float32, src *BFloat16, n int)

// widenBF16 widens the leading multiple of 16 of len(src) values (len(dst)
// >= len(src)) with the AVX2 kernel and returns how many it did: 0 without
// AVX2, and the caller does the rest.
func widenBF16(dst []float32, src []BFloat16) int {
	n := len(src) &^ 15
	if !haveAVX2 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	widenBF16AVX2(&dst[0], &src[0], n)
	return n
}
