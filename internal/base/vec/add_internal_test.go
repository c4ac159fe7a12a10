package vec

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// addOperands returns n values with every special case of float32
// addition among them: ±0, subnormals, ±Inf, NaNs with payloads, the
// largest finite values (whose sums overflow) and normal draws.
func addOperands(r *rand.Rand, n int) []float32 {
	specials := []uint32{0, 0x8000_0000, 1, 0x8000_0001, 0x7f80_0000, 0xff80_0000, 0x7fc0_0001, 0xffa0_0000, 0x7f7f_ffff, 0xff7f_ffff, 0x0080_0000}
	x := make([]float32, n)
	for i := range x {
		if r.IntN(8) == 0 {
			x[i] = math.Float32frombits(specials[r.IntN(len(specials))])
		} else {
			x[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()*4))
		}
	}
	return x
}

// TestAddKernelsMatchScalar: Add and PlusZero give the bits of their
// scalar loops (float32 adds; g + 0) at every length around the kernels'
// 16-element steps and the streaming size, and at every alignment of the
// destination. A NaN sum matches any NaN: which
// operand's payload x86 keeps depends on the order the compiler gives the
// operands of a commutative add, which Go leaves open (two scalar loops
// of the same source differed here).
func TestAddKernelsMatchScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	lengths := []int{0, 1, 15, 16, 17, 31, 33, 1000, plusZeroNTBytes/4 - 1, plusZeroNTBytes / 4, plusZeroNTBytes/4 + 37}
	for _, n := range lengths {
		for off := range 8 {
			g := addOperands(r, n)
			base := addOperands(r, n+off)
			acc := base[off:]

			want := make([]float32, n)
			for i := range want {
				want[i] = acc[i] + g[i]
			}
			got := append([]float32(nil), acc...)
			Add(got, g)
			sameBitsOrNaN(t, fmt.Sprintf("Add, %d elements at offset %d", n, off), got[:n], want)

			for i := range want {
				want[i] = g[i] + 0
			}
			dst := make([]float32, n+off)[off:]
			PlusZero(dst, g)
			sameBitsOrNaN(t, fmt.Sprintf("PlusZero, %d elements at offset %d", n, off), dst, want)
		}
	}
}

// sameBitsOrNaN is sameBits with any NaN matching a NaN.
func sameBitsOrNaN(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		g, w := got[i], want[i]
		if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
			t.Fatalf("%s: element %d is %v (%#08x), the scalar loop gives %v (%#08x)", what, i, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
}

// TestPairKernelsMatchTwoPasses: AddPair and PlusZeroPair give the bits
// of Add twice and of PlusZero then Add, at every length around the
// kernels' steps and the streaming size and every alignment of the
// destination.
func TestPairKernelsMatchTwoPasses(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	lengths := []int{0, 1, 15, 16, 17, 31, 33, 1000, plusZeroNTBytes/4 - 1, plusZeroNTBytes / 4, plusZeroNTBytes/4 + 37}
	for _, n := range lengths {
		for off := range 8 {
			a, b := addOperands(r, n), addOperands(r, n)
			base := addOperands(r, n+off)
			acc := base[off:]

			want := make([]float32, n)
			for i := range want {
				want[i] = (acc[i] + a[i]) + b[i]
			}
			got := append([]float32(nil), acc...)
			AddPair(got, a, b)
			sameBitsOrNaN(t, fmt.Sprintf("AddPair, %d elements at offset %d", n, off), got[:n], want)
			two := append([]float32(nil), acc...)
			Add(two, a)
			Add(two, b)
			sameBitsOrNaN(t, fmt.Sprintf("AddPair against Add twice, %d elements at offset %d", n, off), got[:n], two[:n])

			dst := make([]float32, n+off)[off:]
			PlusZeroPair(dst, a, b)
			seq := make([]float32, n+off)[off:]
			PlusZero(seq, a)
			Add(seq, b)
			for i := range want {
				want[i] = (a[i] + 0) + b[i]
			}
			sameBitsOrNaN(t, fmt.Sprintf("PlusZeroPair, %d elements at offset %d", n, off), dst, want)
			sameBitsOrNaN(t, fmt.Sprintf("PlusZeroPair against PlusZero and Add, %d elements at offset %d", n, off), dst, seq)
		}
	}
}

// TestPlusZeroPairSignOfZero: -0 + -0 summed into a fresh sum is +0
// ((-0 + +0) + -0), not the -0 of adding the two alone.
func TestPlusZeroPairSignOfZero(t *testing.T) {
	for _, n := range []int{1, 16, plusZeroNTBytes/4 + 16} {
		a := make([]float32, n)
		b := make([]float32, n)
		for i := range a {
			a[i] = float32(math.Copysign(0, -1))
			b[i] = a[i]
		}
		dst := make([]float32, n)
		for i := range dst {
			dst[i] = 7
		}
		PlusZeroPair(dst, a, b)
		for i, x := range dst {
			if math.Float32bits(x) != 0 {
				t.Fatalf("%d elements: element %d is %#08x, want +0", n, i, math.Float32bits(x))
			}
		}
	}
}
