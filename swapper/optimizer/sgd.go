package optimizer

// Modes of the SGD kernels: a bit set naming the optional element
// operations that run (sgdArgs.mode).
const (
	sgdWeightDecay = 1 << iota // d = d + WeightDecay*w[i]
	sgdMomentum                // a momentum buffer: buf[i] = d (step 1)
	sgdLater                   // with sgdMomentum, past step 1: buf[i] = Momentum*buf[i] + (1-Dampening)*d
	sgdNesterov                // with sgdMomentum: d = d + Momentum*buf[i] (else d = buf[i])
)

// Indexes of the per-call constants in sgdArgs.k: the order the assembly
// kernels read them in (internal/asmgen declares the same).
const (
	sgdArgLR = iota
	sgdArgWeightDecay
	sgdArgMomentum
	sgdArgOneMinusDampening
	sgdArgCount
)

// sgdArgs are the scalars of one SGD step, shared by every element and
// every kernel.
type sgdArgs struct {
	k    [sgdArgCount]float32
	mode int
}

// newSGDArgs computes the constants of step number step (1-based) of
// torch.optim.SGD with h taken as it is.
func newSGDArgs(step int, h Hyper) sgdArgs {
	var a sgdArgs
	a.k[sgdArgLR] = h.LR
	a.k[sgdArgWeightDecay] = h.WeightDecay
	a.k[sgdArgMomentum] = h.Momentum
	a.k[sgdArgOneMinusDampening] = 1 - h.Dampening
	if h.WeightDecay != 0 {
		a.mode |= sgdWeightDecay
	}
	if h.Momentum != 0 {
		a.mode |= sgdMomentum
		if step > 1 {
			a.mode |= sgdLater
		}
		if h.Nesterov {
			a.mode |= sgdNesterov
		}
	}
	return a
}

// sgdScalar is the reference loop of torch.optim.SGD (single-tensor,
// maximize off) on w, with momentum buffer buf (unused without momentum),
// all float32, each operation rounded on its own (the conversions keep the
// compiler from fusing a multiply and an add):
//
//	d = g[i]
//	if WeightDecay != 0: d = d + WeightDecay*w[i]             // L2, as torch
//	if Momentum != 0:
//	    buf[i] = d                                           at step 1 (torch clones the gradient)
//	    buf[i] = Momentum*buf[i] + (1-Dampening)*d            later steps
//	    d = d + Momentum*buf[i]   if Nesterov, else d = buf[i]
//	w[i] = w[i] - LR*d
//
// The SIMD kernels perform the same operations in the same order, with
// the operand this loop's compiled code puts first where both could be NaN
// (see adamScalar), and it runs the tails they leave.
func sgdScalar(w, g, buf []float32, a *sgdArgs) {
	n := len(w)
	g = g[:n]
	lr, wd, mom, damp := a.k[sgdArgLR], a.k[sgdArgWeightDecay], a.k[sgdArgMomentum], a.k[sgdArgOneMinusDampening]
	decay := a.mode&sgdWeightDecay != 0
	momentum := a.mode&sgdMomentum != 0
	later := a.mode&sgdLater != 0
	nesterov := a.mode&sgdNesterov != 0
	if momentum {
		buf = buf[:n]
	}
	for i := range w {
		wi, d := w[i], g[i]
		if decay {
			d = d + float32(wd*wi)
		}
		if momentum {
			b := d
			if later {
				b = float32(mom*buf[i]) + float32(damp*d)
			}
			buf[i] = b
			if nesterov {
				d = d + float32(mom*b)
			} else {
				d = b
			}
		}
		w[i] = wi - float32(lr*d)
	}
}
