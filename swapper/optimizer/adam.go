package optimizer

import (
	"errors"
	"fmt"
	"math"
)

// Hyper holds Adam's hyperparameters. Zero fields take the defaults listed
// below (EnsureDefaults), as DeepSpeed's and PyTorch's Adam do; a literal
// zero Beta1, Beta2 or Eps therefore cannot be expressed (use a tiny value).
type Hyper struct {
	// LR is the learning rate. Default 1e-3.
	LR float32
	// Beta1 is the decay of the first moment (exp_avg). Default 0.9.
	Beta1 float32
	// Beta2 is the decay of the second moment (exp_avg_sq). Default 0.999.
	Beta2 float32
	// Eps is added to the denominator for numerical stability. Default 1e-8.
	Eps float32
	// WeightDecay is the decay coefficient. Default 0 (none).
	WeightDecay float32
	// AdamW selects decoupled weight decay (the parameter is scaled by
	// 1-LR*WeightDecay before the update) instead of L2 regularisation (the
	// decay term added to the gradient). Default false, as in DeepSpeed's
	// DeepSpeedCPUAdam(adamw_mode=False) and torch.optim.Adam.
	AdamW bool

	// Rule is the update rule. Default RuleAdam. The fields above serve
	// every rule that has them (Lion: LR, Beta1, Beta2, WeightDecay;
	// Adagrad: LR, Eps, WeightDecay; SGD: LR, WeightDecay); the ones
	// below belong to one rule each. Defaults depend on the rule: LR 1e-3
	// (Adam, SGD), 1e-2 (Adagrad), 1e-4 (Lion); Beta2 0.999 (Adam), 0.99
	// (Lion); Eps 1e-8 (Adam), 1e-10 (Adagrad).
	Rule Rule
	// Momentum, Dampening and Nesterov are torch.optim.SGD's; Momentum 0
	// means plain SGD (no state). Nesterov needs Momentum > 0 and
	// Dampening 0.
	Momentum, Dampening float32
	Nesterov            bool
	// LRDecay and InitialAccumulatorValue are torch.optim.Adagrad's.
	// LRDecay is a float64, as torch's Python float is: the decayed rate
	// is computed in float64 (see StepParams.LR64).
	LRDecay                 float64
	InitialAccumulatorValue float32

	// lr64 is StepParams.LR64 of the step these are the hyperparameters
	// of (With), 0 when none: LR before its rounding to float32.
	lr64 float64
}

// Default hyperparameters (torch.optim.Adam's).
const (
	DefaultLR    float32 = 1e-3
	DefaultBeta1 float32 = 0.9
	DefaultBeta2 float32 = 0.999
	DefaultEps   float32 = 1e-8
)

// EnsureDefaults fills the zero fields of h with their documented defaults
// (those of h.Rule).
func (h *Hyper) EnsureDefaults() {
	lr, b2, eps := DefaultLR, DefaultBeta2, DefaultEps
	switch h.Rule {
	case RuleAdagrad:
		lr, eps = 1e-2, 1e-10
	case RuleLion:
		lr, b2 = 1e-4, 0.99
	}
	if h.LR == 0 {
		h.LR = lr
	}
	if h.Beta1 == 0 {
		h.Beta1 = DefaultBeta1
	}
	if h.Beta2 == 0 {
		h.Beta2 = b2
	}
	if h.Eps == 0 {
		h.Eps = eps
	}
}

// Validate reports every invalid field of h at once. Zero fields are valid
// (they mean the default).
func (h *Hyper) Validate() error {
	var errs []error
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	if !finite(h.LR) || h.LR < 0 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.LR = %v: must be a finite number > 0 (0 means %v)", h.LR, DefaultLR))
	}
	if !finite(h.Beta1) || h.Beta1 < 0 || h.Beta1 >= 1 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.Beta1 = %v: must be in [0, 1) (0 means %v)", h.Beta1, DefaultBeta1))
	}
	if !finite(h.Beta2) || h.Beta2 < 0 || h.Beta2 >= 1 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.Beta2 = %v: must be in [0, 1) (0 means %v)", h.Beta2, DefaultBeta2))
	}
	if !finite(h.Eps) || h.Eps < 0 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.Eps = %v: must be a finite number > 0 (0 means %v)", h.Eps, DefaultEps))
	}
	if !finite(h.WeightDecay) || h.WeightDecay < 0 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.WeightDecay = %v: must be a finite number >= 0", h.WeightDecay))
	}
	if h.Rule < RuleAdam || h.Rule > RuleLion {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.Rule = %v: must be RuleAdam, RuleSGD, RuleAdagrad or RuleLion", h.Rule))
	}
	if !finite(h.Momentum) || h.Momentum < 0 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.Momentum = %v: must be a finite number >= 0", h.Momentum))
	}
	if !finite(h.Dampening) {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.Dampening = %v: must be a finite number", h.Dampening))
	}
	if h.Nesterov && (h.Momentum <= 0 || h.Dampening != 0) {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.Nesterov needs Momentum > 0 and Dampening 0 (have %v and %v)", h.Momentum, h.Dampening))
	}
	if math.IsNaN(h.LRDecay) || math.IsInf(h.LRDecay, 0) || h.LRDecay < 0 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.LRDecay = %v: must be a finite number >= 0", h.LRDecay))
	}
	if !finite(h.InitialAccumulatorValue) || h.InitialAccumulatorValue < 0 {
		errs = append(errs, fmt.Errorf("optimizer: Hyper.InitialAccumulatorValue = %v: must be a finite number >= 0", h.InitialAccumulatorValue))
	}
	return errors.Join(errs...)
}

// Adam applies one Adam (or AdamW) step, number step (1-based), to the
// parameters p in place, given the gradients g and the moments m (exp_avg)
// and v (exp_avg_sq), which it also updates in place. Zero fields of h take
// their defaults. It is the one update rule of zinf: the NVMe-backed
// Optimizer and any in-memory reference loop call it, so their results
// agree bit for bit. Adam runs on DefaultKernel (SIMD where the CPU has
// it); every kernel gives exactly the bits of the scalar reference loop
// (KernelScalar), see Kernel.
//
// All arithmetic is float32, each operation rounded on its own (explicit
// conversions keep the compiler from fusing a multiply and an add into an
// FMA, and the SIMD kernels use separate multiply, add, subtract, divide
// and square-root instructions, so the result is the same on every
// architecture and kernel). With t = step:
//
//	bc1      = 1 - float32(Beta1^t)          // powers in float64 (math.Pow), rounded once
//	bc2sqrt  = float32(sqrt(1 - float32(Beta2^t)))
//	stepSize = LR / bc1
//	for each i:
//	    gi = g[i]
//	    if WeightDecay != 0 && !AdamW: gi = gi + WeightDecay*p[i]       // L2
//	    if WeightDecay != 0 &&  AdamW: p[i] = p[i] * (1 - LR*WeightDecay) // decoupled
//	    m[i]  = Beta1*m[i] + (1-Beta1)*gi
//	    v[i]  = Beta2*v[i] + ((1-Beta2)*gi)*gi
//	    denom = sqrt(v[i])/bc2sqrt + Eps     // sqrt correctly rounded to float32
//	    p[i]  = p[i] - stepSize*(m[i]/denom)
//
// which is torch.optim.Adam's formula. Elements are independent, so
// updating a tensor in several chunks gives the same bits as updating it
// whole.
//
// g, m and v must have at least len(p) elements and step must be >= 1;
// anything else is a programming error and panics (like copy into a short
// slice would), because the signature has no error to return.
func Adam(p, g, m, v []float32, step int, h Hyper) {
	DefaultKernel().Adam(p, g, m, v, step, h)
}

// Weight-decay modes of the Adam kernels: which of the two optional
// element operations runs (adamArgs.mode).
const (
	decayNone    = 0 // WeightDecay 0 (or an AdamW factor that rounds to 1)
	decayL2      = 1 // gi = gi + WeightDecay*p[i]
	decayAdamW   = 2 // p[i] = p[i] * (1 - LR*WeightDecay)
	adamArgCount = 9
)

// Indexes of the per-call constants in adamArgs.k: the order the
// assembly kernels read them in (internal/asmgen declares the same).
const (
	argBeta1 = iota
	argOneMinusBeta1
	argBeta2
	argOneMinusBeta2
	argBC2Sqrt
	argEps
	argStepSize
	argL2
	argDecay
)

// adamArgs are the scalars of one Adam step, computed once per step (in
// float32, each rounded on its own) and shared by every element and every
// kernel.
type adamArgs struct {
	k    [adamArgCount]float32
	mode int
}

// newAdamArgs checks step and computes its constants from h (zero fields
// defaulted).
func newAdamArgs(step int, h Hyper) adamArgs {
	h.EnsureDefaults()
	return newAdamArgsExact(step, h)
}

// newAdamArgsExact is newAdamArgs with h taken as it is (no defaults: a
// zero LR is a zero learning rate), for a step with StepParams.
func newAdamArgsExact(step int, h Hyper) adamArgs {
	if step < 1 {
		panic(fmt.Sprintf("optimizer.Adam: step %d: steps are numbered from 1", step))
	}
	var a adamArgs
	b1, b2 := h.Beta1, h.Beta2
	bc1 := 1 - float32(math.Pow(float64(b1), float64(step)))
	a.k[argBeta1], a.k[argOneMinusBeta1] = b1, 1-b1
	a.k[argBeta2], a.k[argOneMinusBeta2] = b2, 1-b2
	a.k[argBC2Sqrt] = sqrt32(1 - float32(math.Pow(float64(b2), float64(step))))
	a.k[argEps] = h.Eps
	a.k[argStepSize] = h.LR / bc1
	a.k[argDecay] = 1
	if h.WeightDecay != 0 {
		if h.AdamW {
			a.k[argDecay] = 1 - float32(h.LR*h.WeightDecay)
			if a.k[argDecay] != 1 {
				a.mode = decayAdamW
			}
		} else {
			a.k[argL2] = h.WeightDecay
			a.mode = decayL2
		}
	}
	return a
}

// checkLens panics unless g, m and v hold len(p) elements.
func checkLens(p, g, m, v []float32) {
	if n := len(p); len(g) < n || len(m) < n || len(v) < n {
		panic(fmt.Sprintf("optimizer.Adam: %d parameters but %d gradients, %d exp_avg, %d exp_avg_sq", n, len(g), len(m), len(v)))
	}
}

// adamScalar is the reference loop: one element at a time, every
// operation a scalar float32 operation rounded on its own. The SIMD
// kernels perform the same operations in the same order on several
// elements at once, with the same operands first where two could be NaN
// (x86 and Arm return the first operand's NaN), so their results are the
// same bits, NaN payloads included. It also runs the tails the SIMD
// kernels leave.
func adamScalar(p, g, m, v []float32, a *adamArgs) {
	n := len(p)
	b1, c1, b2, c2 := a.k[argBeta1], a.k[argOneMinusBeta1], a.k[argBeta2], a.k[argOneMinusBeta2]
	bc2sqrt, eps, stepSize := a.k[argBC2Sqrt], a.k[argEps], a.k[argStepSize]
	var l2 float32
	decay := float32(1)
	switch a.mode {
	case decayL2:
		l2 = a.k[argL2]
	case decayAdamW:
		decay = a.k[argDecay]
	}
	g, m, v = g[:n], m[:n], v[:n] // lets the compiler drop bounds checks
	for i := range p {
		pi, gi := p[i], g[i]
		if l2 != 0 {
			gi = gi + float32(l2*pi)
		}
		if decay != 1 {
			pi = float32(pi * decay)
		}
		mi := float32(b1*m[i]) + float32(c1*gi)
		vi := float32(b2*v[i]) + float32(float32(c2*gi)*gi)
		denom := float32(sqrt32(vi)/bc2sqrt) + eps
		pi = pi - float32(stepSize*float32(mi/denom))
		p[i], m[i], v[i] = pi, mi, vi
	}
}

// sqrt32 is the correctly rounded float32 square root: the float64 root of
// a float32 is exact enough (53 >= 2*24+2 bits) that rounding it once more
// gives the correctly rounded result.
func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
