package optimizer_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestAdamFirstStep checks the textbook first step: with m and v zero, the
// bias-corrected update is LR * g/|g| (up to eps).
func TestAdamFirstStep(t *testing.T) {
	p := []float32{1, -2, 0.5, 3}
	g := []float32{0.5, -4, 0, 1e-3}
	m, v := make([]float32, 4), make([]float32, 4)
	optimizer.Adam(p, g, m, v, 1, optimizer.Hyper{})
	want := []float32{1 - 1e-3, -2 + 1e-3, 0.5, 3 - 1e-3}
	for i := range p {
		if d := math.Abs(float64(p[i] - want[i])); d > 1e-6 {
			t.Errorf("p[%d] = %v, want %v", i, p[i], want[i])
		}
		if wm := 0.1 * g[i]; math.Abs(float64(m[i]-wm)) > 1e-7 {
			t.Errorf("m[%d] = %v, want %v", i, m[i], wm)
		}
		// 1-Beta2 in float32 is 0.0009999871, hence the relative tolerance.
		if wv := 0.001 * g[i] * g[i]; math.Abs(float64(v[i]-wv)) > 1e-4*float64(wv) {
			t.Errorf("v[%d] = %v, want %v", i, v[i], wv)
		}
	}
}

// TestAdamAgainstFloat64 compares many steps with a float64 rendering of
// the same formula: the float32 result must stay close.
func TestAdamAgainstFloat64(t *testing.T) {
	for _, h := range []optimizer.Hyper{{}, {LR: 1e-2, WeightDecay: 0.05, AdamW: true}, {LR: 1e-2, WeightDecay: 0.05}} {
		rng := rand.New(rand.NewPCG(1, 2))
		const n = 64
		p, m, v := make([]float32, n), make([]float32, n), make([]float32, n)
		p64, m64, v64 := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range p {
			p[i] = float32(rng.NormFloat64())
			p64[i] = float64(p[i])
		}
		hd := h
		hd.EnsureDefaults()
		b1, b2, lr, eps, wd := float64(hd.Beta1), float64(hd.Beta2), float64(hd.LR), float64(hd.Eps), float64(hd.WeightDecay)
		for step := 1; step <= 20; step++ {
			g := make([]float32, n)
			for i := range g {
				g[i] = float32(rng.NormFloat64())
			}
			optimizer.Adam(p, g, m, v, step, h)
			for i := range p64 {
				gi := float64(g[i])
				if wd != 0 && !h.AdamW {
					gi += wd * p64[i]
				}
				if wd != 0 && h.AdamW {
					p64[i] *= 1 - lr*wd
				}
				m64[i] = b1*m64[i] + (1-b1)*gi
				v64[i] = b2*v64[i] + (1-b2)*gi*gi
				denom := math.Sqrt(v64[i])/math.Sqrt(1-math.Pow(b2, float64(step))) + eps
				p64[i] -= lr / (1 - math.Pow(b1, float64(step))) * m64[i] / denom
			}
		}
		for i := range p {
			if d := math.Abs(float64(p[i]) - p64[i]); d > 1e-5 {
				t.Fatalf("%+v: p[%d] = %v, float64 reference %v", h, i, p[i], p64[i])
			}
		}
	}
}

// TestAdamChunks: updating a tensor in chunks gives the same bits as whole,
// and zero Hyper fields are the documented defaults.
func TestAdamChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 1000
	mk := func() []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(rng.NormFloat64())
		}
		return s
	}
	p, g := mk(), mk()
	m, v := make([]float32, n), make([]float32, n)
	p2, m2, v2 := append([]float32(nil), p...), make([]float32, n), make([]float32, n)
	def := optimizer.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
	for step := 1; step <= 3; step++ {
		optimizer.Adam(p, g, m, v, step, optimizer.Hyper{})
		for lo := 0; lo < n; lo += 333 {
			hi := min(lo+333, n)
			optimizer.Adam(p2[lo:hi], g[lo:hi], m2[lo:hi], v2[lo:hi], step, def)
		}
	}
	for i := range p {
		if math.Float32bits(p[i]) != math.Float32bits(p2[i]) || math.Float32bits(m[i]) != math.Float32bits(m2[i]) ||
			math.Float32bits(v[i]) != math.Float32bits(v2[i]) {
			t.Fatalf("element %d differs between whole and chunked updates", i)
		}
	}
}

func TestAdamPanicsOnMisuse(t *testing.T) {
	for name, f := range map[string]func(){
		"short grad": func() {
			optimizer.Adam(make([]float32, 3), make([]float32, 2), make([]float32, 3), make([]float32, 3), 1, optimizer.Hyper{})
		},
		"step 0": func() {
			optimizer.Adam(make([]float32, 3), make([]float32, 3), make([]float32, 3), make([]float32, 3), 0, optimizer.Hyper{})
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
