package optimizer_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// q8State is a tensor with 8-bit blockwise moments.
type q8State struct {
	p, g   []float32
	m, v   []uint8
	am, av []float32
}

func (s *q8State) clone() *q8State {
	return &q8State{slices.Clone(s.p), slices.Clone(s.g), slices.Clone(s.m), slices.Clone(s.v), slices.Clone(s.am), slices.Clone(s.av)}
}

// newQ8State draws a state of n elements: parameters, gradients and
// moments from fillMixed (special values with probability special),
// quantized as a step would have left them.
func newQ8State(r *rand.Rand, n int, special float64) *q8State {
	blocks := int(optimizer.FormatBlockwise8.Blocks(int64(n)))
	s := &q8State{p: make([]float32, n), g: make([]float32, n), m: make([]uint8, n), v: make([]uint8, n), am: make([]float32, blocks), av: make([]float32, blocks)}
	fillMixed(r, s.p, special)
	fillMixed(r, s.g, special)
	m, v := make([]float32, n), make([]float32, n)
	fillMixed(r, m, special)
	fillMixed(r, v, special)
	for i := range v {
		v[i] = float32(math.Abs(float64(v[i])))
	}
	optimizer.SignedDynamicMap().Quantize(s.m, s.am, m)
	optimizer.UnsignedDynamicMap().Quantize(s.v, s.av, v)
	return s
}

// reference is Adam8's in-memory reference: dequantize both moments, run
// Adam on the scalar kernel, quantize them again.
func (s *q8State) reference(step int, h optimizer.Hyper) {
	n := len(s.p)
	m, v := make([]float32, n), make([]float32, n)
	optimizer.SignedDynamicMap().Dequantize(m, s.m, s.am)
	optimizer.UnsignedDynamicMap().Dequantize(v, s.v, s.av)
	optimizer.Kernels()[0].Adam(s.p, s.g, m, v, step, h)
	optimizer.SignedDynamicMap().Quantize(s.m, s.am, m)
	optimizer.UnsignedDynamicMap().Quantize(s.v, s.av, v)
}

// diff describes the first difference in any bit between s and o, or "".
func (s *q8State) diff(o *q8State) string {
	if i := equalBits(s.p, o.p); i >= 0 {
		return fmt.Sprintf("p[%d] = %#08x, want %#08x", i, math.Float32bits(s.p[i]), math.Float32bits(o.p[i]))
	}
	if i := equalBits(s.am, o.am); i >= 0 {
		return fmt.Sprintf("exp_avg absmax[%d] = %#08x, want %#08x", i, math.Float32bits(s.am[i]), math.Float32bits(o.am[i]))
	}
	if i := equalBits(s.av, o.av); i >= 0 {
		return fmt.Sprintf("exp_avg_sq absmax[%d] = %#08x, want %#08x", i, math.Float32bits(s.av[i]), math.Float32bits(o.av[i]))
	}
	for i := range s.m {
		if s.m[i] != o.m[i] || s.v[i] != o.v[i] {
			return fmt.Sprintf("codes[%d] = %d, %d, want %d, %d", i, s.m[i], s.v[i], o.m[i], o.v[i])
		}
	}
	return ""
}

// adam8Lengths are the lengths the tests run: empty, shorter than a
// vector, tails of every kind around whole blocks.
var adam8Lengths = []int{0, 1, 7, 8, 17, 255, 256, 257, 300, 511, 512, 513, 1000, 3*256 + 129, 4096}

// TestAdam8MatchesReference runs Adam8 on every kernel against the
// in-memory reference (dequantize, Adam on the scalar loop, quantize):
// diffAdam8's random and directed cases.
func TestAdam8MatchesReference(t *testing.T) {
	seed := uint64(time1())
	t.Logf("seed %d", seed)
	for _, k := range optimizer.Kernels() {
		if err := diffAdam8(k, seed); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
}

// diffAdam8 compares Adam8 on k with the in-memory reference, every bit
// of the master, the codes and the absmax, and returns the first
// difference:
//
//   - random states with and without special values (zeros, subnormals,
//     huge and tiny magnitudes, infinities, NaNs), every weight-decay mode,
//     three steps, at lengths that leave every kind of tail;
//   - directed blocks whose new exp_avg lands exactly on chosen values:
//     with Beta1 = 0.5, zero moments and a gradient of 2 first in each
//     block, the block's absmax is 1 and each exp_avg/absmax is exactly
//     half its gradient, so the codes are taken at every threshold (ties),
//     the float32s either side of it, and the edges of every lookup bucket
//     of both signs; and a first block of zeros, whose absmax is 0.
func diffAdam8(k optimizer.Kernel, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 41))
	for _, n := range adam8Lengths {
		for _, special := range []float64{0, 0.02, 0.3} {
			for hi, h := range kernelHypers(r) {
				base := newQ8State(r, n, special)
				want, got := base.clone(), base.clone()
				for step := 1; step <= 3; step++ {
					want.reference(step, h)
					k.Adam8(got.p, got.g, got.m, got.v, got.am, got.av, step, h)
					if d := got.diff(want); d != "" {
						return fmt.Errorf("n=%d special=%g hyper %d step %d: %s", n, special, hi, step, d)
					}
				}
			}
		}
	}
	var probes []float32
	for _, m := range []optimizer.QuantMap{optimizer.SignedDynamicMap(), optimizer.UnsignedDynamicMap()} {
		thr := m.Thresholds()
		for _, x := range thr[:255] {
			probes = append(probes, x, math.Nextafter32(x, -2), math.Nextafter32(x, 2))
		}
	}
	for top := uint32(0x3400); top <= 0x3f80; top++ {
		for _, u := range []uint32{top << 16, top<<16 - 1} {
			probes = append(probes, math.Float32frombits(u), -math.Float32frombits(u))
		}
	}
	r.Shuffle(len(probes), func(i, j int) { probes[i], probes[j] = probes[j], probes[i] })
	const per = 255                       // probes per block, after its leading 2
	blocks := 1 + (len(probes)+per-1)/per // block 0 all zeros: absmax 0
	n := blocks*256 - 3                   // the last block a tail
	base := &q8State{p: make([]float32, n), g: make([]float32, n), m: make([]uint8, n), v: make([]uint8, n)}
	nb := optimizer.FormatBlockwise8.Blocks(int64(n))
	base.am, base.av = make([]float32, nb), make([]float32, nb)
	optimizer.SignedDynamicMap().Quantize(base.m, base.am, make([]float32, n))
	optimizer.UnsignedDynamicMap().Quantize(base.v, base.av, make([]float32, n))
	for i := range n {
		base.p[i] = float32(r.NormFloat64())
		if i < 256 {
			continue
		}
		if i%256 == 0 {
			base.g[i] = 2
		} else if j := (i/256-1)*per + i%256 - 1; j < len(probes) {
			base.g[i] = 2 * probes[j]
		}
	}
	h := optimizer.Hyper{LR: 0.01, Beta1: 0.5, Beta2: 0.5}
	want, got := base.clone(), base.clone()
	want.reference(1, h)
	k.Adam8(got.p, got.g, got.m, got.v, got.am, got.av, 1, h)
	if d := got.diff(want); d != "" {
		return fmt.Errorf("directed codes: %s", d)
	}
	return nil
}

// TestAdam8EdgeBlocks covers blocks whose absmax is 0 (zero moments and
// gradients: the codes stay on the zero entry, the master does not move),
// subnormal and huge moments, a NaN gradient (its block only), on every
// kernel against the reference.
func TestAdam8EdgeBlocks(t *testing.T) {
	const n = 3*256 + 5
	mk := func(fill func(i int, s *q8State, m, v []float32)) *q8State {
		blocks := int(optimizer.FormatBlockwise8.Blocks(n))
		s := &q8State{p: make([]float32, n), g: make([]float32, n), m: make([]uint8, n), v: make([]uint8, n), am: make([]float32, blocks), av: make([]float32, blocks)}
		m, v := make([]float32, n), make([]float32, n)
		for i := range n {
			s.p[i] = float32(i%13) - 6
			fill(i, s, m, v)
		}
		optimizer.SignedDynamicMap().Quantize(s.m, s.am, m)
		optimizer.UnsignedDynamicMap().Quantize(s.v, s.av, v)
		return s
	}
	cases := map[string]*q8State{
		"zero": mk(func(i int, s *q8State, m, v []float32) {}),
		"subnormal": mk(func(i int, s *q8State, m, v []float32) {
			s.g[i] = math.SmallestNonzeroFloat32 * float32(i%7-3)
			m[i] = math.SmallestNonzeroFloat32 * float32(i%5)
			v[i] = math.SmallestNonzeroFloat32 * float32(i%3)
		}),
		"huge": mk(func(i int, s *q8State, m, v []float32) {
			s.g[i] = 1e30 * float32(i%7-3)
			m[i] = 1e37 * float32(i%5-2)
			v[i] = math.MaxFloat32 / float32(1+i%3)
		}),
		"nan-in-second-block": mk(func(i int, s *q8State, m, v []float32) {
			s.g[i] = float32(i%9) - 4
			if i == 300 {
				s.g[i] = float32(math.NaN())
			}
		}),
	}
	for name, base := range cases {
		for _, k := range optimizer.Kernels() {
			want, got := base.clone(), base.clone()
			for step := 1; step <= 3; step++ {
				want.reference(step, optimizer.Hyper{LR: 0.01})
				k.Adam8(got.p, got.g, got.m, got.v, got.am, got.av, step, optimizer.Hyper{LR: 0.01})
				if d := got.diff(want); d != "" {
					t.Fatalf("%s on %s, step %d: %s", name, k, step, d)
				}
			}
			switch name {
			case "zero":
				if slices.ContainsFunc(got.am, func(a float32) bool { return math.Float32bits(a) != 0 }) || equalBits(got.p, base.p) >= 0 {
					t.Errorf("zero on %s: absmax %v, master moved: %v", k, got.am, got.p[:4])
				}
				for i := range got.m {
					if got.m[i] != 127 || got.v[i] != 0 {
						t.Fatalf("zero on %s: codes[%d] = %d, %d, want the zero entries 127, 0", k, i, got.m[i], got.v[i])
					}
				}
			case "nan-in-second-block":
				if !math.IsNaN(float64(got.am[1])) || math.IsNaN(float64(got.am[0])) || math.IsNaN(float64(got.am[2])) {
					t.Errorf("nan on %s: absmax %v, want a NaN in block 1 only", k, got.am)
				}
			}
		}
	}
}

// TestAdam8Converges trains a noisy linear regression with Adam on fp32
// moments and on 8-bit ones from the same start, with the same cosine
// learning-rate schedule: after the same steps the 8-bit run's loss is
// within 3% of the fp32 run's (both near the noise floor, measured 1.5%
// apart), and the fp32 run far below its starting loss.
func TestAdam8Converges(t *testing.T) {
	const feats, samples, steps = 300, 600, 500
	r := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, samples*feats)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	truth := make([]float32, feats)
	for i := range truth {
		truth[i] = float32(r.NormFloat64())
	}
	y := make([]float32, samples)
	for s := range samples {
		var d float64
		for f := range feats {
			d += float64(x[s*feats+f] * truth[f])
		}
		y[s] = float32(d + 0.3*r.NormFloat64())
	}
	// loss returns the mean squared error of w and writes its gradient.
	loss := func(w, g []float32) float64 {
		clear(g)
		var l float64
		for s := range samples {
			row := x[s*feats : (s+1)*feats]
			var d float64
			for f, xf := range row {
				d += float64(xf * w[f])
			}
			e := d - float64(y[s])
			l += e * e
			for f, xf := range row {
				g[f] += float32(2 * e * float64(xf) / samples)
			}
		}
		return l / samples
	}
	const lr = 0.05
	var h optimizer.Hyper
	w32, w8 := make([]float32, feats), make([]float32, feats)
	m32, v32 := make([]float32, feats), make([]float32, feats)
	blocks := optimizer.FormatBlockwise8.Blocks(feats)
	m8, v8 := make([]uint8, feats), make([]uint8, feats)
	am, av := make([]float32, blocks), make([]float32, blocks)
	optimizer.SignedDynamicMap().Quantize(m8, am, m32)
	optimizer.UnsignedDynamicMap().Quantize(v8, av, v32)
	g := make([]float32, feats)
	start := loss(w32, g)
	for step := 1; step <= steps; step++ {
		// A cosine schedule from LR down to 1% of it, as training runs.
		h.LR = float32(lr * (0.01 + 0.99*0.5*(1+math.Cos(math.Pi*float64(step-1)/steps))))
		loss(w32, g)
		optimizer.Adam(w32, g, m32, v32, step, h)
		loss(w8, g)
		optimizer.Adam8(w8, g, m8, v8, am, av, step, h)
	}
	l32, l8 := loss(w32, g), loss(w8, g)
	t.Logf("loss: start %.4f, fp32 moments %.5f, 8-bit moments %.5f (%+.2f%%)", start, l32, l8, 100*(l8-l32)/l32)
	if l32 > start/20 {
		t.Fatalf("fp32 run did not converge: %g from %g", l32, start)
	}
	if math.Abs(l8-l32) > 0.03*l32 {
		t.Errorf("8-bit moments end at loss %g, fp32 at %g: more than 3%% apart", l8, l32)
	}
}

// TestAdamBF16MatchesReference: AdamBF16 on every kernel equals widening
// the moments, Adam on the scalar loop and rounding them to nearest even.
func TestAdamBF16MatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, k := range optimizer.Kernels() {
		for _, n := range adam8Lengths {
			for _, h := range kernelHypers(r) {
				p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
				for _, s := range [][]float32{p, g, m, v} {
					fillMixed(r, s, 0.05)
				}
				mb, vb := make([]buffers.BFloat16, n), make([]buffers.BFloat16, n)
				buffers.Float32ToBFloat16(mb, m)
				buffers.Float32ToBFloat16(vb, v)
				wp, wm, wv := slices.Clone(p), make([]float32, n), make([]float32, n)
				buffers.BFloat16ToFloat32(wm, mb)
				buffers.BFloat16ToFloat32(wv, vb)
				optimizer.Kernels()[0].Adam(wp, g, wm, wv, 2, h)
				k.AdamBF16(p, g, mb, vb, 2, h)
				if i := equalBits(p, wp); i >= 0 {
					t.Fatalf("%s n=%d: p[%d] = %g, want %g", k, n, i, p[i], wp[i])
				}
				for i := range n {
					if mb[i] != buffers.BFloat16FromFloat32(wm[i]) || vb[i] != buffers.BFloat16FromFloat32(wv[i]) {
						t.Fatalf("%s n=%d: moments[%d] = %#04x %#04x, want %#04x %#04x", k, n, i, mb[i], vb[i], buffers.BFloat16FromFloat32(wm[i]), buffers.BFloat16FromFloat32(wv[i]))
					}
				}
			}
		}
	}
}
