package optimizer

import "math"

// Modes of the Lion kernels (lionArgs.mode).
const (
	lionDecay = 1 // w[i] = w[i] * (1 - LR*WeightDecay)
)

// Indexes of the per-call constants in lionArgs.k: the order the assembly
// kernels read them in (internal/asmgen declares the same).
const (
	lionArgBeta1 = iota
	lionArgOneMinusBeta1
	lionArgBeta2
	lionArgOneMinusBeta2
	lionArgLR
	lionArgDecay   // 1 - LR*WeightDecay
	lionArgOne     // 1: the vector constants of the SIMD sign
	lionArgSignBit // -0: only the sign bit set
	lionArgCount
)

// lionArgs are the scalars of one Lion step, shared by every element and
// every kernel.
type lionArgs struct {
	k    [lionArgCount]float32
	mode int
}

// newLionArgs computes the constants of a Lion step with h taken as it
// is. A decay factor that rounds to 1 is skipped, as in Adam's AdamW mode.
func newLionArgs(h Hyper) lionArgs {
	var a lionArgs
	b1, b2 := h.Beta1, h.Beta2
	a.k[lionArgBeta1], a.k[lionArgOneMinusBeta1] = b1, 1-b1
	a.k[lionArgBeta2], a.k[lionArgOneMinusBeta2] = b2, 1-b2
	a.k[lionArgLR] = h.LR
	a.k[lionArgDecay] = 1
	a.k[lionArgOne] = 1
	a.k[lionArgSignBit] = float32(math.Copysign(0, -1))
	if h.WeightDecay != 0 {
		a.k[lionArgDecay] = 1 - float32(h.LR*h.WeightDecay)
		if a.k[lionArgDecay] != 1 {
			a.mode = lionDecay
		}
	}
	return a
}

// lionScalar is the reference loop of Lion (Chen et al., "Symbolic
// Discovery of Optimization Algorithms", 2023, Program 1) on w with the
// momentum m, in float32, each operation rounded on its own, weight decay
// decoupled as in the paper and DeepSpeed's Lion:
//
//	c    = Beta1*m[i] + (1-Beta1)*g[i]
//	w[i] = w[i] * (1 - LR*WeightDecay)                        // when WeightDecay != 0
//	w[i] = w[i] - LR*sign(c)                                  // sign(±0) = +0; NaN stays NaN
//	m[i] = Beta2*m[i] + (1-Beta2)*g[i]
//
// sign(c) is +1 or -1 for c above or below zero, +0 for either zero, and c
// itself (payload and sign) for a NaN c. The SIMD kernels compute the same
// sign from comparisons and bit masks and perform the same operations in
// the same order, with the operand this loop's compiled code puts first
// where both could be NaN (see adamScalar); this loop runs the tails they
// leave.
func lionScalar(w, g, m []float32, a *lionArgs) {
	n := len(w)
	g, m = g[:n], m[:n]
	b1, c1, b2, c2 := a.k[lionArgBeta1], a.k[lionArgOneMinusBeta1], a.k[lionArgBeta2], a.k[lionArgOneMinusBeta2]
	lr, decay := a.k[lionArgLR], a.k[lionArgDecay]
	decayOn := a.mode&lionDecay != 0
	for i := range w {
		gi, mi := g[i], m[i]
		c := float32(b1*mi) + float32(c1*gi)
		wi := w[i]
		if decayOn {
			wi = float32(wi * decay)
		}
		var u float32
		switch {
		case c > 0:
			u = 1
		case c < 0:
			u = -1
		case c != c:
			u = c
		}
		w[i] = wi - float32(lr*u)
		m[i] = float32(b2*mi) + float32(c2*gi)
	}
}
