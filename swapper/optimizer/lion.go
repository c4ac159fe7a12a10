package optimizer

// lion is one step of Lion (Chen et al., "Symbolic Discovery of
// Optimization Algorithms", 2023, Program 1) on w with the momentum m, in
// float32, each operation rounded on its own, weight decay decoupled as in
// the paper and DeepSpeed's Lion:
//
//	c    = Beta1*m[i] + (1-Beta1)*g[i]
//	w[i] = w[i] * (1 - LR*WeightDecay)                        // when WeightDecay != 0
//	w[i] = w[i] - LR*sign(c)                                  // sign(0) = 0; NaN stays NaN
//	m[i] = Beta2*m[i] + (1-Beta2)*g[i]
func lion(w, g, m []float32, h Hyper) {
	n := len(w)
	g, m = g[:n], m[:n]
	b1, b2, lr := h.Beta1, h.Beta2, h.LR
	c1, c2 := 1-b1, 1-b2
	decay := float32(1)
	if h.WeightDecay != 0 {
		decay = 1 - float32(lr*h.WeightDecay)
	}
	for i := range w {
		gi, mi := g[i], m[i]
		c := float32(b1*mi) + float32(c1*gi)
		wi := w[i]
		if decay != 1 {
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
