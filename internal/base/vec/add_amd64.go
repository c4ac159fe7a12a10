package vec

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveAVX2 says the AVX2 kernels may run (x/sys/cpu reports it only when
// the operating system also saves the YMM registers).
var haveAVX2 = cpu.X86.HasAVX2

// addAVX2 sets acc[i] += grad[i] for n float32s, n a multiple of 16: VADDPS,
// whose sums are the scalar loop's bits. Written in add_amd64.s.
//
//go:noescape
func addAVX2(acc, grad *float32, n int)

// plusZeroNTAVX2 sets dst[i] = src[i] + 0 for n float32s, n a multiple of
// 16, with non-temporal stores; dst is 32-byte aligned. Written in
// add_amd64.s.
//
//go:noescape
func plusZeroNTAVX2(dst, src *float32, n int)

// addPairAVX2 sets acc[i] = (acc[i] + a[i]) + b[i] for n float32s, n a
// multiple of 16. Written in add_amd64.s.
//
//go:noescape
func addPairAVX2(acc, a, b *float32, n int)

// plusZeroPairNTAVX2 sets dst[i] = (a[i] + 0) + b[i] for n float32s, n a
// multiple of 16, with non-temporal stores; dst is 32-byte aligned.
// Written in add_amd64.s.
//
//go:noescape
func plusZeroPairNTAVX2(dst, a, b *float32, n int)

// plusZeroNTBytes is the size from which plusZero streams its stores past
// the caches: a gradient that large is not read again before its lines
// would be evicted, and the stores skip reading the destination's lines
// first. Below it the stores are plain.
const plusZeroNTBytes = 1 << 20

// addVec adds a prefix of g into acc (len(acc) >= len(g)) with the AVX2
// kernel and returns how many elements it did: 0 without AVX2.
func addVec(acc, g []float32) int {
	if !haveAVX2 || len(g) < 16 {
		return 0
	}
	n := len(g) &^ 15
	_ = acc[n-1]
	addAVX2(&acc[0], &g[0], n)
	return n
}

// plusZeroVec sets a prefix of dst to src's values plus +0 (len(dst) >=
// len(src)) with the AVX2 kernels and returns how many it did: 0 without
// AVX2 or below plusZeroNTBytes (the caller's loop is as fast there).
func plusZeroVec(dst, src []float32) int {
	if !haveAVX2 || 4*len(src) < plusZeroNTBytes {
		return 0
	}
	_ = dst[len(src)-1]
	// Up to dst's first 32-byte boundary here (at most 7 values: dst is
	// 4-byte aligned), then stream.
	head := int((32 - uintptr(unsafe.Pointer(&dst[0]))%32) % 32 / 4)
	for i, g := range src[:head] {
		dst[i] = g + 0
	}
	n := (len(src) - head) &^ 15
	plusZeroNTAVX2(&dst[head], &src[head], n)
	return head + n
}

// addPairVec does a prefix of AddPair with the AVX2 kernel and returns
// how many elements it did: 0 without AVX2.
func addPairVec(acc, a, b []float32) int {
	if !haveAVX2 || len(a) < 16 {
		return 0
	}
	n := len(a) &^ 15
	_, _ = acc[n-1], b[n-1]
	addPairAVX2(&acc[0], &a[0], &b[0], n)
	return n
}

// plusZeroPairVec does a prefix of PlusZeroPair with the AVX2 kernel and
// returns how many elements it did: 0 without AVX2 or below
// plusZeroNTBytes.
func plusZeroPairVec(dst, a, b []float32) int {
	if !haveAVX2 || 4*len(a) < plusZeroNTBytes {
		return 0
	}
	_, _ = dst[len(a)-1], b[len(a)-1]
	head := int((32 - uintptr(unsafe.Pointer(&dst[0]))%32) % 32 / 4)
	for i := range head {
		dst[i] = (a[i] + 0) + b[i]
	}
	n := (len(a) - head) &^ 15
	plusZeroPairNTAVX2(&dst[head], &a[head], &b[head], n)
	return head + n
}
