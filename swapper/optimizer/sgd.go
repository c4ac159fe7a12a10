package optimizer

// sgd is one step of torch.optim.SGD (single-tensor, maximize off) on w,
// with momentum buffer buf (nil without momentum), all float32, each
// operation rounded on its own (the conversions keep the compiler from
// fusing a multiply and an add):
//
//	d = g[i]
//	if WeightDecay != 0: d = d + WeightDecay*w[i]             // L2, as torch
//	if Momentum != 0:
//	    buf[i] = d                                           at step 1 (torch clones the gradient)
//	    buf[i] = Momentum*buf[i] + (1-Dampening)*d            later steps
//	    d = d + Momentum*buf[i]   if Nesterov, else d = buf[i]
//	w[i] = w[i] - LR*d
func sgd(w, g, buf []float32, step int, h Hyper) {
	n := len(w)
	g = g[:n]
	lr, wd, mom := h.LR, h.WeightDecay, h.Momentum
	damp := 1 - h.Dampening
	if mom != 0 {
		buf = buf[:n]
	}
	for i := range w {
		wi, d := w[i], g[i]
		if wd != 0 {
			d = d + float32(wd*wi)
		}
		if mom != 0 {
			b := d
			if step > 1 {
				b = float32(mom*buf[i]) + float32(damp*d)
			}
			buf[i] = b
			if h.Nesterov {
				d = d + float32(mom*b)
			} else {
				d = b
			}
		}
		w[i] = wi - float32(lr*d)
	}
}
