package zinf

import (
	"context"
	"time"

	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
)

// Schedule returns the order the plan chose for a step's micro-batches:
// LayerMajor or MicroBatchMajor (zinf.schedule, or the planner's pick
// under "auto"; see Placement().Schedule). Both give the same results bit for
// bit; a loop may run either whatever the plan says, and the plan's order
// is the one its pinned memory and predicted step are sized for.
func (r *Runtime) Schedule() Schedule { return Schedule(r.placement.Schedule) }

// MicroBatches returns the micro-batches of a step:
// gradient_accumulation_steps, or under "auto" the plan's (Placement().
// MicroBatches: the k that hides the I/O at Options.ComputePerLayer, or
// plan.AutoMicroBatchesUnmeasured when that is not given; a loop takes
// MicroBatchesToHideIO once it has measured its compute).
func (r *Runtime) MicroBatches() int {
	if r.Config.GradientAccumulationAuto {
		return max(r.placement.MicroBatches, 1)
	}
	return max(r.Config.GradientAccumulationSteps, 1)
}

// MicroBatchesToHideIO says how many micro-batches a layer-major step of
// this runtime needs for its compute to cover its NVMe traffic
// (policy.Placement.MicroBatchesToHideIO, with the CPU costs measured so
// far: MeasuredCosts), at computePerLayer, the compute per layer, pass and
// micro-batch (MeasuredComputePerLayer's unit); 0 takes
// MeasuredComputePerLayer, else Options.ComputePerLayer. Its MicroBatches
// is 0 while the compute is not known. Under gradient_accumulation_steps
// "auto" a loop runs that many micro-batches a step (zgomlx.Loop does);
// a number in the config is the user's k, whatever this says.
func (r *Runtime) MicroBatchesToHideIO(computePerLayer time.Duration) policy.IOCover {
	p := r.placement.WithCosts(r.MeasuredCosts())
	if computePerLayer <= 0 {
		computePerLayer = r.MeasuredComputePerLayer()
	}
	if computePerLayer <= 0 {
		return p.MicroBatchesToHideIO()
	}
	// The plan's compute per layer is a micro-batch's forward and
	// backward: two passes.
	return p.MicroBatchesToHideIOAt(2 * computePerLayer.Seconds())
}

// MicroBatchesToHideIOPasses is MicroBatchesToHideIO from each pass's
// compute apart (one micro-batch's forward, and backward, compute of a
// layer, such as a loop that times its own passes measured them), each
// pass's compute made to cover its own I/O
// (policy.Placement.MicroBatchesToHideIOPasses): the backward pass
// carries the gradients' writes and the overlapped optimizer step, the
// forward pass only the parameters' reads, so this k is at least the
// one the two passes' sum gives. A pass's compute of 0 or less leaves k
// unknown.
func (r *Runtime) MicroBatchesToHideIOPasses(forward, backward time.Duration) policy.IOCover {
	return r.placement.WithCosts(r.MeasuredCosts()).MicroBatchesToHideIOPasses(forward.Seconds(), backward.Seconds())
}

// beginVisit starts measuring layer l's visit, unless the visit of a
// layer still begun is being measured (a backward pass that begins the
// next layer while this one's last micro-batch computes): visits that
// overlap are measured one at a time, so no compute counts twice.
func (r *Runtime) beginVisit(l, k int) {
	if v := r.visit; !v.start.IsZero() && v.layer != l && r.begun[v.layer] {
		return
	}
	r.mu.Lock()
	w := r.ioWaitNs
	r.mu.Unlock()
	r.visit = layerVisit{layer: l, k: k, start: time.Now(), wait0: w}
}

// endVisit adds layer l's visit to the measured compute: its time less
// the runtime's waits meanwhile.
func (r *Runtime) endVisit(l int) {
	v := r.visit
	if v.start.IsZero() || v.layer != l {
		return
	}
	r.visit = layerVisit{}
	d := int64(time.Since(v.start))
	r.mu.Lock()
	d -= r.ioWaitNs - v.wait0
	if d > 0 {
		r.computeNs += d
		r.computeUnits += int64(v.k)
	}
	r.mu.Unlock()
}

// MeasuredComputePerLayer is the loop's compute per layer, pass and
// micro-batch measured so far (Options.ComputePerLayer's unit): the time
// between each BeginLayer and its EndLayer, less the runtime's waits
// meanwhile, over the layer visits times their micro-batches. 0 before
// the first visit ends. PlanModel with it (Options.ComputePerLayer)
// predicts the step from the loop's own compute.
func (r *Runtime) MeasuredComputePerLayer() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.computeUnits == 0 {
		return 0
	}
	return time.Duration(r.computeNs / r.computeUnits)
}

// MeasuredCosts are the CPU costs on the I/O path this runtime measured
// so far, as rates the planner adds to its prediction
// (policy.Placement.WithCosts): the stores' CRC-32C time over the bytes
// it covered (zinf.checksums; 0 with checksums off), the gradient
// hand-offs' copies and additions over their bytes, and the optimizer's
// arithmetic per committed step. A figure not measured yet is 0 (not
// modelled). With MeasuredComputePerLayer it predicts the step from what
// this machine did, not only from the disk's bandwidth.
func (r *Runtime) MeasuredCosts() policy.Costs {
	var c policy.Costs
	var sumNs, sumBytes int64
	for _, s := range []*swapper.Store{r.ParamStore, r.GradStore, r.OptimStore} {
		if s != nil {
			st := s.Stats()
			sumNs += int64(st.ChecksumTime)
			sumBytes += st.ChecksumBytes
		}
	}
	if sumNs > 0 && sumBytes > 0 {
		c.ChecksumBytesPerSec = float64(sumBytes) / time.Duration(sumNs).Seconds()
	}
	if r.grads != nil {
		if g := r.grads.Stats(); g.HandOffTime > 0 && g.HandOffBytes > 0 {
			c.HandOffBytesPerSec = float64(g.HandOffBytes) / g.HandOffTime.Seconds()
		}
	}
	if r.Optimizer != nil {
		if o := r.Optimizer.Stats(); o.Steps > 0 {
			c.OptimizerComputeSeconds = o.Total.Compute.Seconds() / float64(o.Steps)
		}
	}
	return c
}

// accumulate adds a gradient partition: held in pinned memory when it is
// not the last of a layer-major visit's k hand-offs of the tensor,
// written behind otherwise.
func (r *Runtime) accumulate(ctx context.Context, name string, part []float32) error {
	h := r.held[r.model.Layer[name]]
	if h == nil {
		return r.grads.Accumulate(ctx, name, part)
	}
	var err error
	if c := h.count[name]; c+1 < h.k {
		err = r.grads.AccumulateHold(ctx, name, part)
	} else {
		err = r.grads.Accumulate(ctx, name, part)
	}
	if err == nil {
		h.count[name]++
	}
	return err
}

// accumulatePair is accumulate of a, then of b, in one pass
// (grad.Swapper.AccumulatePair): held unless b is the layer's k-th.
func (r *Runtime) accumulatePair(ctx context.Context, name string, a, b []float32) error {
	h := r.held[r.model.Layer[name]]
	if h == nil {
		return r.grads.AccumulatePair(ctx, name, a, b)
	}
	var err error
	if c := h.count[name]; c+2 < h.k {
		err = r.grads.AccumulatePairHold(ctx, name, a, b)
	} else {
		err = r.grads.AccumulatePair(ctx, name, a, b)
	}
	if err == nil {
		h.count[name] += 2
	}
	return err
}

// endHeld ends layer l's layer-major visit: a gradient handed fewer than
// k times is written behind now (a failure of it is reported by Step's
// flush, which writes it again).
func (r *Runtime) endHeld(l int) {
	h := r.held[l]
	if h == nil {
		return
	}
	delete(r.held, l)
	for name, c := range h.count {
		if c < h.k {
			_ = r.grads.WriteBehind(r.bgCtx, name)
		}
	}
}
