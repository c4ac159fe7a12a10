// Package vec is zinf's element-wise float32 sums over long slices: a
// gradient added into its sum (Add), a sum's first term (PlusZero). On
// amd64 with AVX2 a kernel does the multiple of 16 elements; a Go loop
// does the rest, and everything elsewhere. The kernels' results are the
// Go loops' bits (VADDPS rounds as ADDSS does).
package vec

// Add sets acc[i] = acc[i] + g[i] in float32 for every i < len(g)
// (len(acc) >= len(g)).
func Add(acc, g []float32) {
	acc = acc[:len(g)]
	done := addVec(acc, g)
	for i, x := range g[done:] {
		acc[done+i] = acc[done+i] + x
	}
}

// PlusZero sets dst[i] = src[i] + 0 in float32 for every i < len(src)
// (len(dst) >= len(src)): a copy in which a -0 becomes +0, as adding src
// to a zeroed sum would. From a megabyte on amd64 the stores go past the
// caches: a sum that large is not read again before its lines would be
// evicted.
func PlusZero(dst, src []float32) {
	dst = dst[:len(src)]
	done := plusZeroVec(dst, src)
	for i, x := range src[done:] {
		dst[done+i] = x + 0
	}
}

// AddPair sets acc[i] = (acc[i] + a[i]) + b[i] in float32 for every i <
// len(a) (len(b) == len(a), len(acc) >= len(a)): Add(acc, a) then Add(acc,
// b), bit for bit, in one pass over acc. Two gradients summed into one
// sum read and write the sum once instead of twice.
func AddPair(acc, a, b []float32) {
	acc, b = acc[:len(a)], b[:len(a)]
	done := addPairVec(acc, a, b)
	for i := done; i < len(a); i++ {
		acc[i] = (acc[i] + a[i]) + b[i]
	}
}

// PlusZeroPair sets dst[i] = (a[i] + 0) + b[i] in float32 for every i <
// len(a) (len(b) == len(a), len(dst) >= len(a)): PlusZero(dst, a) then
// Add(dst, b), bit for bit, in one pass.
func PlusZeroPair(dst, a, b []float32) {
	dst, b = dst[:len(a)], b[:len(a)]
	done := plusZeroPairVec(dst, a, b)
	for i := done; i < len(a); i++ {
		dst[i] = (a[i] + 0) + b[i]
	}
}
