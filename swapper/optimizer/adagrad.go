package optimizer

// Modes of the Adagrad kernels (adagradArgs.mode).
const (
	adagradWeightDecay = 1 // d = d + WeightDecay*w[i]
)

// Indexes of the per-call constants in adagradArgs.k: the order the
// assembly kernels read them in (internal/asmgen declares the same).
const (
	adagradArgNegCLR = iota // -LR/(1+(step-1)*LRDecay)
	adagradArgWeightDecay
	adagradArgEps
	adagradArgCount
)

// adagradArgs are the scalars of one Adagrad step, shared by every element
// and every kernel.
type adagradArgs struct {
	k    [adagradArgCount]float32
	mode int
}

// newAdagradArgs computes the constants of step number step (1-based) of
// torch.optim.Adagrad with h taken as it is: the decayed rate from the
// float64 learning rate (StepParams.LR64 when the step has one) and
// LRDecay, in float64, rounded once to float32 as torch's addcdiv rounds
// its double value for a float32 parameter. The kernels read it as a
// constant (adagradArgNegCLR), so every kernel keeps the scalar loop's
// bits.
func newAdagradArgs(step int, h Hyper) adagradArgs {
	var a adagradArgs
	lr := float64(h.LR)
	if h.lr64 != 0 {
		lr = h.lr64
	}
	clr := float32(lr / (1 + float64(step-1)*h.LRDecay))
	a.k[adagradArgNegCLR] = -clr
	a.k[adagradArgWeightDecay] = h.WeightDecay
	a.k[adagradArgEps] = h.Eps
	if h.WeightDecay != 0 {
		a.mode = adagradWeightDecay
	}
	return a
}

// adagradScalar is the reference loop of torch.optim.Adagrad
// (single-tensor, maximize off) on w with the squared-gradient sum s, all
// float32 but the rate, each operation rounded on its own:
//
//	clr = float32(LR64 / (1 + (step-1)*LRDecay))               // float64, rounded once
//	d = g[i]
//	if WeightDecay != 0: d = d + WeightDecay*w[i]             // L2
//	s[i] = s[i] + d*d
//	std  = sqrt(s[i]) + Eps                                  // sqrt correctly rounded
//	w[i] = w[i] + ((-clr)*d) / std                           // torch's addcdiv order
//
// s starts at Hyper.InitialAccumulatorValue. The SIMD kernels perform the
// same operations in the same order, with the operand this loop's compiled
// code puts first where both could be NaN (see adamScalar), and it runs
// the tails they leave.
func adagradScalar(w, g, s []float32, a *adagradArgs) {
	n := len(w)
	g, s = g[:n], s[:n]
	nclr, wd, eps := a.k[adagradArgNegCLR], a.k[adagradArgWeightDecay], a.k[adagradArgEps]
	decay := a.mode&adagradWeightDecay != 0
	for i := range w {
		wi, d := w[i], g[i]
		if decay {
			d = d + float32(wd*wi)
		}
		si := s[i] + float32(d*d)
		std := sqrt32(si) + eps
		w[i] = wi + float32(float32(nclr*d)/std)
		s[i] = si
	}
}
