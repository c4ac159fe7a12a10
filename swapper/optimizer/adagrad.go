package optimizer

// adagrad is one step (number step, 1-based) of torch.optim.Adagrad
// (single-tensor, maximize off) on w with the squared-gradient sum s, all
// float32 but the rate, each operation rounded on its own:
//
//	clr = float32(LR / (1 + (step-1)*LRDecay))                 // float64, rounded once
//	d = g[i]
//	if WeightDecay != 0: d = d + WeightDecay*w[i]             // L2
//	s[i] = s[i] + d*d
//	std  = sqrt(s[i]) + Eps                                  // sqrt correctly rounded
//	w[i] = w[i] + ((-clr)*d) / std                           // torch's addcdiv order
//
// s starts at Hyper.InitialAccumulatorValue.
func adagrad(w, g, s []float32, step int, h Hyper) {
	n := len(w)
	g, s = g[:n], s[:n]
	clr := float32(float64(h.LR) / (1 + float64(step-1)*float64(h.LRDecay)))
	nclr := -clr
	wd, eps := h.WeightDecay, h.Eps
	for i := range w {
		wi, d := w[i], g[i]
		if wd != 0 {
			d = d + float32(wd*wi)
		}
		si := s[i] + float32(d*d)
		std := sqrt32(si) + eps
		w[i] = wi + float32(float32(nclr*d)/std)
		s[i] = si
	}
}
