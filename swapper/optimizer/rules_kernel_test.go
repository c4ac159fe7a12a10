package optimizer_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// ruleCase is one set of hyperparameters of one rule, as Kernel.Update
// takes them.
type ruleCase struct {
	h optimizer.Hyper
	p optimizer.StepParams
}

func (c ruleCase) String() string {
	h := c.h
	switch h.Rule {
	case optimizer.RuleSGD:
		return fmt.Sprintf("SGD lr=%g wd=%g momentum=%g dampening=%g nesterov=%v", c.p.LR, h.WeightDecay, h.Momentum, h.Dampening, h.Nesterov)
	case optimizer.RuleAdagrad:
		return fmt.Sprintf("Adagrad lr=%g wd=%g lr_decay=%g eps=%g", c.p.LR, h.WeightDecay, h.LRDecay, h.Eps)
	case optimizer.RuleLion:
		return fmt.Sprintf("Lion lr=%g wd=%g betas=%g,%g", c.p.LR, h.WeightDecay, h.Beta1, h.Beta2)
	}
	return fmt.Sprintf("Adam lr=%g wd=%g adamw=%v betas=%g,%g eps=%g", c.p.LR, h.WeightDecay, h.AdamW, h.Beta1, h.Beta2, h.Eps)
}

// ruleCases cover every code path of each rule's kernels and the
// options that only change constants: for SGD weight decay (none,
// ordinary, huge) by momentum, dampening and Nesterov (none; momentum with
// and without dampening, a dampening above 1; Nesterov, with and without
// dampening); for Adagrad weight decay (none, ordinary, huge) by lr_decay
// (none, ordinary, huge), with eps the default, large or subnormal
// (each eps with each weight decay and each lr_decay once); for Lion
// weight decay (none, ordinary, a factor that rounds to 1, which the
// update skips) with two of the beta pairs each; Adam's weight-decay
// modes. All at a drawn learning rate, and one case of each rule at a
// rate of 0 (valid: a schedule's warmup may start there).
func ruleCases(r *rand.Rand) []ruleCase {
	lr := float32(math.Pow(10, -1-4*r.Float64()))
	p := optimizer.StepParams{LR: lr}
	var out []ruleCase
	for _, wd := range []float32{0, 0.01, 1e3} {
		for _, m := range []struct {
			mom, damp float32
			nesterov  bool
		}{{0, 0, false}, {0.9, 0, false}, {0.9, 0.1, false}, {0.5, -2, false}, {0.9, 0, true}, {0.7, 0.3, true}} {
			out = append(out, ruleCase{optimizer.Hyper{Rule: optimizer.RuleSGD, WeightDecay: wd, Momentum: m.mom, Dampening: m.damp, Nesterov: m.nesterov}, p})
		}
	}
	epss := []float32{0, 1e-3, 1e-40}
	for i, wd := range []float32{0, 0.01, 1e3} {
		for j, decay := range []float64{0, 0.1, 1e6} {
			// Adagrad's rate comes from the float64 learning rate, as a
			// schedule hands it; the kernels take it as a constant.
			p64 := p
			if j == 1 {
				p64.LR64 = math.Pow(10, -1-4*r.Float64())
				p64.LR = float32(p64.LR64)
			}
			out = append(out, ruleCase{optimizer.Hyper{Rule: optimizer.RuleAdagrad, WeightDecay: wd, LRDecay: decay, Eps: epss[(i+j)%3]}, p64})
		}
	}
	betas := [][2]float32{{0, 0}, {0.5, 0.5}, {0.95, 0.98}, {1e-3, 0.999}}
	for i, wd := range []float32{0, 0.1, 1e-12} {
		for j := range 2 {
			b := betas[(i+j)%len(betas)]
			out = append(out, ruleCase{optimizer.Hyper{Rule: optimizer.RuleLion, WeightDecay: wd, Beta1: b[0], Beta2: b[1]}, p})
		}
	}
	for _, h := range kernelHypers(r) {
		out = append(out, ruleCase{h, p})
	}
	zero := optimizer.StepParams{LR: 0}
	return append(out,
		ruleCase{optimizer.Hyper{Rule: optimizer.RuleSGD, WeightDecay: 0.01, Momentum: 0.9, Dampening: 0.1}, zero},
		ruleCase{optimizer.Hyper{Rule: optimizer.RuleAdagrad, WeightDecay: 0.01, LRDecay: 0.1}, zero},
		ruleCase{optimizer.Hyper{Rule: optimizer.RuleLion, WeightDecay: 0.1}, zero},
		ruleCase{optimizer.Hyper{WeightDecay: 0.3, AdamW: true}, zero},
	)
}

// ruleOperands are the arrays of one Update call (master, gradient, the
// rule's states), each starting at its own offset into a larger array,
// with guard values around it.
type ruleOperands struct {
	back [][]float32
	off  []int
	n    int
}

func newRuleOperands(r *rand.Rand, h optimizer.Hyper, n int, special float64) *ruleOperands {
	arrays := 2 + h.StateCount()
	s := &ruleOperands{back: make([][]float32, arrays), off: make([]int, arrays), n: n}
	for k := range s.back {
		s.off[k] = guards + r.IntN(17)
		s.back[k] = make([]float32, s.off[k]+n+guards)
		fillMixed(r, s.back[k], special)
	}
	// Sums of squares (Adagrad's sum, Adam's exp_avg_sq) are non-negative
	// in practice; keep a few negative ones.
	var sq []float32
	switch h.Rule {
	case optimizer.RuleAdagrad:
		sq = s.slice(2)
	case optimizer.RuleAdam:
		sq = s.slice(3)
	}
	for i := range sq {
		if r.IntN(50) != 0 {
			sq[i] = float32(math.Abs(float64(sq[i])))
		}
	}
	return s
}

func (s *ruleOperands) slice(k int) []float32 { return s.back[k][s.off[k] : s.off[k]+s.n] }

func (s *ruleOperands) clone() *ruleOperands {
	c := &ruleOperands{back: make([][]float32, len(s.back)), off: s.off, n: s.n}
	for k := range s.back {
		c.back[k] = slices.Clone(s.back[k])
	}
	return c
}

func (s *ruleOperands) update(k optimizer.Kernel, step int, c ruleCase) {
	var st [][]float32
	for j := 2; j < len(s.back); j++ {
		st = append(st, s.slice(j))
	}
	k.Update(s.slice(0), s.slice(1), st, step, c.h, c.p)
}

// diff names the first element (guards included) where s and o differ in
// any bit, or returns "".
func (s *ruleOperands) diff(o *ruleOperands, h optimizer.Hyper) string {
	names := append([]string{"param", "grad"}, h.StateNames()...)
	for k := range s.back {
		if i := equalBits(s.back[k], o.back[k]); i >= 0 {
			where := "inside"
			if i < s.off[k] || i >= s.off[k]+s.n {
				where = "a guard element outside"
			}
			return fmt.Sprintf("%s[%d] (%s the operand; offset %d): %v (%#08x) vs scalar %v (%#08x)", names[k], i-s.off[k], where, s.off[k],
				s.back[k][i], math.Float32bits(s.back[k][i]), o.back[k][i], math.Float32bits(o.back[k][i]))
		}
	}
	return ""
}

// diffRuleKernel is the differential test of kernel k against the scalar
// reference for every rule: every option combination (ruleCases), every
// length from 0 to two blocks of two vectors and one (every tail, every
// unrolled remainder) and longer odd ones, misaligned starts, values of
// every class (fillMixed: subnormals, zeros of both signs, huge and tiny,
// Inf and NaN with random payloads) mixed, each class alone in one operand
// and in every operand, first and late steps and several steps in a row.
// Every bit must agree, NaN payloads and zero signs included, and nothing
// outside the slices may change. It returns the number of element updates
// compared, and the first difference as an error. With rules given, it
// runs only their cases.
func diffRuleKernel(k optimizer.Kernel, seed uint64, rules ...optimizer.Rule) (int, error) {
	scalar := optimizer.Kernels()[0]
	r := rand.New(rand.NewPCG(seed, uint64(k.Lanes())))
	var lens []int
	for n := 0; n <= 2*k.Lanes()+1; n++ {
		lens = append(lens, n)
	}
	lens = append(lens, 3*k.Lanes()-1, 3*k.Lanes()+1, 4*k.Lanes(), 5*k.Lanes()+k.Lanes()/2)
	stepRuns := [][]int{{1}, {1, 2, 3}, {1000}, {7, 1 << 20}}
	checked := 0
	run := func(c ruleCase, want *ruleOperands, steps []int, what string) error {
		got := want.clone()
		for _, step := range steps {
			want.update(scalar, step, c)
			got.update(k, step, c)
			if d := got.diff(want, c.h); d != "" {
				return fmt.Errorf("%s, %s, n=%d, step %d of %v, %s: %s", k, c, want.n, step, steps, what, d)
			}
		}
		checked += want.n * len(steps)
		return nil
	}
	for _, c := range ruleCases(r) {
		if len(rules) > 0 && !slices.Contains(rules, c.h.Rule) {
			continue
		}
		for _, n := range lens {
			for _, special := range []float64{0, 0.05, 0.5, 1} {
				for _, steps := range stepRuns {
					if err := run(c, newRuleOperands(r, c.h, n, special), steps, fmt.Sprintf("specials %.0f%%", 100*special)); err != nil {
						return checked, err
					}
				}
			}
		}
		if err := run(c, newRuleOperands(r, c.h, 1000+7, 0.05), []int{1, 2, 3}, "specials 5%"); err != nil {
			return checked, err
		}
		n := 3*k.Lanes() + 3
		for _, cl := range classes {
			arrays := 2 + c.h.StateCount()
			for op := range arrays + 1 {
				o := newRuleOperands(r, c.h, n, 0.05)
				what := fmt.Sprintf("every operand all %s", cl.name)
				for j := range arrays {
					if op == arrays || op == j {
						s := o.slice(j)
						for i := range s {
							s[i] = cl.draw(r)
						}
					}
				}
				if op < arrays {
					what = fmt.Sprintf("operand %d all %s", op, cl.name)
				}
				if err := run(c, o, []int{1, 2}, what); err != nil {
					return checked, err
				}
			}
		}
	}
	return checked, nil
}

// TestRuleKernelsMatchScalar: every SIMD kernel of this CPU gives the
// scalar reference's bits for every rule (diffRuleKernel) and Lion's sign
// exactly (checkLionSign).
func TestRuleKernelsMatchScalar(t *testing.T) {
	seed := uint64(time1())
	t.Logf("seed %d", seed)
	for _, k := range simdKernels(t) {
		t.Run(k.Name(), func(t *testing.T) {
			checked, err := diffRuleKernel(k, seed)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkLionSign(k); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d element updates identical to the scalar loops", k, checked)
		})
	}
}

// checkLionSign checks Lion's update of kernel k against its definition
// where sign() is delicate: c = Beta1*m + (1-Beta1)*g is made +0, -0, a
// NaN (of either sign, any payload), ±Inf, ±subnormal or an ordinary
// number, next to params of every class, at every position of the vector
// body and the tail, and the param must become exactly p - LR*u with
// u = +1 above zero, -1 below, +0 for either zero and c itself for a NaN
// (quieted by the multiply).
func checkLionSign(k optimizer.Kernel) error {
	r := rand.New(rand.NewPCG(11, 12))
	const lr = 0.5
	h := optimizer.Hyper{Rule: optimizer.RuleLion, Beta1: 0.5, Beta2: 0.75}
	negZero := float32(math.Copysign(0, -1))
	nan := func(sign uint32, quiet bool) float32 {
		b := sign<<31 | 0x7f80_0000 | (1 + r.Uint32N(1<<22-1))
		if quiet {
			b |= 0x0040_0000
		}
		return math.Float32frombits(b)
	}
	// Pairs (m, g) whose c is the value named.
	pairs := []struct {
		name string
		m, g func() float32
	}{
		{"+0 (+0, +0)", func() float32 { return 0 }, func() float32 { return 0 }},
		{"+0 (-0, +0)", func() float32 { return negZero }, func() float32 { return 0 }},
		{"+0 (+0, -0)", func() float32 { return 0 }, func() float32 { return negZero }},
		{"-0 (-0, -0)", func() float32 { return negZero }, func() float32 { return negZero }},
		{"+0 (x, -x)", func() float32 { return 3 }, func() float32 { return -3 }},
		{"NaN from g", func() float32 { return 1 }, func() float32 { return nan(r.Uint32N(2), r.IntN(2) == 0) }},
		{"NaN from m", func() float32 { return nan(r.Uint32N(2), r.IntN(2) == 0) }, func() float32 { return -1 }},
		{"NaN from both", func() float32 { return nan(r.Uint32N(2), r.IntN(2) == 0) }, func() float32 { return nan(r.Uint32N(2), r.IntN(2) == 0) }},
		{"NaN from Inf-Inf", func() float32 { return float32(math.Inf(1)) }, func() float32 { return float32(math.Inf(-1)) }},
		{"+Inf", func() float32 { return 1 }, func() float32 { return float32(math.Inf(1)) }},
		{"-Inf", func() float32 { return float32(math.Inf(-1)) }, func() float32 { return 0 }},
		{"+subnormal", func() float32 { return math.Float32frombits(3) }, func() float32 { return math.Float32frombits(5) }},
		{"-subnormal", func() float32 { return math.Float32frombits(0x8000_0003) }, func() float32 { return negZero }},
		{"+0 from underflow", func() float32 { return math.Float32frombits(1) }, func() float32 { return 0 }},
		{"positive", func() float32 { return 0.25 }, func() float32 { return 2 }},
		{"negative", func() float32 { return -7 }, func() float32 { return 1e-3 }},
	}
	params := []float32{0, negZero, 1, -1, lr, -lr, float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(1), math.MaxFloat32}
	n := 4*k.Lanes() + 3
	for _, pair := range pairs {
		for _, p0 := range append(params, nan(0, true), nan(1, false)) {
			w, g, m := make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range n {
				w[i], m[i], g[i] = p0, pair.m(), pair.g()
				if i%5 == 4 { // ordinary neighbours
					w[i], m[i], g[i] = float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64())
				}
			}
			w0, m0, g0 := slices.Clone(w), slices.Clone(m), slices.Clone(g)
			k.Update(w, g, [][]float32{m}, 1, h, optimizer.StepParams{LR: lr})
			for i := range n {
				// The definition, with one NaN at most in each operation
				// but "NaN from both" (whose c the kernels compare with the
				// scalar loop's in diffRuleKernel): no operand order to
				// choose.
				c := float32(h.Beta1*m0[i]) + float32((1-h.Beta1)*g0[i])
				var u float32
				switch {
				case c != c:
					u = c
				case c == 0:
					u = 0
				default:
					u = float32(math.Copysign(1, float64(c)))
				}
				want := w0[i] - float32(lr*u)
				if c != c && w0[i] == w0[i] {
					// p - lr*NaN is lr*c's NaN: c quieted.
					want = math.Float32frombits(math.Float32bits(c) | 0x0040_0000)
				}
				if pair.name == "NaN from both" || (w0[i] != w0[i] && c != c) {
					if w[i] != w[i] {
						continue // both NaN: the order is diffRuleKernel's to check
					}
				}
				if math.Float32bits(w[i]) != math.Float32bits(want) {
					return fmt.Errorf("%s: Lion with c %s (m %v, g %v: c %v %#08x), param %v (%#08x), element %d of %d: param became %v (%#08x), want %v (%#08x)",
						k, pair.name, m0[i], g0[i], c, math.Float32bits(c), w0[i], math.Float32bits(w0[i]), i, n, w[i], math.Float32bits(w[i]), want, math.Float32bits(want))
				}
			}
		}
	}
	return nil
}

// TestLionSignScalar holds the scalar reference (every kernel's
// reference) to the same definition of sign.
func TestLionSignScalar(t *testing.T) {
	if err := checkLionSign(optimizer.Kernels()[0]); err != nil {
		t.Fatal(err)
	}
}
