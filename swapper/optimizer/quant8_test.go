package optimizer_test

import (
	"bufio"
	"fmt"
	"math"
	"math/big"
	"os"
	"strings"
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestDynamicMapGolden compares the two maps and their thresholds with
// testdata/dynamic_map.golden, which testdata/dynamic_map.py derives from
// the maps' definition with Python's standard library, independently of
// the Go construction.
func TestDynamicMapGolden(t *testing.T) {
	f, err := os.Open("testdata/dynamic_map.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]*[256]uint32{}
	for _, name := range []string{"signed", "unsigned", "signed-threshold", "unsigned-threshold"} {
		want[name] = new([256]uint32)
	}
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		var name string
		var j int
		var b uint32
		var v string
		if _, err := fmt.Sscanf(line, "%s %d %x %s", &name, &j, &b, &v); err != nil || want[name] == nil || j < 0 || j > 255 {
			t.Fatalf("bad golden line %q: %v", line, err)
		}
		want[name][j] = b
		seen++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != 2*(256+255) {
		t.Fatalf("golden has %d lines, want %d", seen, 2*(256+255))
	}
	for _, c := range []struct {
		name string
		m    optimizer.QuantMap
	}{{"signed", optimizer.SignedDynamicMap()}, {"unsigned", optimizer.UnsignedDynamicMap()}} {
		vals, thr := c.m.Values(), c.m.Thresholds()
		for j := range 256 {
			if got := math.Float32bits(vals[j]); got != want[c.name][j] {
				t.Errorf("%s map[%d] = %#08x (%g), golden %#08x (%g)", c.name, j, got, vals[j], want[c.name][j], math.Float32frombits(want[c.name][j]))
			}
		}
		for j := range 255 {
			if got := math.Float32bits(thr[j]); got != want[c.name+"-threshold"][j] {
				t.Errorf("%s threshold[%d] = %#08x, golden %#08x", c.name, j, got, want[c.name+"-threshold"][j])
			}
		}
		if !math.IsNaN(float64(thr[255])) {
			t.Errorf("%s threshold[255] = %g, want NaN (nothing codes above 255)", c.name, thr[255])
		}
	}
	// Facts of the construction that hold whatever the arithmetic: sorted,
	// distinct, one zero, 1 at the top, 127 negative entries (signed).
	s, u := optimizer.SignedDynamicMap().Values(), optimizer.UnsignedDynamicMap().Values()
	for j := 1; j < 256; j++ {
		if !(s[j-1] < s[j]) || !(u[j-1] < u[j]) {
			t.Fatalf("maps not strictly ascending at %d", j)
		}
	}
	if s[127] != 0 || s[255] != 1 || s[126] >= 0 || u[0] != 0 || u[255] != 1 {
		t.Errorf("signed map[126..127] = %g %g, map[255] = %g; unsigned map[0] = %g, map[255] = %g", s[126], s[127], s[255], u[0], u[255])
	}
}

// nearest reports whether code c is the nearest entry of vals to y in
// exact arithmetic, a tie going to the larger entry.
func nearest(vals [256]float32, y float32, c int) bool {
	dist := func(j int) *big.Float {
		d := new(big.Float).SetPrec(300).Sub(big.NewFloat(float64(y)).SetPrec(300), big.NewFloat(float64(vals[j])).SetPrec(300))
		return d.Abs(d)
	}
	d := dist(c)
	if c > 0 && d.Cmp(dist(c-1)) > 0 {
		return false
	}
	if c < 255 && d.Cmp(dist(c+1)) >= 0 {
		return false
	}
	return true
}

// TestQuantCodeIsNearest checks Code against the nearest entry computed
// exactly, on every map entry, every threshold and the float32s either
// side of them, both zeros, the extremes and values beyond ±1.
func TestQuantCodeIsNearest(t *testing.T) {
	for _, m := range []optimizer.QuantMap{optimizer.SignedDynamicMap(), optimizer.UnsignedDynamicMap()} {
		vals, thr := m.Values(), m.Thresholds()
		var probes []float32
		for j := range 256 {
			for _, x := range []float32{vals[j], thr[j]} {
				if math.IsNaN(float64(x)) {
					continue
				}
				probes = append(probes, x, math.Nextafter32(x, -2), math.Nextafter32(x, 2))
			}
		}
		probes = append(probes, 0, float32(math.Copysign(0, -1)), 1, -1, 1e-30, -1e-30, math.SmallestNonzeroFloat32, 3, -3, math.MaxFloat32)
		for _, y := range probes {
			c := int(m.Code(y))
			if !nearest(vals, y, c) {
				t.Errorf("Code(%g) = %d (%g), not the nearest entry (ties to the larger)", y, c, vals[c])
			}
		}
		// NaNs: by sign bit.
		if c := m.Code(float32(math.NaN())); c != 255 {
			t.Errorf("Code(+NaN) = %d, want 255", c)
		}
		if c := m.Code(math.Float32frombits(0xffc0_0001)); c != 0 {
			t.Errorf("Code(-NaN) = %d, want 0", c)
		}
	}
}

// TestQuantizeBlocks is a golden case worked by hand: codes, absmax and
// read-back values of short blocks, an all-zero block, a tail block, a
// subnormal block and a huge one.
func TestQuantizeBlocks(t *testing.T) {
	sm, um := optimizer.SignedDynamicMap(), optimizer.UnsignedDynamicMap()
	sv, uv := sm.Values(), um.Values()
	negZero := float32(math.Copysign(0, -1))
	// 256 + 4 elements: a full block (absmax 2) and a tail of 4 zeros.
	src := make([]float32, 260)
	src[0], src[1], src[2], src[3], src[4] = 2, -2, 1, negZero, 1e-30
	codes := make([]uint8, 260)
	absmax := make([]float32, 2)
	sm.Quantize(codes, absmax, src)
	if absmax[0] != 2 || math.Float32bits(absmax[1]) != 0 {
		t.Fatalf("absmax = %v, want [2 0]", absmax)
	}
	// 2/2 = 1 -> 255 (entry 1); -1 -> 0 (entry -0.99297, the most negative);
	// 0.5 -> its nearest; ±0 and 5e-31 -> the zero entry 127.
	want := []uint8{255, 0, sm.Code(0.5), 127, 127}
	for i, w := range want {
		if codes[i] != w {
			t.Errorf("code[%d] = %d, want %d", i, codes[i], w)
		}
	}
	if c := sm.Code(0.5); math.Abs(float64(sv[c])-0.5) > 0.01 {
		t.Errorf("Code(0.5) = %d (%g): not near 0.5", c, sv[c])
	}
	for i := 256; i < 260; i++ {
		if codes[i] != 127 {
			t.Errorf("tail code[%d] = %d, want 127 (zero)", i, codes[i])
		}
	}
	back := make([]float32, 260)
	sm.Dequantize(back, codes, absmax)
	if back[0] != 2 || back[1] != sv[0]*2 || math.Float32bits(back[3]) != 0 || math.Float32bits(back[257]) != 0 {
		t.Errorf("read back %v ... %v", back[:5], back[256:])
	}

	// A whole block of ±0 (an optimizer's initial moments) over stale
	// codes: absmax +0, every code the zero entry, in both maps.
	zeros := make([]float32, 2*256)
	for i := range zeros {
		if i%3 == 1 {
			zeros[i] = negZero
		}
	}
	for _, c := range []struct {
		m    optimizer.QuantMap
		zero uint8
	}{{sm, 127}, {um, 0}} {
		zc, za := make([]uint8, len(zeros)), []float32{7, 7}
		for i := range zc {
			zc[i] = 0xaa
		}
		c.m.Quantize(zc, za, zeros)
		if math.Float32bits(za[0]) != 0 || math.Float32bits(za[1]) != 0 {
			t.Errorf("zero blocks: absmax %v, want +0", za)
		}
		for i, code := range zc {
			if code != c.zero {
				t.Fatalf("zero blocks: code[%d] = %d, want %d", i, code, c.zero)
			}
		}
	}

	// Unsigned: a subnormal block and a huge one.
	sub := []float32{math.SmallestNonzeroFloat32 * 4, math.SmallestNonzeroFloat32, 0}
	uc := make([]uint8, 3)
	ua := make([]float32, 1)
	um.Quantize(uc, ua, sub)
	if ua[0] != math.SmallestNonzeroFloat32*4 || uc[0] != 255 || uc[1] != um.Code(0.25) || uc[2] != 0 {
		t.Errorf("subnormal block: codes %v absmax %g", uc, ua[0])
	}
	huge := []float32{math.MaxFloat32, math.MaxFloat32 / 2, 1}
	um.Quantize(uc, ua, huge)
	if ua[0] != math.MaxFloat32 || uc[0] != 255 || uc[1] != um.Code(0.5) || uc[2] != 0 {
		t.Errorf("huge block: codes %v absmax %g", uc, ua[0])
	}
	um.Dequantize(back[:3], uc, ua)
	if back[0] != math.MaxFloat32 || back[1] != uv[um.Code(0.5)]*math.MaxFloat32 {
		t.Errorf("huge block reads back %v", back[:3])
	}
}

// TestStateFormatBytes checks the bytes of each format and record, and
// the names and errors.
func TestStateFormatBytes(t *testing.T) {
	adam := optimizer.Hyper{}
	for _, c := range []struct {
		f            optimizer.StateFormat
		n            int64
		state, adamR int64
	}{
		{optimizer.FormatFP32, 1000, 4000, 12000},
		{optimizer.FormatBF16, 1000, 2000, 8000},
		{optimizer.FormatBlockwise8, 1000, 1000 + 4*4, 4000 + 2*1016},
		{optimizer.FormatBlockwise8, 256, 256 + 4, 1024 + 2*260},
		{optimizer.FormatBlockwise8, 257, 257 + 8, 1028 + 2*265},
		{optimizer.FormatBlockwise8, 1, 5, 4 + 10},
		{optimizer.StateFormat{Encoding: optimizer.EncodingBlockwise8}, 512, 512 + 8, 2048 + 2*520},
		{optimizer.FormatBlockwise8, 0, 0, 0},
	} {
		if got := c.f.StateBytes(c.n); got != c.state {
			t.Errorf("%s.StateBytes(%d) = %d, want %d", c.f, c.n, got, c.state)
		}
		if got := c.f.RecordBytes(adam, c.n); got != c.adamR {
			t.Errorf("%s.RecordBytes(Adam, %d) = %d, want %d", c.f, c.n, got, c.adamR)
		}
	}
	// 1.5 B parameters of Adam: 12 bytes each in fp32, 4 + 2*(1+4/256) in 8 bits.
	n := int64(1_500_000_000)
	if got, want := optimizer.FormatBlockwise8.RecordBytes(adam, n), 4*n+2*(n+4*((n+255)/256)); got != want {
		t.Errorf("8-bit record of %d = %d, want %d", n, got, want)
	}
	for _, name := range []string{"fp32", "bf16", "8bit"} {
		f, err := optimizer.ParseStateFormat(name)
		if err != nil || f.String() != name || f.Validate() != nil {
			t.Errorf("ParseStateFormat(%q) = %v, %v", name, f, err)
		}
	}
	if _, err := optimizer.ParseStateFormat("int4"); err == nil || !strings.Contains(err.Error(), `"int4"`) || !strings.Contains(err.Error(), "fp32, bf16, 8bit") {
		t.Errorf("ParseStateFormat(int4): %v", err)
	}
	for _, f := range []optimizer.StateFormat{
		{Encoding: optimizer.EncodingBlockwise8, BlockSize: 2048},
		{Encoding: optimizer.EncodingBF16, BlockSize: 256},
		{Encoding: 7},
	} {
		if err := f.Validate(); err == nil {
			t.Errorf("%v.Validate() = nil", f)
		}
	}
}
