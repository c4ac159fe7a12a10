package buffers

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// f16Ref is the exact value of a finite half, computed independently of
// Float16.Float32 (float64 arithmetic).
func f16Ref(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, mant := int(h>>10)&0x1f, float64(h&0x3ff)
	if exp == 0 {
		return sign * math.Ldexp(mant, -24)
	}
	return sign * math.Ldexp(1024+mant, exp-25)
}

func isNaN16(h Float16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }

// TestFloat16ExhaustiveRoundTrip: every one of the 65536 halves widens to
// the exact float32 value and narrows back to the same bits (NaNs keep sign
// and payload, ±0 keep their sign).
func TestFloat16ExhaustiveRoundTrip(t *testing.T) {
	for i := range 1 << 16 {
		h := Float16(i)
		f := h.Float32()
		switch {
		case isNaN16(h):
			if !math.IsNaN(float64(f)) {
				t.Fatalf("%#04x: NaN widened to %v", i, f)
			}
		case h&0x7fff == 0x7c00:
			if !math.IsInf(float64(f), 0) || math.Signbit(float64(f)) != (h&0x8000 != 0) {
				t.Fatalf("%#04x: Inf widened to %v", i, f)
			}
		default:
			if float64(f) != f16Ref(uint16(h)) {
				t.Fatalf("%#04x: widened to %v, want %v", i, f, f16Ref(uint16(h)))
			}
		}
		if back := Float16FromFloat32(f); back != h {
			t.Fatalf("%#04x -> %v (%#08x) -> %#04x", i, f, math.Float32bits(f), back)
		}
	}
}

// nearestHalf rounds x to binary16 the slow way: binary search over all
// finite halves' values, ties to the even mantissa, overflow by IEEE rules.
type halfTable struct {
	vals []float64
	bits []uint16
}

func newHalfTable() *halfTable {
	var ht halfTable
	for i := 0; i < 0x7c00; i++ { // non-negative finite halves, ascending
		ht.vals = append(ht.vals, f16Ref(uint16(i)))
		ht.bits = append(ht.bits, uint16(i))
	}
	return &ht
}

func (ht *halfTable) nearest(x float64) uint16 {
	var sign uint16
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	// Past 65504 + half an ulp (65520) everything rounds to Inf; 65520 itself
	// is a tie between 65504 (odd) and 65536 (even, not representable): Inf.
	if x >= 65520 {
		return sign | 0x7c00
	}
	i := sort.SearchFloat64s(ht.vals, x) // first >= x
	if i == len(ht.vals) {
		return sign | 0x7bff // in (65504, 65520): nearer the largest finite
	}
	if i < len(ht.vals) && ht.vals[i] == x {
		return sign | ht.bits[i]
	}
	lo, hi := i-1, i
	dlo, dhi := x-ht.vals[lo], ht.vals[hi]-x
	switch {
	case dlo < dhi:
		return sign | ht.bits[lo]
	case dhi < dlo:
		return sign | ht.bits[hi]
	case ht.bits[lo]&1 == 0:
		return sign | ht.bits[lo]
	}
	return sign | ht.bits[hi]
}

func TestFloat16FromFloat32MatchesReference(t *testing.T) {
	ht := newHalfTable()
	check := func(f float32) {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return
		}
		got, want := Float16FromFloat32(f), Float16(ht.nearest(float64(f)))
		if got != want {
			t.Fatalf("Float16FromFloat32(%v = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	// Every half, its float32 neighbours, and the exact midpoints between
	// consecutive halves (ties) with their neighbours.
	for i := range 0x7c00 {
		for _, s := range []float64{1, -1} {
			v := float32(s * f16Ref(uint16(i)))
			check(v)
			check(math.Nextafter32(v, float32(math.Inf(1))))
			check(math.Nextafter32(v, float32(math.Inf(-1))))
			if i+1 < 0x7c00 {
				mid := float32(s * (f16Ref(uint16(i)) + f16Ref(uint16(i+1))) / 2)
				check(mid)
				check(math.Nextafter32(mid, 0))
				check(math.Nextafter32(mid, float32(math.Inf(1))))
			}
		}
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for range 200000 {
		check(math.Float32frombits(r.Uint32()))
		// Concentrate on the half range, where rounding matters.
		check(float32(r.NormFloat64() * math.Ldexp(1, r.IntN(40)-25)))
	}
}

func TestFloat16SpecialCases(t *testing.T) {
	cases := []struct {
		f    float32
		want Float16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},
		{65519.99, 0x7bff},
		{65520, 0x7c00}, // tie, rounds to even = Inf
		{1e10, 0x7c00},
		{-1e10, 0xfc00},
		{float32(math.Inf(1)), 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{float32(math.Ldexp(1, -24)), 0x0001}, // smallest subnormal
		{float32(math.Ldexp(1, -25)), 0x0000}, // half of it: tie to even 0
		{float32(math.Ldexp(3, -26)), 0x0001}, // 0.75 ulp rounds up
		{float32(math.Ldexp(3, -25)), 0x0002}, // 1.5 ulp: tie to even 2
		{float32(math.Ldexp(5, -25)), 0x0002}, // 2.5 ulp: tie to even 2
		{float32(math.Ldexp(1, -14)), 0x0400}, // smallest normal
		{float32(math.Ldexp(1023, -24)), 0x03ff},
		{float32(math.Ldexp(2047, -25)), 0x0400},  // largest subnormal + half ulp: tie to even -> normal
		{1 + float32(math.Ldexp(1, -11)), 0x3c00}, // tie: 1.0 is even
		{1 + float32(math.Ldexp(3, -11)), 0x3c02}, // tie: up to even
		{math.SmallestNonzeroFloat32, 0x0000},
	}
	for _, c := range cases {
		if got := Float16FromFloat32(c.f); got != c.want {
			t.Errorf("Float16FromFloat32(%v) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	// NaNs stay NaN, keep their sign and top payload bits.
	for _, bitsIn := range []uint32{0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000, 0xff812345} {
		h := Float16FromFloat32(math.Float32frombits(bitsIn))
		if !isNaN16(h) || (h&0x8000 != 0) != (bitsIn>>31 == 1) {
			t.Errorf("NaN %#08x -> %#04x", bitsIn, h)
		}
	}
	if h := Float16FromFloat32(math.Float32frombits(0x7fa00000)); h != 0x7d00 {
		t.Errorf("NaN payload not kept: %#04x", h)
	}
}

func bf16Ref(f float32) BFloat16 {
	// Exact float64 rounding between the two bfloat16 neighbours.
	u := math.Float32bits(f)
	lo := BFloat16(u >> 16)
	hi := lo + 1
	x := float64(f)
	vlo, vhi := float64(lo.Float32()), float64(hi.Float32())
	if hi&0x7fff == 0x7f80 && u&0x7fffffff >= 0x7f7f8000 { // beyond max: hi is ±Inf
		vhi = math.Copysign(math.Ldexp(1, 128), x)
	}
	dlo, dhi := math.Abs(x-vlo), math.Abs(vhi-x)
	switch {
	case u&0xffff == 0:
		return lo
	case dlo < dhi:
		return lo
	case dhi < dlo:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

func TestBFloat16(t *testing.T) {
	// Every bfloat16 round-trips; NaNs come back as quiet NaNs of the same sign.
	for i := range 1 << 16 {
		h := BFloat16(i)
		f := h.Float32()
		back := BFloat16FromFloat32(f)
		if math.IsNaN(float64(f)) {
			if back != h|0x0040 {
				t.Fatalf("NaN %#04x -> %#04x, want quiet %#04x", i, back, h|0x0040)
			}
			continue
		}
		if back != h {
			t.Fatalf("%#04x -> %v -> %#04x", i, f, back)
		}
	}
	cases := []struct {
		bits uint32
		want BFloat16
	}{
		{0x3f808000, 0x3f80}, // tie, kept part even: down
		{0x3f818000, 0x3f82}, // tie, kept part odd: up
		{0x3f808001, 0x3f81}, // above the tie: up
		{0x3f807fff, 0x3f80},
		{0x7f7fffff, 0x7f80}, // max float32 rounds to +Inf
		{0xff7fffff, 0xff80},
		{0x7f800000, 0x7f80},
		{0xff800000, 0xff80},
		{0x7f800001, 0x7fc0}, // signalling NaN with a low payload: quiet NaN, not Inf
		{0xffffffff, 0xffff},
		{0x00000001, 0x0000}, // tiny subnormal
		{0x00008000, 0x0000}, // tie to even zero
		{0x00018000, 0x0002},
		{0x80000000, 0x8000},
	}
	for _, c := range cases {
		if got := BFloat16FromFloat32(math.Float32frombits(c.bits)); got != c.want {
			t.Errorf("BFloat16FromFloat32(%#08x) = %#04x, want %#04x", c.bits, got, c.want)
		}
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	for range 300000 {
		f := math.Float32frombits(r.Uint32())
		if math.IsNaN(float64(f)) {
			if got := BFloat16FromFloat32(f); !math.IsNaN(float64(got.Float32())) {
				t.Fatalf("NaN %#08x -> %#04x", math.Float32bits(f), got)
			}
			continue
		}
		if got, want := BFloat16FromFloat32(f), bf16Ref(f); got != want {
			t.Fatalf("BFloat16FromFloat32(%#08x) = %#04x, want %#04x", math.Float32bits(f), got, want)
		}
	}
}

func TestBulkConversions(t *testing.T) {
	src := []float32{1, -2.5, 0.1, 65504, 1e-8}
	bf := make([]BFloat16, 3) // shorter dst: converts 3, no panic
	Float32ToBFloat16(bf, src)
	for i, h := range bf {
		if h != BFloat16FromFloat32(src[i]) {
			t.Fatalf("bf16 bulk %d", i)
		}
	}
	back := make([]float32, 10) // longer dst: the tail is untouched
	back[4] = 42
	BFloat16ToFloat32(back, bf)
	if back[0] != 1 || back[1] != -2.5 || back[3] != 0 || back[4] != 42 {
		t.Fatalf("bf16 back %v", back)
	}
	hf := make([]Float16, len(src))
	Float32ToFloat16(hf, src)
	Float16ToFloat32(back, hf)
	for i := range src {
		if back[i] != hf[i].Float32() || hf[i] != Float16FromFloat32(src[i]) {
			t.Fatalf("fp16 bulk %d", i)
		}
	}
	Float32ToFloat16(nil, src)
	Float16ToFloat32(nil, hf)
	BFloat16ToFloat32(back, nil)
}

// TestBFloat16WideningEveryPattern widens every one of the 65536 bfloat16
// bit patterns (NaNs, infinities, subnormals, both zeros), at every start
// offset and length around the vector kernel's 16-value step, and checks
// each value against the definition (the pattern is the float32's upper
// half, the lower half zero) and the scalar loop; the values past the
// length are untouched.
func TestBFloat16WideningEveryPattern(t *testing.T) {
	all := make([]BFloat16, 1<<16)
	for i := range all {
		all[i] = BFloat16(i)
	}
	got := make([]float32, len(all))
	BFloat16ToFloat32(got, all)
	for i, f := range got {
		if b := math.Float32bits(f); b != uint32(i)<<16 {
			t.Fatalf("pattern %#04x widened to %#08x, want %#08x", i, b, uint32(i)<<16)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for off := 0; off < 17; off++ {
		for n := 0; n < 70; n++ {
			src := all[r.IntN(len(all)-100)+off:]
			src = src[:n]
			dst := make([]float32, n+3)
			want := make([]float32, n+3)
			for i := range dst {
				dst[i], want[i] = -7, -7
			}
			BFloat16ToFloat32(dst[off%3:], src)
			bf16ToFloat32Scalar(want[off%3:], src)
			for i := range dst {
				if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
					t.Fatalf("offset %d length %d: element %d is %#08x, the scalar loop %#08x", off, n, i, math.Float32bits(dst[i]), math.Float32bits(want[i]))
				}
			}
		}
	}
}

// TestBFloat16WideningLarge widens past the non-temporal threshold (the
// streaming kernel, after a scalar head up to dst's 32-byte boundary) at
// every alignment of the destination, against the scalar loop, with the
// elements around the destination untouched.
func TestBFloat16WideningLarge(t *testing.T) {
	n := widenNTBytes/4 + 37
	src := make([]BFloat16, n)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range src {
		src[i] = BFloat16(r.Uint32())
	}
	want := make([]float32, n)
	bf16ToFloat32Scalar(want, src)
	buf := make([]float32, n+10)
	for off := 0; off < 9; off++ {
		for i := range buf {
			buf[i] = -3
		}
		BFloat16ToFloat32(buf[off:off+n], src)
		for i, f := range buf {
			w := float32(-3)
			if i >= off && i < off+n {
				w = want[i-off]
			}
			if math.Float32bits(f) != math.Float32bits(w) {
				t.Fatalf("offset %d: element %d is %#08x, want %#08x", off, i, math.Float32bits(f), math.Float32bits(w))
			}
		}
	}
}

// TestBFloat16NarrowingEveryPattern rounds float32s with every upper half
// (NaNs of both signs, infinities, subnormals, both zeros) and lower halves
// on each side of the rounding boundary (0, just below, at and above half
// an ulp, all ones, random) through Float32ToBFloat16, whose vector kernel
// must equal BFloat16FromFloat32 bit for bit; then every start offset and
// length around the kernel's 16-value step, with the values past the
// length untouched.
func TestBFloat16NarrowingEveryPattern(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	lows := []uint32{0, 1, 0x7fff, 0x8000, 0x8001, 0xffff}
	src := make([]float32, 0, (1<<16)*(len(lows)+1))
	for hi := uint32(0); hi < 1<<16; hi++ {
		for _, lo := range lows {
			src = append(src, math.Float32frombits(hi<<16|lo))
		}
		src = append(src, math.Float32frombits(hi<<16|r.Uint32()&0xffff))
	}
	got := make([]BFloat16, len(src))
	Float32ToBFloat16(got, src)
	for i, f := range src {
		if want := BFloat16FromFloat32(f); got[i] != want {
			t.Fatalf("%#08x rounded to %#04x, BFloat16FromFloat32 %#04x", math.Float32bits(f), got[i], want)
		}
	}
	for off := 0; off < 17; off++ {
		for n := 0; n < 70; n++ {
			in := src[r.IntN(len(src)-100)+off:][:n]
			dst := make([]BFloat16, n+3)
			for i := range dst {
				dst[i] = 0xdead
			}
			Float32ToBFloat16(dst[off%3:], in)
			for i := range dst {
				want := BFloat16(0xdead)
				if j := i - off%3; j >= 0 && j < n {
					want = BFloat16FromFloat32(in[j])
				}
				if dst[i] != want {
					t.Fatalf("offset %d length %d: element %d is %#04x, want %#04x", off, n, i, dst[i], want)
				}
			}
		}
	}
}
