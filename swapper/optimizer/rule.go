package optimizer

import "fmt"

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
// len(w) long), all updated in place. It runs on DefaultKernel; every
// kernel gives the same bits (Kernel.Update), so an in-memory reference
// that calls it gets exactly the bits of the swapper's step. g is
// modified.
func Update(w, g []float32, st [][]float32, step int, h Hyper, p StepParams) {
	DefaultKernel().Update(w, g, st, step, h, p)
}
