package crc32c

import (
	"fmt"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// castagnoliPoly is P's coefficients below x^32 in the usual order (x^32
// is implied): hash/crc32's reflected Castagnoli constant bit-reversed.
var castagnoliPoly = uint64(bits.Reverse32(crc32.Castagnoli))

// xPowModP returns x^e mod P, one multiplication by x at a time: bit k of
// the result is the coefficient of x^k.
func xPowModP(e int) uint64 {
	r := uint64(1)
	for range e {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= 1<<32 | castagnoliPoly
		}
	}
	return r
}

// x64DivP returns floor(x^64 / P) by long division over GF(2), bit k the
// coefficient of x^k (degree 32).
func x64DivP() uint64 {
	var q uint64
	// r is the dividend's window from x^(k+32) down to x^k: x^64 at the
	// start, and each step brings down a 0.
	r := uint64(1) << 32
	for k := 32; k >= 0; k-- {
		if r&(1<<32) != 0 {
			q |= 1 << k
			r ^= 1<<32 | castagnoliPoly
		}
		r <<= 1
	}
	return q
}

// rev64 writes v (bit k the coefficient of x^k, degree < 64) in
// foldVPCLMUL's order, bit i the coefficient of x^(63-i); rev33 writes v
// (degree <= 32) with bit i the coefficient of x^(32-i).
func rev64(v uint64) uint64 { return bits.Reverse64(v) }
func rev33(v uint64) uint64 { return bits.Reverse64(v) >> 31 }

// wantFoldK is foldK from first principles, each with its name.
func wantFoldK() (k [len(foldK)]uint64, names [len(foldK)]string) {
	fold := func(i, d int) {
		k[i], names[i] = rev64(xPowModP(d+63)), fmt.Sprintf("fold %d: rev64(x^%d mod P)", d, d+63)
		k[i+1], names[i+1] = rev64(xPowModP(d-1)), fmt.Sprintf("fold %d: rev64(x^%d mod P)", d, d-1)
	}
	fold(0, 1024)
	fold(2, 768)
	fold(4, 512)
	fold(6, 256)
	fold(8, 128)
	k[10], names[10] = rev64(xPowModP(95)), "128 to 64: rev64(x^95 mod P)"
	k[11], names[11] = rev64(xPowModP(63)), "128 to 64: rev64(x^63 mod P)"
	k[12], names[12] = rev33(x64DivP()), "Barrett: rev33(floor(x^64 / P))"
	k[13], names[13] = rev33(1<<32|castagnoliPoly), "Barrett: rev33(P)"
	return k, names
}

// TestFoldConstants: foldK, which foldVPCLMUL reads, is what GF(2)
// arithmetic bit by bit gives; and the arithmetic agrees with itself:
// floor(x^64/P)*P + (x^64 mod P) = x^64.
func TestFoldConstants(t *testing.T) {
	q, p := x64DivP(), uint64(1<<32)|castagnoliPoly
	var lo, hi uint64 // q*P, below x^64 and its x^64 term
	for k := range 33 {
		if q>>k&1 != 0 {
			lo ^= p << k
			if k == 32 {
				hi ^= p >> 32
			}
		}
	}
	if hi != 1 || lo != xPowModP(64) {
		t.Fatalf("floor(x^64/P) = %#x: its product with P is x^64*%d + %#x, not x^64 + (x^64 mod P = %#x)", q, hi, lo, xPowModP(64))
	}
	want, names := wantFoldK()
	for i := range foldK {
		if foldK[i] != want[i] {
			t.Errorf("foldK[%d] (%s) = %#016x, want %#016x", i, names[i], foldK[i], want[i])
		}
	}
}

// TestFoldKernel: foldVPCLMUL on every multiple of its block up to 4 KiB,
// at every offset of 32 bytes, from random crcs, is the (inverted)
// register hash/crc32 leaves.
func TestFoldKernel(t *testing.T) {
	if !canFold {
		t.Skip("no AVX2 with 256-bit VPCLMULQDQ here")
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4<<10+32)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := foldBlock; n <= 4<<10; n += foldBlock {
		for off := range 32 {
			b := buf[off : off+n]
			crc := r.Uint32()
			if got, want := ^foldVPCLMUL(^crc, b), crc32.Update(crc, table, b); got != want {
				t.Fatalf("%d bytes at offset %d from %08x: %08x, hash/crc32 %08x", n, off, crc, got, want)
			}
		}
	}
}

// TestFoldConstantsMatter: flipping any one of the bits that carry a
// constant of foldK changes the kernel's CRC of some buffer, so that every
// constant is read and a wrong one shows in the tests above. Those bits:
// 32-63 of the rev64 ones (x^31..x^0: a remainder mod P has no higher
// term); 0-31 of rev33(floor(x^64/P)) (its x^0 term, bit 32, multiplies
// U_hi into the bits under x^32 that q drops); 1-32 of rev33(P) (its x^32
// term, bit 0, lands in q*P's upper half, which U mod P drops).
func TestFoldConstantsMatter(t *testing.T) {
	if !canFold {
		t.Skip("no AVX2 with 256-bit VPCLMULQDQ here")
	}
	r := rand.New(rand.NewPCG(5, 6))
	var bufs [4][]byte
	for i := range bufs {
		bufs[i] = make([]byte, 1<<10)
		for j := range bufs[i] {
			bufs[i][j] = byte(r.Uint32())
		}
	}
	_, names := wantFoldK()
	saved := foldK
	defer func() { foldK = saved }()
	for i := range foldK {
		carry := uint64(0xFFFFFFFF_00000000)
		switch i {
		case 12:
			carry = 0x0_FFFFFFFF
		case 13:
			carry = 0x1_FFFFFFFE
		}
		for bit := range 64 {
			if carry>>bit&1 == 0 {
				continue
			}
			foldK = saved
			foldK[i] ^= 1 << bit
			seen := false
			for _, b := range bufs {
				if ^foldVPCLMUL(^uint32(0), b) != crc32.Update(0, table, b) {
					seen = true
					break
				}
			}
			if !seen {
				t.Errorf("foldK[%d] (%s) with bit %d flipped: the same CRCs", i, names[i], bit)
			}
		}
	}
}
