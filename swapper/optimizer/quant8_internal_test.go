package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestQuantCodeMatchesCount compares the one-comparison bucket lookup
// (code, and packedCode, which the kernels implement) with the definition (countCode: the
// thresholds at or below y, by binary search). Both are non-decreasing
// step functions of y on each sign, changing value only at a threshold or
// a bucket edge, so agreeing on every threshold, every bucket edge and
// their neighbours means agreeing everywhere; random values and the
// special ones are checked on top.
func TestQuantCodeMatchesCount(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for name, tab := range map[string]*quantTable{"signed": &quantTables().signed, "unsigned": &quantTables().unsigned} {
		check := func(y float32) {
			if math.IsNaN(float64(y)) {
				return
			}
			if got, want := int(tab.code(y)), tab.countCode(y); got != want {
				t.Fatalf("%s: code(%g [%#08x]) = %d, the definition gives %d", name, y, math.Float32bits(y), got, want)
			}
			if got, want := tab.packedCode(y), tab.code(y); got != want {
				t.Fatalf("%s: packedCode(%g [%#08x]) = %d, code gives %d", name, y, math.Float32bits(y), got, want)
			}
			if got, want := tab.wideCode(y), tab.code(y); got != want {
				t.Fatalf("%s: wideCode(%g [%#08x]) = %d, code gives %d", name, y, math.Float32bits(y), got, want)
			}
		}
		for _, x := range tab.thr[:255] {
			for _, y := range []float32{x, math.Nextafter32(x, -2), math.Nextafter32(x, 2)} {
				check(y)
			}
		}
		for hi := range uint32(1 << 16) {
			check(math.Float32frombits(hi << 16))
			check(math.Float32frombits(hi<<16 | 0xffff))
		}
		for range 1 << 18 {
			check(math.Float32frombits(r.Uint32()))
			check(float32(r.NormFloat64() * math.Pow(10, -float64(r.IntN(9)))))
		}
		for _, y := range []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), math.SmallestNonzeroFloat32} {
			check(y)
		}
		// A NaN y codes as 255 with its sign bit clear, 0 with it set
		// (QuantMap), by every lookup; every top 16 bits of a NaN, with
		// the low bits at both ends.
		for top := uint32(0x7f81); top <= 0x7fff; top++ {
			for _, u := range []uint32{top << 16, top<<16 | 0xffff, 0x7f80_0001} {
				for sign, want := range []uint8{255, 0} {
					y := math.Float32frombits(u | uint32(sign)<<31)
					if a, b, c := tab.code(y), tab.packedCode(y), tab.wideCode(y); a != want || b != want || c != want {
						t.Fatalf("%s: NaN %#08x codes as %d (code), %d (packedCode), %d (wideCode), want %d", name, math.Float32bits(y), a, b, c, want)
					}
				}
			}
		}
	}
}

// TestQuantTableLayout checks the offsets the SIMD kernels read the
// tables at (internal/asmgen declares the same numbers).
func TestQuantTableLayout(t *testing.T) {
	var q quantTable
	if unsafe.Offsetof(q.values) != quantTableValues || unsafe.Offsetof(q.thr) != quantTableThr || unsafe.Offsetof(q.bucket) != quantTableBucket || unsafe.Offsetof(q.packed) != quantTablePacked {
		t.Fatalf("quantTable offsets %d %d %d %d, the kernels read %d %d %d %d", unsafe.Offsetof(q.values), unsafe.Offsetof(q.thr), unsafe.Offsetof(q.bucket), unsafe.Offsetof(q.packed), quantTableValues, quantTableThr, quantTableBucket, quantTablePacked)
	}
	if quantTablePacked != 7944 {
		t.Fatalf("quantTablePacked = %d; internal/asmgen reads the packed table at 7944", quantTablePacked)
	}
	if unsafe.Offsetof(q.wide) != quantTableWide || quantTableWide != 31504 {
		t.Fatalf("wide table at %d (quantTableWide %d); internal/asmgen reads it at 31504", unsafe.Offsetof(q.wide), quantTableWide)
	}
	if len(q.bucket) < 2*bucketCount+3 {
		t.Fatalf("bucket table %d bytes: the kernels read 4 bytes at offsets up to %d", len(q.bucket), 2*bucketCount-1)
	}
}
