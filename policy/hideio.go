package policy

import (
	"fmt"
	"math"
	"time"
)

// IOCover says how many micro-batches a layer-major step needs for its
// compute to cover its NVMe traffic (Placement.MicroBatchesToHideIO).
//
// The model: in layer-major order one read of a layer's parameters serves
// every micro-batch of the step, and each gradient is written once after
// the last, so a step's I/O is the same whatever its number of
// micro-batches k, while its compute is k times one micro-batch's. The
// I/O that runs under the passes is hidden once
//
//	k >= ceil((IOPerStep - AfterBackward) / ComputePerMicroBatch)
//
// What runs after the backward pass, with no compute under it (the
// optimizer step when it does not overlap the pass), is exposed whatever
// k is. At that k the compute equals the disk's time; the step still
// waits for the pipeline's ends (the first layer's read, the last
// layer's writes and update), which the step prediction shows.
type IOCover struct {
	// ComputePerMicroBatch is one micro-batch's forward and backward
	// compute over every layer: Hints.ComputeSecondsPerLayer times the
	// layers. 0: not known, and MicroBatches is 0.
	ComputePerMicroBatch time.Duration
	// IOPerStep is the disk's time in a layer-major step, the same for
	// every k: the offloaded parameters brought in for the forward and
	// the backward pass, the offloaded gradients moved out once, and the
	// optimizer step's traffic, as the step prediction counts them
	// (StepPrediction's ParamIO, GradIO less the hand-offs, OptimizerIO).
	IOPerStep time.Duration
	// AfterBackward is the part of IOPerStep that no compute runs under:
	// the optimizer step's, when it runs after the backward pass
	// (Placement.OverlapStep false); 0 when it overlaps the pass.
	AfterBackward time.Duration
	// MicroBatches is the fewest micro-batches whose compute covers the
	// I/O under the passes, at least 1 (ceil of their ratio); 0 when the
	// compute is not known.
	MicroBatches int
	// ByPass is set by MicroBatchesToHideIOPasses: each pass's compute
	// covers its own I/O (the forward pass only reads parameters; the
	// backward pass reads them again and carries the gradients' writes
	// and, when it overlaps, the optimizer step's traffic), and
	// MicroBatches is the larger of the two passes' k.
	ByPass bool
	// ForwardIO and BackwardIO are the two passes' shares of IOPerStep
	// under ByPass (AfterBackward is neither's); ForwardCompute and
	// BackwardCompute one micro-batch's compute of each pass over every
	// layer.
	ForwardIO, BackwardIO           time.Duration
	ForwardCompute, BackwardCompute time.Duration
}

// Known says whether the compute is known, so that MicroBatches is set.
func (c IOCover) Known() bool { return c.MicroBatches > 0 }

// Dominated says that no k hides the step's I/O: what runs after the
// backward pass, with no compute under it, is as large as or larger than
// the I/O the passes' compute can cover.
func (c IOCover) Dominated() bool {
	return c.AfterBackward > 0 && c.AfterBackward >= c.IOPerStep-c.AfterBackward
}

// String is the line `zinf plan` prints: the k needed with the compute and
// the I/O it comes from, or that the I/O is already hidden at k=1, or that
// no k hides it, or that the compute is not known.
func (c IOCover) String() string {
	const what = "micro-batches to hide the I/O: "
	io := FormatDuration(c.IOPerStep)
	switch {
	case c.IOPerStep <= 0:
		return what + "none needed: a step moves nothing over NVMe"
	case !c.Known():
		return fmt.Sprintf("%snot known without the compute per layer (I/O %s per step, the same for any k layer-major)", what, io)
	case c.Dominated():
		return fmt.Sprintf("%sno k hides it: the optimizer step's %s of I/O runs after the backward pass with no compute under it, of %s per step (k >= %d covers the rest; compute %s per micro-batch)",
			what, FormatDuration(c.AfterBackward), io, c.MicroBatches, FormatDuration(c.ComputePerMicroBatch))
	}
	var s string
	if c.ByPass {
		if c.MicroBatches == 1 {
			s = what + "already hidden at k=1"
		} else {
			s = fmt.Sprintf("%sk >= %d", what, c.MicroBatches)
		}
		s += fmt.Sprintf(" (each pass's compute covering its own I/O: forward %s per micro-batch against %s, backward %s against %s; I/O %s per step)",
			FormatDuration(c.ForwardCompute), FormatDuration(c.ForwardIO), FormatDuration(c.BackwardCompute), FormatDuration(c.BackwardIO), io)
		if c.AfterBackward > 0 {
			s += fmt.Sprintf("; the optimizer step's %s after the backward pass stays exposed", FormatDuration(c.AfterBackward))
		}
		return s
	}
	if c.MicroBatches == 1 {
		s = fmt.Sprintf("%salready hidden at k=1 (compute %s per micro-batch, I/O %s per step)", what, FormatDuration(c.ComputePerMicroBatch), io)
	} else {
		s = fmt.Sprintf("%sk >= %d (compute %s per micro-batch, I/O %s per step)", what, c.MicroBatches, FormatDuration(c.ComputePerMicroBatch), io)
	}
	if c.AfterBackward > 0 {
		s += fmt.Sprintf("; the optimizer step's %s after the backward pass stays exposed", FormatDuration(c.AfterBackward))
	}
	return s
}

// MicroBatchesToHideIO is the IOCover of this placement at its compute per
// layer (Hints.ComputeSecondsPerLayer): the micro-batches a layer-major
// step needs for its compute to cover its NVMe I/O. It uses the model the
// step predictions use (the same per-layer fetch, write and optimizer
// times, with the costs of WithCosts); it reads nothing.
func (p *Placement) MicroBatchesToHideIO() IOCover {
	return p.MicroBatchesToHideIOAt(p.Hints.ComputeSecondsPerLayer)
}

// MicroBatchesToHideIOAt is MicroBatchesToHideIO at computeSecondsPerLayer,
// one micro-batch's forward and backward compute of a layer
// (Hints.ComputeSecondsPerLayer's unit; 0 or less: not known), such as a
// runtime measured it.
func (p *Placement) MicroBatchesToHideIOAt(computeSecondsPerLayer float64) IOCover {
	m := p.stepModel()
	var io float64
	for l := 0; l < m.layers; l++ {
		io += 2*m.fetch[l] + m.gradWrite[l]
	}
	io += m.optimizerS
	c := IOCover{IOPerStep: seconds(io)}
	after := 0.0
	if !p.OverlapStep {
		after = m.optimizerS
		c.AfterBackward = seconds(after)
	}
	perMicro := computeSecondsPerLayer * float64(m.layers)
	if !(perMicro > 0) || math.IsInf(perMicro, 1) {
		return c
	}
	c.ComputePerMicroBatch = seconds(perMicro)
	// A ratio a rounding error above a whole number is that number: the
	// per-layer times are sums of quotients.
	k := math.Ceil((io-after)/perMicro - 1e-9)
	c.MicroBatches = int(min(max(k, 1), math.MaxInt32))
	return c
}

// MicroBatchesToHideIOPasses is MicroBatchesToHideIOAt with each pass's
// compute given apart (one micro-batch's compute of a layer in the forward
// and in the backward pass, seconds; such as a loop measured them), and
// each pass's compute made to cover its own I/O: in layer-major order the
// forward pass reads every offloaded parameter once and moves nothing
// else, while the backward pass reads them again, writes the gradients
// and, when the optimizer step overlaps it (OverlapStep), carries the
// step's reads and writes of states, gradients and parameters. The disk's
// idle time under a forward pass cannot take the backward's traffic
// (its gradients do not exist yet), so k is the larger of the two passes'
//
//	k >= ceil(ForwardIO / ForwardCompute), k >= ceil(BackwardIO / BackwardCompute)
//
// which is at least MicroBatchesToHideIOAt's k at the same total compute.
// A pass's compute of 0 or less (or not finite) leaves k unknown.
func (p *Placement) MicroBatchesToHideIOPasses(forwardSecondsPerLayer, backwardSecondsPerLayer float64) IOCover {
	m := p.stepModel()
	var fwd, bwd float64
	for l := 0; l < m.layers; l++ {
		fwd += m.fetch[l]
		bwd += m.fetch[l] + m.gradWrite[l]
	}
	c := IOCover{ByPass: true}
	after := 0.0
	if p.OverlapStep {
		bwd += m.optimizerS
	} else {
		after = m.optimizerS
		c.AfterBackward = seconds(after)
	}
	c.IOPerStep = seconds(fwd + bwd + after)
	c.ForwardIO, c.BackwardIO = seconds(fwd), seconds(bwd)
	f, b := forwardSecondsPerLayer*float64(m.layers), backwardSecondsPerLayer*float64(m.layers)
	ok := func(x float64) bool { return x > 0 && !math.IsInf(x, 1) }
	if !ok(f) || !ok(b) {
		return c
	}
	c.ForwardCompute, c.BackwardCompute = seconds(f), seconds(b)
	c.ComputePerMicroBatch = seconds(f + b)
	kf := math.Ceil(fwd/f - 1e-9)
	kb := math.Ceil(bwd/b - 1e-9)
	c.MicroBatches = int(min(max(kf, kb, 1), math.MaxInt32))
	return c
}
