package zinf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/schedule"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// speculationWindow and speculationMaxWrong are the rule of
// zinf.speculate "auto": speculate unless more than speculationMaxWrong
// of the last speculationWindow checked steps needed a correction.
const (
	speculationWindow   = 8
	speculationMaxWrong = speculationWindow / 2
)

// setupTraining reads the config's schedule, loss scaling and clipping
// and checks that a world of several ranks can reduce what they need.
func (r *Runtime) setupTraining(s *plan.Settings, opts Options) error {
	t := &r.train
	var err error
	if t.sched, err = schedule.FromConfig(r.Config, opts.TotalSteps); err != nil {
		return fmt.Errorf("zinf: %w", err)
	}
	if t.scaler, err = schedule.NewLossScaler(s.Scaler); err != nil {
		return fmt.Errorf("zinf: %w", err)
	}
	r.trainStats.LossScale = t.scaler.Scale()
	t.clip = s.Clip
	t.checks = !opts.Inference && (t.clip > 0 || t.scaler.Enabled())
	t.mode = s.Speculate
	if c := opts.Comm; c != nil {
		if c.Size() != r.World || c.Rank() != r.Rank {
			return fmt.Errorf("zinf: Options.Comm is rank %d of %d ranks; this runtime is rank %d of %d", c.Rank(), c.Size(), r.Rank, r.World)
		}
		t.comm = c
	}
	if t.checks && r.World > 1 && t.comm == nil {
		var why []string
		if t.clip > 0 {
			why = append(why, fmt.Sprintf("gradient_clipping %v needs the global gradient norm", t.clip))
		}
		if t.scaler.Enabled() {
			why = append(why, "fp16 loss scaling needs the overflow check of every rank")
		}
		return fmt.Errorf("zinf: %s at world size %d: set zinf.Options.Comm to this rank's comm.Comm (comm.NewLocal for ranks in one process)",
			joinAnd(why), r.World)
	}
	return nil
}

func joinAnd(s []string) string {
	switch len(s) {
	case 0:
		return ""
	case 1:
		return s[0]
	}
	out := s[0]
	for _, x := range s[1 : len(s)-1] {
		out += ", " + x
	}
	return out + " and " + s[len(s)-1]
}

// SetLR fixes the learning rate of the steps from now on, replacing the
// config's scheduler: for a training loop that computes its own schedule.
// It applies to the step the next Step completes (a step already begun by
// StepTensor is redone at the new rate if it differs). lr must be a finite
// number >= 0.
func (r *Runtime) SetLR(lr float64) error {
	if err := r.closedErr("SetLR", nil); err != nil {
		return err
	}
	if !(lr >= 0) || math.IsInf(lr, 0) {
		return fmt.Errorf("zinf: SetLR(%v): the learning rate must be a finite number >= 0", lr)
	}
	r.train.lr = &lr
	return nil
}

// LR returns the learning rate the next optimizer step will use: the
// scheduler's (by the number of applied steps) or SetLR's.
func (r *Runtime) LR() float64 { return r.values().LR }

// LossScale returns the scale the loop multiplies its loss by before the
// backward pass of the current step: the fp16 loss scale, 1 without fp16.
// The gradients handed to AccumulateGrad carry it; Step divides it out.
func (r *Runtime) LossScale() float64 {
	if r.train.scaler == nil {
		return 1
	}
	return r.train.scaler.Scale()
}

// LastStep describes the last step Step completed (zero before the
// first).
func (r *Runtime) LastStep() StepInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// values are the schedule's values for the next applied step.
func (r *Runtime) values() schedule.Values {
	if r.train.lr != nil {
		return schedule.Values{LR: *r.train.lr}
	}
	if r.train.sched == nil || r.Optimizer == nil {
		return schedule.Values{}
	}
	return r.train.sched.At(r.stepNumber() + 1)
}

// stepParams are the optimizer parameters of the next step with gradient
// factor f (scaling only when f != 1).
func (r *Runtime) stepParams(f float32) (optimizer.StepParams, schedule.Values) {
	v := r.values()
	p := optimizer.StepParams{LR: float32(v.LR), LR64: v.LR, ScaleGrads: f != 1, GradScale: f}
	if !p.ScaleGrads {
		p.GradScale = 0
	}
	if v.Betas {
		p.Beta1, p.Beta2 = float32(v.Beta1), float32(v.Beta2)
	}
	return p, v
}

// speculate reports whether StepTensor starts the update now.
func (r *Runtime) speculate() bool {
	t := &r.train
	if !t.checks {
		return true
	}
	switch t.mode {
	case config.SpeculateAlways:
		return true
	case config.SpeculateNever:
		return false
	}
	wrong := 0
	for _, w := range t.history {
		if w {
			wrong++
		}
	}
	return wrong <= speculationMaxWrong
}

// beginStep opens the step transaction StepTensor hands tensors to,
// speculating that the step needs neither clipping nor skipping.
func (r *Runtime) beginStep(ctx context.Context) (*optimizer.StepTxn, error) {
	f := float32(1)
	if r.train.checks {
		f = float32(1 / r.LossScale())
	}
	p, _ := r.stepParams(f)
	txn, err := r.Optimizer.BeginStepWith(ctx, p)
	if err != nil {
		return nil, err
	}
	r.train.txnCheck = r.train.checks
	return txn, nil
}

// check computes the step's global sum of squares — this rank's tensors'
// in Model.Tensors order, then over the ranks in rank order — and what it
// decides. local is this rank's failure before the reduction (a gradient
// write-behind): the rank still takes part, so that every rank learns of
// it and returns an error, leaving the world in step for a retry. A check
// that was reduced is kept until its step completes, so a rank whose
// commit failed retries without another collective.
func (r *Runtime) check(ctx context.Context, local error) (*stepCheck, error) {
	t := &r.train
	if t.pending != nil {
		if local != nil {
			return nil, local
		}
		return t.pending, nil
	}
	var sum float64
	if local == nil {
		for _, d := range r.model.Descs {
			s, err := r.grads.SumSquaresContext(ctx, d.Name)
			if err != nil {
				local = err
				break
			}
			sum += s
		}
	}
	if r.World > 1 {
		buf := make([]float64, 1+r.World)
		buf[0] = sum
		if local != nil {
			buf[1+r.Rank] = 1
		}
		// Through the runtime's collective goroutine: after the
		// collectives it queued, in one order on every rank.
		if err := r.Collective(ctx, func(c comm.Comm) error { return c.AllReduceFloat64(ctx, buf, comm.Sum) }); err != nil {
			if local != nil {
				return nil, errors.Join(local, err)
			}
			return nil, fmt.Errorf("zinf: step: reducing the gradient norm and overflow over the ranks: %w", err)
		}
		if local != nil {
			return nil, local
		}
		var failed []int
		for q := range r.World {
			if buf[1+q] != 0 {
				failed = append(failed, q)
			}
		}
		if len(failed) > 0 {
			return nil, fmt.Errorf("zinf: step: rank %v failed before the gradient norm was known: nothing changed on any rank; call Step again on every rank: %w", failed, ErrRankFailed)
		}
		sum = buf[0]
	} else if local != nil {
		return nil, local
	}
	c := &stepCheck{sumSq: sum, scale: r.LossScale()}
	c.overflow = t.scaler.Enabled() && (math.IsInf(sum, 0) || math.IsNaN(sum))
	c.factor, c.norm, c.coef = optimizer.GradFactor(sum, c.scale, t.clip)
	if !t.scaler.Enabled() && (math.IsInf(sum, 0) || math.IsNaN(sum)) {
		r.log.Warn("zinf: the gradient norm is not finite (inf or NaN gradients, without fp16 overflow skipping); the step applies it as DeepSpeed does",
			"norm", c.norm, "step", r.Optimizer.StepCount()+1)
	}
	t.pending = c
	return c, nil
}

// ErrRankFailed is wrapped by the error Step returns on the ranks whose
// own part went well when another rank's step failed before the global
// gradient norm and overflow were known: nothing changed on any rank, and
// every rank calls Step again.
var ErrRankFailed = errors.New("zinf: another rank's step failed")

// Step runs the optimizer step: it waits for every gradient write-behind,
// then — with gradient_clipping or fp16 on — reduces the sum of squares of
// every rank's gradients (through Options.Comm at world size > 1) and
// decides the step: with fp16 it is skipped when any gradient is inf or
// NaN (the gradients are dropped, the loss scale lowered, nothing else
// changes), else every gradient is multiplied by optimizer.GradFactor
// (unscaling and clipping in one factor) and the update runs with the
// scheduled learning rate. A step that StepTensor started during the
// backward pass assumed no clipping and no overflow: if that was right it
// is committed, else it is rolled back (nothing of it was committed) and
// the right step taken. On success the gradients are cleared, the loss
// scaler and schedule advance.
//
// It is all or nothing: on error (a full disk, an I/O error, a checksum
// mismatch, another rank's failure) nothing changed — params, states,
// accumulated gradients, loss scale, schedule — and Step may be called
// again (on every rank: a rank that failed before the reduction makes
// every rank fail with ErrRankFailed; one that failed after it retries
// alone, without another collective). The standard order is followed:
// unscale, check overflow, clip, update.
func (r *Runtime) Step(ctx context.Context) error {
	if err := r.closedErr("step", optimizer.ErrClosed); err != nil {
		return err
	}
	t0 := time.Now()
	err := r.step(ctx)
	if r.bg == nil {
		r.trace.optimizerDone(r.Optimizer)
	}
	r.trace.stepDone(t0, err)
	return err
}

func (r *Runtime) step(ctx context.Context) error {
	if r.inference {
		return errInference
	}
	// A step still updating in the background finishes first; one that
	// failed is retried now, from the gradients it kept.
	if err := r.settle(ctx); err != nil && !errors.Is(err, ErrUpdateFailed) {
		return err
	}
	r.bgErr = nil
	t0 := time.Now()
	r.mu.Lock()
	for _, d := range r.model.Descs {
		if !r.inited[d.Name] {
			r.mu.Unlock()
			return fmt.Errorf("zinf: step: tensor %q has no initial values (call Init)", d.Name)
		}
	}
	r.mu.Unlock()
	// The parameters are about to change: no gather ahead may read them
	// half way, and the step's own collectives follow the queued ones.
	r.drainComm()
	txn := r.txn
	r.txn = nil
	abort := func() {
		if txn != nil {
			txn.Abort()
			txn = nil
		}
	}
	tr := &r.train
	flushErr := r.grads.Flush(ctx)
	if flushErr != nil {
		flushErr = fmt.Errorf("zinf: gradient write-behind: %w", flushErr)
	}
	info := StepInfo{LossScale: r.LossScale(), GradNorm: math.NaN(), ClipCoef: 1}
	var chk *stepCheck
	f := float32(1)
	if tr.checks {
		var err error
		if chk, err = r.check(ctx, flushErr); err != nil {
			abort()
			return err
		}
		f = chk.factor
		info.GradNorm = chk.norm
		if !chk.overflow {
			info.ClipCoef, info.Clipped = chk.coef, chk.coef != 1
		}
	} else if flushErr != nil {
		abort()
		return flushErr
	}
	p, v := r.stepParams(f)
	info.LR = v.LR
	if v.Betas {
		info.Beta1, info.Beta2 = v.Beta1, v.Beta2
	}
	info.Speculated = txn != nil && tr.txnCheck
	var err error
	switch {
	case chk != nil && chk.overflow:
		// Check the scaler first: at min_loss_scale it refuses, and then
		// nothing may change.
		if err := tr.scaler.Check(true); err != nil {
			abort()
			return fmt.Errorf("zinf: step %d: %w", r.Optimizer.StepCount()+1, err)
		}
		if txn != nil {
			start := time.Now()
			abort()
			info.RolledBack, info.RollbackTime = true, time.Since(start)
			r.trace.rollback(start, info.RollbackTime)
		}
	case txn != nil && txn.Params() == p:
		if r.overlapUpdate {
			err = r.commitBackground(txn)
		} else {
			err = txn.Commit(ctx)
		}
	default:
		if txn != nil {
			start := time.Now()
			abort()
			info.RolledBack, info.RollbackTime = true, time.Since(start)
			r.trace.rollback(start, info.RollbackTime)
		}
		if r.overlapUpdate {
			var t *optimizer.StepTxn
			if t, err = r.Optimizer.BeginStepWith(ctx, p); err == nil {
				if err = r.commitBackground(t); err != nil {
					t.Abort()
				}
			}
		} else {
			err = r.Optimizer.StepWith(ctx, p)
		}
	}
	if err != nil {
		r.noteRollback(info)
		return err
	}
	// The step is done (applied, or skipped) — or, with its update going
	// on in the background, decided: move the loss scale and the schedule
	// on. The gradients are forgotten once the update has read them (at
	// once, or when the background step is reaped).
	info.Overlapped = r.bg != nil
	if r.bg == nil {
		r.grads.Zero()
		tr.pending = nil
	}
	info.Applied = chk == nil || !chk.overflow
	if chk != nil {
		_ = tr.scaler.Update(chk.overflow) // checked above
		needed := chk.overflow || chk.factor != float32(1/chk.scale)
		tr.history = append(tr.history, needed)
		if len(tr.history) > speculationWindow {
			tr.history = slices.Delete(tr.history, 0, len(tr.history)-speculationWindow)
		}
	}
	info.NextLossScale = r.LossScale()
	info.Step = r.stepNumber()
	if !info.Applied {
		info.Step++
	}
	r.mu.Lock()
	r.stepCount++
	r.stepWaitNs += int64(time.Since(t0))
	r.last = info
	s := &r.trainStats
	s.LossScale = info.NextLossScale
	if info.Applied {
		s.Applied++
		if info.Clipped {
			s.Clipped++
		}
	} else {
		s.Skipped++
	}
	if info.Speculated {
		s.Speculated++
		if info.RolledBack {
			s.Rollbacks++
			s.RollbackTime += info.RollbackTime
		} else {
			s.Commits++
		}
	}
	r.mu.Unlock()
	return nil
}

// noteRollback counts a rollback of a step that then failed (its retry
// runs without speculation, so it is counted once).
func (r *Runtime) noteRollback(info StepInfo) {
	if !info.RolledBack {
		return
	}
	r.mu.Lock()
	r.trainStats.Speculated++
	r.trainStats.Rollbacks++
	r.trainStats.RollbackTime += info.RollbackTime
	r.mu.Unlock()
}

// AccumulateGrad adds a micro-step's gradient of a parameter (the full
// tensor, already reduced over ranks; this rank keeps its partition). It
// is written behind: the call returns once the values are copied. A
// failed call adds nothing and may be retried. (A gradient kept in pieces,
// see Options.PieceBytes, may fail after some pieces were added: its
// retry — the same call, with the same values — adds only the others.
// Retry the call, or give the step up with AbortStep, before handing the
// tensor another gradient.)
func (r *Runtime) AccumulateGrad(ctx context.Context, name string, g []float32) error {
	return r.handOver(ctx, name, g, nil)
}

// AccumulateGradPair is AccumulateGrad of a, then of b (two micro-steps'
// gradients of one parameter, in that order), with the sum in pinned
// memory read and written once instead of twice: the same bits. A
// layer-major loop hands a layer's micro-batches over two at a time this
// way. A failed call adds neither and may be retried, as AccumulateGrad.
func (r *Runtime) AccumulateGradPair(ctx context.Context, name string, a, b []float32) error {
	if b == nil {
		b = []float32{} // a pair: its length is checked
	}
	return r.handOver(ctx, name, a, b)
}

// handOver is AccumulateGrad of g (b nil) and AccumulateGradPair of g
// and b.
func (r *Runtime) handOver(ctx context.Context, name string, g, b []float32) error {
	if err := r.closedErr("accumulate "+strconv.Quote(name), grad.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if r.inference {
		return errInference
	}
	lo, hi, err := r.fullRange("accumulate", name, len(g))
	if err != nil {
		return err
	}
	t0 := time.Now()
	if b == nil {
		err = r.accumulate(ctx, name, g[lo:hi])
	} else if _, _, err = r.fullRange("accumulate", name, len(b)); err == nil {
		err = r.accumulatePair(ctx, name, g[lo:hi], b[lo:hi])
	}
	if err == nil {
		r.train.pending = nil // the gradients changed: a step retried after this checks them again
	}
	r.mu.Lock()
	r.ioWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	r.trace.gradWait(name, t0, err)
	return err
}

// StepTensor hands a parameter whose gradient is final (its last
// micro-step's AccumulateGrad is done) to the optimizer now, so its update
// runs in the background while the loop computes the rest of the backward
// pass — when the plan found room for both working sets (Placement().OverlapStep);
// otherwise the update waits for Step. Results are identical to a plain
// Step: Adam works per element, and nothing is visible before the commit.
// An error here is also returned by Step, which discards the step.
func (r *Runtime) StepTensor(ctx context.Context, name string) error {
	if err := r.closedErr("step tensor "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if r.inference {
		return errInference
	}
	if !r.overlap {
		if _, ok := r.model.Numel[name]; !ok {
			return fmt.Errorf("zinf: step tensor %q: not a tensor of the model", name)
		}
		return nil
	}
	if r.txn == nil {
		if !r.speculate() {
			// The step waits for the norm and overflow (zinf.speculate).
			if _, ok := r.model.Numel[name]; !ok {
				return fmt.Errorf("zinf: step tensor %q: not a tensor of the model", name)
			}
			return nil
		}
		txn, err := r.beginStep(ctx)
		if err != nil {
			return err
		}
		r.txn = txn
	}
	return r.txn.Tensor(name)
}

// StepLayer is StepTensor for every tensor of layer l.
func (r *Runtime) StepLayer(ctx context.Context, l int) error {
	if err := r.closedErr("step layer "+strconv.Itoa(l), optimizer.ErrClosed); err != nil {
		return err
	}
	var first error
	for _, n := range r.LayerTensors(l) {
		if err := r.StepTensor(ctx, n); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// AbortStep gives up the optimizer step in progress: updates StepTensor
// started are abandoned (waiting for their I/O), every gradient
// accumulated since the last Step, of every micro-step, is dropped, and so
// is a gradient check kept for a retry of Step. Parameters, optimizer
// states, the step count, the loss scale and the schedule stay as the last
// Step left them, so a loop whose backward pass failed half-way (a full
// disk under AccumulateGrad, say) calls AbortStep and runs the step again
// from its first micro-step, with the same result as if nothing had
// failed. In a data-parallel job every rank gives the step up.
func (r *Runtime) AbortStep() {
	if r.inference {
		return
	}
	// A step updating in the background is the last Step's, not this
	// one's: it lands; one that failed is given up with this step.
	_ = r.settle(context.Background())
	r.bgErr = nil
	if r.txn != nil {
		r.txn.Abort()
		r.txn = nil
	}
	r.train.pending = nil
	r.train.txnCheck = false
	r.held = nil
	r.grads.Zero()
}
