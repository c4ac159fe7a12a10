package optimizer

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Rule names an update rule. Each keeps, per element, the fp32 master
// weight and StateCount more fp32 values (its states), all in one
// sub-group record: master | state 0 | state 1 | ...
type Rule int

// The update rules, with DeepSpeed's optimizer type names.
const (
	// RuleAdam is Adam (Hyper.AdamW: AdamW); states exp_avg, exp_avg_sq.
	RuleAdam Rule = iota
	// RuleSGD is torch.optim.SGD; with Hyper.Momentum != 0 its state is
	// momentum_buffer, without it has none.
	RuleSGD
	// RuleAdagrad is torch.optim.Adagrad; state sum.
	RuleAdagrad
	// RuleLion is Lion (Chen et al., "Symbolic Discovery of Optimization
	// Algorithms", 2023); state exp_avg.
	RuleLion
)

func (r Rule) String() string {
	switch r {
	case RuleAdam:
		return "Adam"
	case RuleSGD:
		return "SGD"
	case RuleAdagrad:
		return "Adagrad"
	case RuleLion:
		return "Lion"
	}
	return fmt.Sprintf("Rule(%d)", int(r))
}

// StateNames are the names of h's states, in record order (the names
// PyTorch's optimizers give them in their state dicts).
func (h Hyper) StateNames() []string {
	switch h.Rule {
	case RuleSGD:
		if h.Momentum != 0 {
			return []string{"momentum_buffer"}
		}
		return nil
	case RuleAdagrad:
		return []string{"sum"}
	case RuleLion:
		return []string{"exp_avg"}
	}
	return []string{"exp_avg", "exp_avg_sq"}
}

// StateCount is the number of fp32 states per element beside the master:
// a sub-group record holds 4*(1+StateCount) bytes per element.
func (h Hyper) StateCount() int { return len(h.StateNames()) }

// initialState is the value h's state k starts at.
func (h Hyper) initialState(k int) float32 {
	if h.Rule == RuleAdagrad {
		return h.InitialAccumulatorValue
	}
	return 0
}

// Update is one step of h's rule, number step (1-based), as the
// optimizer takes it with params p, on whole tensors: the gradients are
// scaled in place (when p.ScaleGrads), then the rule runs with h.With(p)
// on the master w and the states st (StateCount slices, each at least
// len(w) long), all updated in place. An in-memory reference that calls
// it gets exactly the bits of the swapper's step. g is modified.
func Update(w, g []float32, st [][]float32, step int, h Hyper, p StepParams) {
	n := len(w)
	if len(g) < n || len(st) != h.StateCount() {
		panic(fmt.Sprintf("optimizer.Update: %d parameters, %d gradients, %d state arrays (%s keeps %d)", n, len(g), len(st), h.Rule, h.StateCount()))
	}
	if p.ScaleGrads {
		ScaleGrad(g[:n], p.GradScale)
	}
	update(w, g, st, step, h.With(p))
}

// update runs h's rule with h taken as it is.
func update(w, g []float32, st [][]float32, step int, h Hyper) {
	switch h.Rule {
	case RuleSGD:
		var buf []float32
		if len(st) > 0 {
			buf = st[0]
		}
		sgd(w, g, buf, step, h)
	case RuleAdagrad:
		adagrad(w, g, st[0], step, h)
	case RuleLion:
		lion(w, g, st[0], h)
	default:
		checkLens(w, g, st[0], st[1])
		a := newAdamArgsExact(step, h)
		DefaultKernel().impl().runAdam(w, g[:len(w)], st[0][:len(w)], st[1][:len(w)], &a)
	}
}

// updateSplit is update (a rule other than Adam, whose kernels split
// themselves: adamSplit) on up to workers goroutines taking chunks of at
// least minChunk elements, as adamSplit does; elements are independent,
// so the bits are those of one call over the whole range. These rules run
// the scalar reference loop: they have no SIMD body yet.
func updateSplit(w, g []float32, st [][]float32, step int, h Hyper, workers int) {
	n := len(w)
	nw := min(workers, n/minChunk)
	if nw <= 1 {
		update(w, g, st, step, h)
		return
	}
	chunk := max(minChunk, (n/(nw*chunksPerWorker)+15)&^15)
	chunks := (n + chunk - 1) / chunk
	var next atomic.Int64
	run := func() {
		var part [MaxArrays][]float32
		for {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return
			}
			lo, hi := c*chunk, min((c+1)*chunk, n)
			ps := part[:len(st)]
			for k := range ps {
				ps[k] = st[k][lo:hi]
			}
			update(w[lo:hi], g[lo:hi], ps, step, h)
		}
	}
	var wg sync.WaitGroup
	for range nw - 1 {
		wg.Go(run)
	}
	run()
	wg.Wait()
}
