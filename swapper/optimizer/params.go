package optimizer

import (
	"errors"
	"fmt"
	"math"
)

// StepParams are what may change from one optimizer step to the next: the
// learning rate a schedule sets (and the betas OneCycle's momentum cycling
// sets), and the factor every gradient is multiplied by before the update
// (loss-scale unscaling and gradient clipping combined; see GradFactor).
// BeginStepWith and StepWith take them; BeginStep and Step use
// DefaultParams.
type StepParams struct {
	// LR is the step's learning rate, used as given: 0 is a valid rate
	// (the step still updates the moments, as a schedule's first steps
	// at warmup_min_lr 0 do in DeepSpeed).
	LR float32
	// LR64, when nonzero, is the learning rate before its rounding to
	// float32 (a schedule computes it in float64, as PyTorch's do); LR
	// must then be float32(LR64). Adagrad computes its decayed rate
	// clr = LR64/(1+(step-1)*LRDecay) from it in float64 and rounds clr
	// once, as torch.optim.Adagrad does with its Python floats; every
	// other rule computes in float32 from LR. Default 0: LR is all there
	// is (float64(LR) is used).
	LR64 float64
	// Beta1 and Beta2, when nonzero, replace Options.Hyper's for this step.
	Beta1, Beta2 float32
	// ScaleGrads turns on the multiplication of every gradient element by
	// GradScale (float32 multiply, rounded once) before the update; false
	// leaves the gradients as they are (the same as GradScale 1).
	ScaleGrads bool
	GradScale  float32
}

// Validate reports every invalid field.
func (p StepParams) Validate() error {
	var errs []error
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	if !finite(p.LR) || p.LR < 0 {
		errs = append(errs, fmt.Errorf("optimizer: StepParams.LR = %v: must be a finite number >= 0", p.LR))
	}
	if p.LR64 != 0 && (math.IsNaN(p.LR64) || math.IsInf(p.LR64, 0) || p.LR64 < 0 || float32(p.LR64) != p.LR) {
		errs = append(errs, fmt.Errorf("optimizer: StepParams.LR64 = %v: must be a finite number >= 0 whose float32 rounding is StepParams.LR (%v)", p.LR64, p.LR))
	}
	for _, b := range []struct {
		name string
		v    float32
	}{{"Beta1", p.Beta1}, {"Beta2", p.Beta2}} {
		if !finite(b.v) || b.v < 0 || b.v >= 1 {
			errs = append(errs, fmt.Errorf("optimizer: StepParams.%s = %v: must be in [0, 1) (0 keeps Options.Hyper's)", b.name, b.v))
		}
	}
	if p.ScaleGrads && (!finite(p.GradScale) || p.GradScale < 0) {
		errs = append(errs, fmt.Errorf("optimizer: StepParams.GradScale = %v: must be a finite number >= 0", p.GradScale))
	}
	return errors.Join(errs...)
}

// DefaultParams are the parameters of a step taken with Step or BeginStep:
// Options.Hyper's learning rate (defaults filled) and no gradient scaling.
func (o *Optimizer) DefaultParams() StepParams { return StepParams{LR: o.opts.Hyper.LR} }

// With returns h (defaults filled) with p's learning rate and betas: the
// hyperparameters of a step taken with p.
func (h Hyper) With(p StepParams) Hyper {
	h.EnsureDefaults()
	h.LR, h.lr64 = p.LR, p.LR64
	if p.Beta1 != 0 {
		h.Beta1 = p.Beta1
	}
	if p.Beta2 != 0 {
		h.Beta2 = p.Beta2
	}
	return h
}

// ScaleGrad multiplies every element of g by s in place, in float32, each
// product rounded once: the gradient scaling of a step with
// StepParams{ScaleGrads: true, GradScale: s}.
func ScaleGrad(g []float32, s float32) {
	for i, x := range g {
		g[i] = x * s
	}
}

// AdamStep is one step of Adam as the optimizer takes it with params p:
// the gradients are scaled in place (when p.ScaleGrads), then Adam runs
// with h.With(p), whose learning rate is p.LR as given (Adam's zero-means-
// default does not apply to it). An in-memory reference that calls it on
// whole tensors gets exactly the bits of a step taken with
// BeginStepWith(ctx, p) or StepWith(ctx, p). g is modified.
func AdamStep(pw, g, m, v []float32, step int, h Hyper, p StepParams) {
	n := len(pw)
	if len(g) < n {
		panic(fmt.Sprintf("optimizer.AdamStep: %d parameters but %d gradients", n, len(g)))
	}
	if p.ScaleGrads {
		ScaleGrad(g[:n], p.GradScale)
	}
	checkLens(pw, g, m, v)
	a := newAdamArgsExact(step, h.With(p))
	DefaultKernel().impl().runAdam(pw, g[:n], m[:n], v[:n], &a)
}

// SumSquares is the sum of the squares of g, as the gradient norm is
// accumulated: in float64, element by element in index order, each square
// exact (a float32 squared fits a float64's mantissa) and each addition
// rounded once (no fused multiply-add):
//
//	s = 0; for i := range g { s = s + float64(g[i])*float64(g[i]) }
//
// It is +Inf or NaN exactly when an element is (a finite float32 squared
// cannot overflow a float64), which is how an overflow is detected.
func SumSquares(g []float32) float64 {
	var s float64
	for _, x := range g {
		d := float64(x)
		s += float64(d * d)
	}
	return s
}

// ClipEpsilon is added to the gradient norm before it is compared with
// gradient_clipping, as DeepSpeed does.
const ClipEpsilon = 1e-6

// GradFactor computes the factor every gradient element is multiplied by
// before the update, from the global sum of squares of the (loss-scaled)
// gradients, the loss scale S (1 without fp16) and gradient_clipping c (0:
// off). It follows DeepSpeed ZeRO-3's unscale_and_clip_grads, in float64:
//
//	norm = sqrt(sumSq) / S                 // the norm of the unscaled gradients
//	q    = (norm + 1e-6) / c               // when c > 0
//	k    = S * q  if c > 0 and q > 1, else S
//	factor = float32(1 / k)                // rounded to float32 once
//
// coef is the clip coefficient 1/q when clipping triggered, else 1 (what
// the unscaled norm was multiplied by). Unscaling and clipping are one
// multiplication, as in DeepSpeed. A non-finite sumSq (an overflow) gives
// a non-finite norm; the caller skips such a step under fp16.
func GradFactor(sumSq, lossScale, clip float64) (factor float32, norm, coef float64) {
	norm = math.Sqrt(sumSq) / lossScale
	k := lossScale
	coef = 1
	if clip > 0 {
		q := (norm + ClipEpsilon) / clip
		if q > 1 {
			k = q * lossScale
			coef = 1 / q
		}
	}
	return float32(1 / k), norm, coef
}
