package kernels

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
)

// TestHalfRoundTrip widens every binary16 and rounds it back: every
// non-NaN value must come back unchanged, and the widening must equal
// value = (-1)^s * 2^(e-15) * 1.f (or 2^-14 * 0.f for subnormals).
func TestHalfRoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := HalfToFloat32(uint16(h))
		exp := h >> 10 & 0x1f
		frac := float64(h & 0x3ff)
		var want float64
		switch {
		case exp == 0x1f && frac != 0:
			if f == f {
				t.Fatalf("HalfToFloat32(%#04x) = %v, want a NaN", h, f)
			}
			if back := Float32ToHalf(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("Float32ToHalf(NaN from %#04x) = %#04x, not a NaN", h, back)
			}
			continue
		case exp == 0x1f:
			want = math.Inf(1)
		case exp == 0:
			want = frac * math.Pow(2, -24)
		default:
			want = (1 + frac/1024) * math.Pow(2, float64(exp-15))
		}
		if h&0x8000 != 0 {
			want = -want
		}
		if float64(f) != want || math.Signbit(float64(f)) != (h&0x8000 != 0) {
			t.Fatalf("HalfToFloat32(%#04x) = %v, want %v", h, f, want)
		}
		if back := Float32ToHalf(f); back != uint16(h) {
			t.Fatalf("Float32ToHalf(HalfToFloat32(%#04x)) = %#04x", h, back)
		}
	}
}

// TestFloat32ToHalfRounds checks rounding to the nearest binary16, ties
// to even, on random binary32 values over binary16's whole range (and
// past it) and on every midpoint between neighbouring binary16 values.
func TestFloat32ToHalfRounds(t *testing.T) {
	check := func(f float32) {
		t.Helper()
		h := Float32ToHalf(f)
		got := float64(HalfToFloat32(h))
		if math.IsInf(got, 0) {
			// Past the largest finite value 65504 the cut is at 65520.
			if math.Abs(float64(f)) < 65520 {
				t.Fatalf("Float32ToHalf(%v) = Inf", f)
			}
			return
		}
		// Neither neighbour of h may be nearer, and a tie goes to the
		// even one.
		for _, nb := range []uint16{h - 1, h + 1} {
			if nb&0x7c00 == 0x7c00 || (h&0x7fff == 0 && nb&0x7fff != 1) {
				continue
			}
			o := float64(HalfToFloat32(nb))
			dg, do := math.Abs(got-float64(f)), math.Abs(o-float64(f))
			if do < dg || (do == dg && h&1 == 1) {
				t.Fatalf("Float32ToHalf(%v) = %#04x (%v); %#04x (%v) is nearer or the even tie", f, h, got, nb, o)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		e := rng.IntN(50) - 30
		check(float32(rng.Float64()*math.Pow(2, float64(e))) * float32(1-2*rng.IntN(2)))
	}
	for h := range 0x7bff {
		a, b := float64(HalfToFloat32(uint16(h))), float64(HalfToFloat32(uint16(h+1)))
		check(float32((a + b) / 2)) // exact in binary32
	}
	if got := Float32ToHalf(65520); got != 0x7c00 {
		t.Errorf("Float32ToHalf(65520) = %#04x, want Inf", got)
	}
	if got := Float32ToHalf(65519.99); got != 0x7bff {
		t.Errorf("Float32ToHalf(65519.99) = %#04x, want 0x7bff", got)
	}
}

func TestBF16(t *testing.T) {
	for _, c := range []struct {
		f float32
		h uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {math.Float32frombits(0x3f80_8000), 0x3f80}, // tie to even (down)
		{math.Float32frombits(0x3f81_8000), 0x3f82}, // tie to even (up)
		{math.Float32frombits(0x3f80_8001), 0x3f81},
	} {
		if got := Float32ToBF16(c.f); got != c.h {
			t.Errorf("Float32ToBF16(%#08x) = %#04x, want %#04x", math.Float32bits(c.f), got, c.h)
		}
	}
	for h := range 1 << 16 {
		if math.Float32bits(BF16ToFloat32(uint16(h))) != uint32(h)<<16 {
			t.Fatalf("BF16ToFloat32(%#04x) is not the shifted bits", h)
		}
	}
}

// TestQ8_0Golden quantizes hand-computed blocks byte for byte.
func TestQ8_0Golden(t *testing.T) {
	// absmax 127: d = 1 (binary16 0x3c00); x*1 rounded half away from 0.
	src := make([]float32, 32)
	src[0], src[1], src[2], src[3], src[4], src[5] = 127, -127, 2.5, -2.5, 0.49, -63.5
	want := []byte{0x00, 0x3c, 127, 0x81, 3, 0xfd, 0, 0xc0} // -127=0x81, -3=0xfd, -64=0xc0
	want = append(want, make([]byte, 26)...)
	// Second block: all zero gives d = 0 and zero bytes.
	src = append(src, make([]float32, 32)...)
	want = append(want, make([]byte, 34)...)
	// Third block: absmax 254 gives d = 2 (0x4000); 3 -> 1.5 -> 2, -1 -> -0.5 -> -1.
	b3 := make([]float32, 32)
	b3[7], b3[8], b3[9] = -254, 3, -1
	src = append(src, b3...)
	w3 := make([]byte, 34)
	w3[0], w3[1] = 0x00, 0x40
	w3[2+7], w3[2+8], w3[2+9] = 0x81, 2, 0xff
	want = append(want, w3...)
	dst := make([]byte, 3*34)
	n, err := QuantizeQ8_0(dst, src)
	if err != nil || n != len(want) {
		t.Fatalf("QuantizeQ8_0: n %d err %v", n, err)
	}
	if !bytes.Equal(dst, want) {
		t.Fatalf("QuantizeQ8_0:\n got %x\nwant %x", dst, want)
	}
	back := make([]float32, len(src))
	if err := Dequantize(back, Q8_0, dst); err != nil {
		t.Fatal(err)
	}
	for i, v := range map[int]float32{0: 127, 1: -127, 2: 3, 3: -3, 4: 0, 5: -64, 64 + 7: -254, 64 + 8: 4, 64 + 9: -2} {
		if back[i] != v {
			t.Errorf("dequantized[%d] = %v, want %v", i, back[i], v)
		}
	}
}

// TestQ4_0Golden quantizes hand-computed blocks byte for byte.
func TestQ4_0Golden(t *testing.T) {
	// max = -16 (largest magnitude, negative): d = -16/-8 = 2 (0x4000),
	// id = 0.5. nibble = min(15, trunc(x*0.5 + 8.5)).
	src := make([]float32, 32)
	src[0] = -16  // -8+8.5 = 0.5 -> 0
	src[1] = 16   // 8+8.5 = 16.5 -> 15 (clamped)
	src[2] = 1    // 0.5+8.5 = 9 -> 9
	src[3] = -1.2 // -0.6+8.5 = 7.9 -> 7
	src[16] = 3   // 1.5+8.5 = 10 -> 10, high nibble of byte 0
	src[17] = -3  // -1.5+8.5 = 7 -> 7, high nibble of byte 1
	// zeros: 8.5 -> 8.
	want := make([]byte, 18)
	want[0], want[1] = 0x00, 0x40
	for j := range 16 {
		want[2+j] = 0x88
	}
	want[2+0] = 0xa0
	want[2+1] = 0x7f
	want[2+2] = 0x89
	want[2+3] = 0x87
	// Second block: max = +4 at index 5, d = -0.5 (0xb800), id = -2:
	// 4 -> -8+8.5 -> 0; -4 -> 8+8.5 -> 15; 1 -> -2+8.5 -> 6.
	b2 := make([]float32, 32)
	b2[5], b2[6], b2[20] = 4, -4, 1
	src = append(src, b2...)
	w2 := make([]byte, 18)
	w2[0], w2[1] = 0x00, 0xb8
	for j := range 16 {
		w2[2+j] = 0x88
	}
	w2[2+5] = 0x80
	w2[2+6] = 0x8f
	w2[2+4] = 0x68
	want = append(want, w2...)
	dst := make([]byte, 36)
	n, err := QuantizeQ4_0(dst, src)
	if err != nil || n != 36 {
		t.Fatalf("QuantizeQ4_0: n %d err %v", n, err)
	}
	if !bytes.Equal(dst, want) {
		t.Fatalf("QuantizeQ4_0:\n got %x\nwant %x", dst, want)
	}
	back := make([]float32, 64)
	if err := Dequantize(back, Q4_0, dst); err != nil {
		t.Fatal(err)
	}
	for i, v := range map[int]float32{0: -16, 1: 14, 2: 2, 3: -2, 16: 4, 17: -2, 4: 0, 32 + 5: 4, 32 + 6: -3.5, 32 + 20: 1} {
		if back[i] != v {
			t.Errorf("dequantized[%d] = %v, want %v", i, back[i], v)
		}
	}
}

func TestQuantizeErrors(t *testing.T) {
	if _, err := QuantizeQ8_0(make([]byte, 100), make([]float32, 33)); err == nil {
		t.Error("QuantizeQ8_0 of 33 values: no error")
	}
	if _, err := QuantizeQ4_0(make([]byte, 17), make([]float32, 32)); err == nil {
		t.Error("QuantizeQ4_0 into 17 bytes: no error")
	}
	if err := Dequantize(make([]float32, 32), Q8_0, make([]byte, 33)); err == nil {
		t.Error("Dequantize of a short block: no error")
	}
	if err := Dequantize(make([]float32, 32), DType(9), make([]byte, 330)); err == nil {
		t.Error("Dequantize of an unknown dtype: no error")
	}
}

// Encode and Dequantize round-trip: F32 exactly, BF16 to each value's
// Float32ToBF16 rounding, the block formats to the quantizers' bytes
// (Encode gives the same bytes as QuantizeQ8_0 and QuantizeQ4_0) and
// within a block's quantization step; bad lengths and types are
// errors naming them.
func TestEncodeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	src := make([]float32, 4*BlockSize)
	for i := range src {
		src[i] = float32(rng.NormFloat64()) * float32(math.Ldexp(1, rng.IntN(6)-3))
	}
	for _, ty := range allTypes {
		b, err := Encode(ty, src)
		if err != nil {
			t.Fatalf("%v: %v", ty, err)
		}
		if rb, _ := RowBytes(ty, len(src)); len(b) != rb {
			t.Fatalf("%v: %d bytes, want %d", ty, len(b), rb)
		}
		got := make([]float32, len(src))
		if err := Dequantize(got, ty, b); err != nil {
			t.Fatalf("%v: %v", ty, err)
		}
		switch ty {
		case F32:
			for i := range src {
				if math.Float32bits(got[i]) != math.Float32bits(src[i]) {
					t.Fatalf("f32 value %d: %v back as %v", i, src[i], got[i])
				}
			}
		case BF16:
			for i := range src {
				if want := BF16ToFloat32(Float32ToBF16(src[i])); got[i] != want {
					t.Fatalf("bf16 value %d: %v back as %v, want %v", i, src[i], got[i], want)
				}
			}
		default:
			want := make([]byte, len(b))
			q := QuantizeQ8_0
			// Half a step; Q4_0's values of the other sign than the
			// largest clamp at 7 steps, up to a whole step off.
			step := 1.0 / 127 / 2
			if ty == Q4_0 {
				q, step = QuantizeQ4_0, 1.0/8
			}
			if _, err := q(want, src); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, want) {
				t.Fatalf("%v: Encode's bytes differ from the quantizer's", ty)
			}
			for blk := 0; blk < len(src)/BlockSize; blk++ {
				var amax float64
				for _, v := range src[blk*BlockSize : (blk+1)*BlockSize] {
					amax = max(amax, math.Abs(float64(v)))
				}
				for i := blk * BlockSize; i < (blk+1)*BlockSize; i++ {
					// Plus the binary16 scale's rounding.
					if e := math.Abs(float64(got[i]) - float64(src[i])); e > amax*step+amax*2e-3 {
						t.Fatalf("%v value %d: %v back as %v", ty, i, src[i], got[i])
					}
				}
			}
		}
	}
	if _, err := Encode(Q8_0, src[:33]); err == nil {
		t.Error("Encode of 33 values as q8_0: no error")
	}
	if _, err := Encode(DType(99), src); err == nil {
		t.Error("Encode as an unknown type: no error")
	}
}
