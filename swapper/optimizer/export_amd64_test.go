package optimizer

import (
	"math"
	"unsafe"
)

// This file gives the tests kernels whose vector bodies are Go models of
// the amd64 assembly: each operation of the generated kernels written out
// one element at a time, with x86's NaN rule spelled out (an operation
// with a NaN operand returns the first NaN operand, quieted), so the
// operand order of every addition is explicit rather than left to the
// compiler. The faithful model must pass the differential tests; each
// mutant changes one thing a hand-written kernel could get wrong (an
// addition's operand order, a fused multiply-add, a reciprocal instead of
// a divide, the sign of zero or NaN, a write past the end, a vector left
// out), and the differential tests must catch every one. That shows they
// would catch such a mistake in the assembly.

// Mutant is a kernel built on a Go model of the SIMD kernels.
type Mutant struct {
	// Name says what the kernel gets wrong, or "faithful" for none.
	Name string
	// Faithful is true for the unmutated model, which must agree with the
	// scalar reference bit for bit.
	Faithful bool
	Kernel   Kernel
}

// Mutants returns the faithful model and one kernel per mutation, each
// with 8 lanes (the AVX2 shape: the scalar loop runs the last n%8).
func Mutants() []Mutant {
	mk := func(name string) Mutant {
		m := mutation(name)
		return Mutant{Name: name, Faithful: name == "faithful", Kernel: Kernel{&kernel{
			name: "model-" + name, lanes: 8,
			adam: m.adamModel, sgd: m.sgdModel, adagrad: m.adagradModel, lion: m.lionModel,
		}}}
	}
	out := []Mutant{mk("faithful")}
	for _, name := range []string{
		"adam/exp_avg-add-order", "adam/divide-by-reciprocal",
		"sgd/weight-decay-add-order", "sgd/momentum-fma", "sgd/nesterov-add-order",
		"adagrad/sum-add-order", "adagrad/update-add-order", "adagrad/divide-by-reciprocal",
		"lion/sign-of-zero-kept", "lion/sign-of-nan-one", "lion/sign-of-nan-zero", "lion/exp_avg-add-order",
		"any/writes-past-end", "any/skips-last-vector",
	} {
		out = append(out, mk(name))
	}
	return out
}

// mutation names the one deviation of a model kernel.
type mutation string

// quiet returns the NaN x with its quiet bit set, as x86 returns a NaN
// operand.
func quiet(x float32) float32 { return math.Float32frombits(math.Float32bits(x) | 0x0040_0000) }

// op is x86's binary operation f on a and b: a's NaN (quieted) if a is a
// NaN, else b's, else f's result (which may be the default NaN).
func op(a, b float32, f func(a, b float32) float32) float32 {
	if a != a {
		return quiet(a)
	}
	if b != b {
		return quiet(b)
	}
	return f(a, b)
}

func add(a, b float32) float32 { return op(a, b, func(a, b float32) float32 { return a + b }) }
func sub(a, b float32) float32 { return op(a, b, func(a, b float32) float32 { return a - b }) }
func mul(a, b float32) float32 { return op(a, b, func(a, b float32) float32 { return a * b }) }
func div(a, b float32) float32 { return op(a, b, func(a, b float32) float32 { return a / b }) }

// fma is a fused multiply-add a*b + c, rounded once (float64's product of
// two float32s is exact).
func fma(a, b, c float32) float32 {
	return float32(math.FMA(float64(a), float64(b), float64(c)))
}

// sqrtx is x86's square root: a NaN stays (quieted), a negative number
// gives the default NaN.
func sqrtx(x float32) float32 {
	if x != x {
		return quiet(x)
	}
	return sqrt32(x)
}

// view returns the n floats at p, or nil for a nil p.
func view(p *float32, n int) []float32 {
	if p == nil {
		return nil
	}
	return unsafe.Slice(p, n)
}

// vectors is how many elements the model's vector body updates: all n,
// or one vector less for "any/skips-last-vector".
func (m mutation) vectors(n int) int {
	if m == "any/skips-last-vector" {
		return n - 8
	}
	return n
}

// pastEnd spoils the element after the last one for "any/writes-past-end"
// (a guard, or the first element of the scalar tail).
func (m mutation) pastEnd(w *float32, n int) {
	if m == "any/writes-past-end" {
		e := (*float32)(unsafe.Add(unsafe.Pointer(w), 4*n))
		*e = *e + 1
	}
}

func (m mutation) adamModel(p, grad, mv, vv *float32, n int, args [adamArgCount]float32, mode int) {
	ps, gs, ms, vs := view(p, n), view(grad, n), view(mv, n), view(vv, n)
	k := args
	for i := range m.vectors(n) {
		pi, gi := ps[i], gs[i]
		switch mode {
		case decayL2:
			gi = add(gi, mul(k[argL2], pi))
		case decayAdamW:
			pi = mul(pi, k[argDecay])
		}
		var mi float32
		if m == "adam/exp_avg-add-order" {
			mi = add(mul(k[argBeta1], ms[i]), mul(k[argOneMinusBeta1], gi))
		} else {
			mi = add(mul(k[argOneMinusBeta1], gi), mul(k[argBeta1], ms[i]))
		}
		vi := add(mul(mul(k[argOneMinusBeta2], gi), gi), mul(k[argBeta2], vs[i]))
		denom := add(div(sqrtx(vi), k[argBC2Sqrt]), k[argEps])
		var q float32
		if m == "adam/divide-by-reciprocal" {
			q = mul(mi, div(1, denom))
		} else {
			q = div(mi, denom)
		}
		ps[i], ms[i], vs[i] = sub(pi, mul(k[argStepSize], q)), mi, vi
	}
	m.pastEnd(p, n)
}

func (m mutation) sgdModel(w, grad, buf *float32, n int, args [sgdArgCount]float32, mode int) {
	ws, gs, bs := view(w, n), view(grad, n), view(buf, n)
	k := args
	for i := range m.vectors(n) {
		wi, d := ws[i], gs[i]
		if mode&sgdWeightDecay != 0 {
			if m == "sgd/weight-decay-add-order" {
				d = add(mul(k[sgdArgWeightDecay], wi), d)
			} else {
				d = add(d, mul(k[sgdArgWeightDecay], wi))
			}
		}
		if mode&sgdMomentum != 0 {
			b := d
			if mode&sgdLater != 0 {
				if m == "sgd/momentum-fma" {
					b = fma(k[sgdArgMomentum], bs[i], mul(k[sgdArgOneMinusDampening], d))
				} else {
					b = add(mul(k[sgdArgMomentum], bs[i]), mul(k[sgdArgOneMinusDampening], d))
				}
			}
			bs[i] = b
			if mode&sgdNesterov != 0 {
				if m == "sgd/nesterov-add-order" {
					d = add(d, mul(k[sgdArgMomentum], b))
				} else {
					d = add(mul(k[sgdArgMomentum], b), d)
				}
			} else {
				d = b
			}
		}
		ws[i] = sub(wi, mul(k[sgdArgLR], d))
	}
	m.pastEnd(w, n)
}

func (m mutation) adagradModel(w, grad, s *float32, n int, args [adagradArgCount]float32, mode int) {
	ws, gs, ss := view(w, n), view(grad, n), view(s, n)
	k := args
	for i := range m.vectors(n) {
		wi, d := ws[i], gs[i]
		if mode&adagradWeightDecay != 0 {
			d = add(d, mul(k[adagradArgWeightDecay], wi))
		}
		var si float32
		if m == "adagrad/sum-add-order" {
			si = add(ss[i], mul(d, d))
		} else {
			si = add(mul(d, d), ss[i])
		}
		std := add(sqrtx(si), k[adagradArgEps])
		num := mul(k[adagradArgNegCLR], d)
		var q float32
		if m == "adagrad/divide-by-reciprocal" {
			q = mul(num, div(1, std))
		} else {
			q = div(num, std)
		}
		if m == "adagrad/update-add-order" {
			ws[i] = add(wi, q)
		} else {
			ws[i] = add(q, wi)
		}
		ss[i] = si
	}
	m.pastEnd(w, n)
}

func (m mutation) lionModel(w, grad, mom *float32, n int, args [lionArgCount]float32, mode int) {
	ws, gs, ms := view(w, n), view(grad, n), view(mom, n)
	k := args
	for i := range m.vectors(n) {
		gi, mi := gs[i], ms[i]
		c := add(mul(k[lionArgOneMinusBeta1], gi), mul(k[lionArgBeta1], mi))
		wi := ws[i]
		if mode&lionDecay != 0 {
			wi = mul(wi, k[lionArgDecay])
		}
		var u float32
		switch {
		case c != c:
			u = c
			switch m {
			case "lion/sign-of-nan-one":
				u = 1
			case "lion/sign-of-nan-zero": // c > 0 and c < 0 both false
				u = 0
			}
		case c == 0:
			u = 0
			if m == "lion/sign-of-zero-kept" {
				u = c
			}
		default:
			u = float32(math.Copysign(1, float64(c)))
		}
		ws[i] = sub(wi, mul(k[lionArgLR], u))
		if m == "lion/exp_avg-add-order" {
			ms[i] = add(mul(k[lionArgBeta2], mi), mul(k[lionArgOneMinusBeta2], gi))
		} else {
			ms[i] = add(mul(k[lionArgOneMinusBeta2], gi), mul(k[lionArgBeta2], mi))
		}
	}
	m.pastEnd(w, n)
}
