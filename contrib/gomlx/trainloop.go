package zgomlx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/policy"
)

// Loop drives a Trainer over a GoMLX train.Dataset as GoMLX's train.Loop
// drives a train.Trainer: OnStart, OnStep and OnEnd hooks by priority, a
// global step (LoopStep), the loss and its moving average, and hooks for
// a progress line per step, periodic evaluation and checkpoints. GoMLX's
// own train.Loop cannot drive zinf: train.NewLoop takes the concrete
// *train.Trainer, whose TrainStep runs the whole model in one graph with
// every variable in memory; so Loop mirrors its API instead.
type Loop struct {
	Trainer *Trainer
	// LoopStep is the global step: the steps trained so far (set it to a
	// loaded checkpoint's step to resume). StartStep and EndStep bound
	// the current RunSteps call.
	LoopStep, StartStep, EndStep int
	// Loss is the last step's loss; MovingAverageLoss its exponential
	// moving average (weight 0.1 for the newest step).
	Loss, MovingAverageLoss float32
	// MicroBatches, when > 0, is the micro-batches of every step
	// RunSteps runs: the caller's k. 0 (the default) takes the
	// runtime's: gradient_accumulation_steps, a number, stays as given;
	// under "auto" the loop starts at the plan's k
	// (zinf.Runtime.MicroBatches) and, once AutoMeasureSteps steps have
	// run, takes the k whose compute covers a layer-major step's NVMe
	// I/O at the compute per layer the runtime measured in the last of
	// them (zinf.Runtime.MicroBatchesToHideIO), said once at Info level on
	// the runtime's logger. MicroBatchesPerStep says which k runs.
	MicroBatches int

	onStart []loopHook[func(*Loop, train.Dataset) error]
	onStep  []loopHook[func(*Loop, float32) error]
	onEnd   []loopHook[func(*Loop, float32) error]
	times   []time.Duration
	auto    autoMicroBatches
}

// AutoMeasureSteps is how many steps a Loop under
// gradient_accumulation_steps "auto" runs at the plan's k before it takes
// the k that hides the I/O: the compute is measured over the last of
// them, as the first also compiles the graphs.
const AutoMeasureSteps = 2

// autoMicroBatches is a Loop's choice of k under "auto": the steps
// measured so far, the runtime's compute counters after the one before
// the last, and the k taken (0: none yet).
type autoMicroBatches struct {
	steps   int
	compute time.Duration
	units   int64
	k       int
	// fwd and bwd are the Trainer's layer-major compute by pass
	// (Timings.ForwardCompute, BackwardCompute) after the step before
	// the last.
	fwd, bwd time.Duration
}

// MicroBatchesPerStep is the micro-batches the next step of RunSteps
// takes: MicroBatches when set, else the k chosen under "auto" once
// measured, else the runtime's (zinf.Runtime.MicroBatches).
func (l *Loop) MicroBatchesPerStep() int {
	switch {
	case l.MicroBatches > 0:
		return l.MicroBatches
	case l.auto.k > 0:
		return l.auto.k
	}
	return l.Trainer.off.rt.MicroBatches()
}

// measureAuto counts a step of k micro-batches under
// gradient_accumulation_steps "auto" and, once AutoMeasureSteps have run,
// takes the k that hides the I/O at the compute measured over the last
// one. A layer-major step's compute is the Trainer's own executors',
// timed by pass: each pass's compute per layer and micro-batch must
// cover that pass's I/O (zinf.Runtime.MicroBatchesToHideIOPasses; the
// backward pass carries the gradients and the optimizer step). Else it
// is the runtime's measure of its layer visits
// (zinf.Runtime.MicroBatchesToHideIO), which also counts the loop's work
// while a layer is begun.
func (l *Loop) measureAuto(k int) {
	rt := l.Trainer.off.rt
	if l.MicroBatches > 0 || l.auto.k > 0 || !rt.Config.GradientAccumulationAuto {
		return
	}
	l.auto.steps++
	m := rt.Metrics()
	tm := l.Trainer.Timings()
	if l.auto.steps < AutoMeasureSteps {
		l.auto.compute, l.auto.units = m.Compute, m.ComputeUnits
		l.auto.fwd, l.auto.bwd = tm.ForwardCompute, tm.BackwardCompute
		return
	}
	var c policy.IOCover
	if fwd, bwd, n := tm.ForwardCompute-l.auto.fwd, tm.BackwardCompute-l.auto.bwd, k*rt.Layers(); fwd > 0 && bwd > 0 && n > 0 {
		c = rt.MicroBatchesToHideIOPasses(fwd/time.Duration(n), bwd/time.Duration(n))
	} else if units := m.ComputeUnits - l.auto.units; units > 0 {
		c = rt.MicroBatchesToHideIO((m.Compute - l.auto.compute) / time.Duration(units))
	}
	if !c.Known() {
		return // no compute measured: try again after the next step
	}
	l.auto.k = c.MicroBatches
	l.Trainer.off.log.Info("zgomlx: gradient_accumulation_steps \"auto\": "+c.String(),
		"micro_batches", c.MicroBatches, "after_step", l.LoopStep)
}

type loopHook[F any] struct {
	name     string
	priority train.Priority
	fn       F
}

// NewLoop returns a Loop over tr at global step 0.
func NewLoop(tr *Trainer) *Loop { return &Loop{Trainer: tr} }

func addHook[F any](hs []loopHook[F], name string, p train.Priority, fn F) []loopHook[F] {
	hs = append(hs, loopHook[F]{name, p, fn})
	slices.SortStableFunc(hs, func(a, b loopHook[F]) int { return int(a.priority) - int(b.priority) })
	return hs
}

// OnStart adds a hook run before the first step of each RunSteps.
func (l *Loop) OnStart(name string, p train.Priority, fn func(*Loop, train.Dataset) error) {
	l.onStart = addHook(l.onStart, name, p, fn)
}

// OnStep adds a hook run after each step with its loss; lower
// priorities run first, as in train.Loop.
func (l *Loop) OnStep(name string, p train.Priority, fn func(*Loop, float32) error) {
	l.onStep = addHook(l.onStep, name, p, fn)
}

// OnEnd adds a hook run after the last step of each RunSteps.
func (l *Loop) OnEnd(name string, p train.Priority, fn func(*Loop, float32) error) {
	l.onEnd = addHook(l.onEnd, name, p, fn)
}

// RunSteps trains steps steps on the batches of ds (starting ds again
// when it ends): each batch's Inputs go to the first layer, its Labels to
// the loss, and both are finalized after the step (the Batch's ownership
// rules). With k > 1 micro-batches a step (Loop.MicroBatches,
// gradient_accumulation_steps, or the planner's k under "auto") a step
// takes k consecutive batches as its micro-batches
// (Trainer.StepMicroBatches, in the plan's order: layer-major or
// micro-batch-major) and its loss is their mean. It returns the last loss. A hook's error ends the run,
// naming the hook.
func (l *Loop) RunSteps(ctx context.Context, ds train.Dataset, steps int) (float32, error) {
	if l.Trainer == nil || ds == nil {
		return 0, errors.New("zgomlx: Loop.RunSteps needs a Trainer and a Dataset")
	}
	if steps <= 0 {
		return 0, fmt.Errorf("zgomlx: Loop.RunSteps: steps %d (allowed: > 0)", steps)
	}
	l.StartStep, l.EndStep = l.LoopStep, l.LoopStep+steps
	for _, h := range l.onStart {
		if err := h.fn(l, ds); err != nil {
			return 0, fmt.Errorf("zgomlx: OnStart hook %q: %w", h.name, err)
		}
	}
	var held []train.Batch // the micro-batches of the step being gathered
	defer func() {
		for _, b := range held {
			_ = b.Finalize()
		}
	}()
	for done := 0; done < steps; {
		n := 0
		for b, err := range ds.Iter() {
			if err != nil {
				return l.Loss, fmt.Errorf("zgomlx: dataset %q: %w", ds.Name(), err)
			}
			n++
			held = append(held, b)
			if len(held) < l.MicroBatchesPerStep() {
				continue
			}
			t0 := time.Now()
			loss, err := l.step(ctx, held)
			for _, b := range held {
				_ = b.Finalize()
			}
			k := len(held)
			held = held[:0]
			if err != nil {
				return l.Loss, fmt.Errorf("zgomlx: step %d: %w", l.LoopStep+1, err)
			}
			l.times = append(l.times, time.Since(t0))
			l.LoopStep++
			l.measureAuto(k)
			done++
			l.Loss = loss
			if l.LoopStep == l.StartStep+1 && l.MovingAverageLoss == 0 {
				l.MovingAverageLoss = loss
			} else {
				l.MovingAverageLoss = 0.9*l.MovingAverageLoss + 0.1*loss
			}
			for _, h := range l.onStep {
				if err := h.fn(l, loss); err != nil {
					return loss, fmt.Errorf("zgomlx: OnStep hook %q at step %d: %w", h.name, l.LoopStep, err)
				}
			}
			if done == steps {
				break
			}
		}
		if n == 0 {
			return l.Loss, fmt.Errorf("zgomlx: dataset %q yielded no batch", ds.Name())
		}
	}
	for _, h := range l.onEnd {
		if err := h.fn(l, l.Loss); err != nil {
			return l.Loss, fmt.Errorf("zgomlx: OnEnd hook %q: %w", h.name, err)
		}
	}
	return l.Loss, nil
}

// step trains one step on batches: one (StepN), or the step's
// micro-batches (StepMicroBatches, the mean of their losses).
func (l *Loop) step(ctx context.Context, batches []train.Batch) (float32, error) {
	if len(batches) == 1 {
		return l.Trainer.StepN(ctx, batches[0].Inputs, batches[0].Labels)
	}
	mbs := make([]MicroBatch, len(batches))
	for i, b := range batches {
		mbs[i] = MicroBatch{Inputs: b.Inputs, Labels: b.Labels}
	}
	losses, err := l.Trainer.StepMicroBatches(ctx, mbs)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, x := range losses {
		sum += float64(x)
	}
	return float32(sum / float64(len(losses))), nil
}

// MedianStepDuration is the median of the steps' wall times so far.
func (l *Loop) MedianStepDuration() time.Duration {
	if len(l.times) == 0 {
		return 0
	}
	s := slices.Clone(l.times)
	slices.Sort(s)
	return s[len(s)/2]
}

// Progress prints a line per step to w: the global step, the loss, its
// moving average and the step's wall time.
func (l *Loop) Progress(w io.Writer) {
	l.OnStep("progress", 100, func(l *Loop, loss float32) error {
		_, err := fmt.Fprintf(w, "step %d/%d  loss %.4f  avg %.4f  %.0f ms\n", l.LoopStep, l.EndStep, loss, l.MovingAverageLoss, float64(l.times[len(l.times)-1])/1e6)
		return err
	})
}

// EvalEvery evaluates the mean loss over every batch of ds (EvalLoss:
// the weights streamed from zinf, nothing changed) after every n-th step
// and after the last, and hands it to fn.
func (l *Loop) EvalEvery(ctx context.Context, n int, ds train.Dataset, fn func(l *Loop, loss float32) error) {
	eval := func(l *Loop) error {
		loss, err := l.Trainer.Eval(ctx, ds)
		if err != nil {
			return err
		}
		return fn(l, loss)
	}
	l.OnStep("eval", 200, func(l *Loop, _ float32) error {
		if n > 0 && l.LoopStep%n == 0 && l.LoopStep != l.EndStep {
			return eval(l)
		}
		return nil
	})
	l.OnEnd("eval", 200, func(l *Loop, _ float32) error { return eval(l) })
}

// CheckpointEvery saves a zinf checkpoint of the model and its optimizer
// states (Offload.SaveCheckpoint, at the global step) in dir after every
// n-th step and after the last.
func (l *Loop) CheckpointEvery(ctx context.Context, n int, dir string) {
	save := func(l *Loop) error {
		_, err := l.Trainer.Offload().SaveCheckpoint(ctx, dir, int64(l.LoopStep), checkpoint.SaveOptions{Overwrite: true})
		return err
	}
	l.OnStep("checkpoint", 300, func(l *Loop, _ float32) error {
		if n > 0 && l.LoopStep%n == 0 && l.LoopStep != l.EndStep {
			return save(l)
		}
		return nil
	})
	l.OnEnd("checkpoint", 300, func(l *Loop, _ float32) error { return save(l) })
}

// Eval is the mean loss over every batch of ds (EvalLoss per batch: the
// weights streamed from zinf, nothing changed); the batches are
// finalized.
func (t *Trainer) Eval(ctx context.Context, ds train.Dataset) (float32, error) {
	var sum float64
	n := 0
	for b, err := range ds.Iter() {
		if err != nil {
			return 0, fmt.Errorf("zgomlx: dataset %q: %w", ds.Name(), err)
		}
		loss, err := t.evalN(ctx, b.Inputs, b.Labels)
		_ = b.Finalize()
		if err != nil {
			return 0, err
		}
		sum += float64(loss)
		n++
	}
	if n == 0 {
		return float32(math.NaN()), fmt.Errorf("zgomlx: dataset %q yielded no batch", ds.Name())
	}
	return float32(sum / float64(n)), nil
}

// StepN is Step for a Net whose first layer takes several inputs, or
// whose loss several label tensors.
func (t *Trainer) StepN(ctx context.Context, xs, labels []*tensors.Tensor) (float32, error) {
	if t.pending {
		return 0, ErrCommitPending
	}
	loss, err := t.lp.run(ctx, xs, labels, true, modeTrain)
	if err != nil {
		return loss, t.updateFailed(err)
	}
	return loss, t.Commit(ctx)
}

func (t *Trainer) evalN(ctx context.Context, xs, labels []*tensors.Tensor) (float32, error) {
	if t.pending {
		return 0, ErrCommitPending
	}
	loss, err := t.lp.run(ctx, xs, labels, false, modeLoss)
	return loss, t.updateFailed(err)
}
