package zinf

import (
	"time"

	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/schedule"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// stepState is the optimizer step in progress and what the next one
// starts from: the transaction StepTensor opened (until Step commits or
// AbortStep drops it), the step still updating in the background with
// zinf.overlap_update and the failure of one that did not land, the
// schedule, loss scaling, clipping and speculation, and the last step's
// outcome. The loop goroutine touches it; txn and last are read under
// Runtime.mu as well.
type stepState struct {
	train   training // schedule, loss scaling, clipping, speculation
	overlap bool     // StepTensor starts updates during backward
	// overlapUpdate: Step returns before the update is committed
	// (zinf.overlap_update); bg is that step until reaped and bgErr its
	// failure until Step retries it (overlap.go).
	overlapUpdate bool
	bg            *bgStep
	bgErr         error
	txn           *optimizer.StepTxn // the step StepTensor opened, until Step
	last          StepInfo
}

// training is a Runtime's optimizer-step state beyond the optimizer
// itself: the learning-rate schedule, the fp16 loss scaler, gradient
// clipping and speculation. It is touched by the loop goroutine only
// (Step, StepTensor, SetLR, AccumulateGrad); Metrics reads the counters
// under Runtime.mu.
type training struct {
	sched    schedule.Schedule
	lr       *float64 // SetLR: replaces sched
	scaler   *schedule.LossScaler
	clip     float64
	checks   bool // the step needs the global norm or overflow
	comm     comm.Comm
	mode     config.SpeculateMode
	history  []bool     // auto: whether each recent checked step needed a correction
	pending  *stepCheck // the last step's check, kept while its step has not completed
	txnCheck bool       // the open transaction speculates on a check
}

// stepCheck is what the global reduction of a step decided.
type stepCheck struct {
	sumSq    float64
	overflow bool
	factor   float32
	norm     float64
	coef     float64
	scale    float64
}

// StepInfo describes the last optimizer step Step completed.
type StepInfo struct {
	// Step is the optimizer step number of an applied step (its Adam bias
	// correction count); for a skipped step, the number the next applied
	// step will have.
	Step int
	// Applied is false for a step skipped because the fp16 gradients
	// overflowed (inf or NaN): nothing was updated, the gradients were
	// dropped and the loss scale lowered (see schedule.LossScaler).
	Applied bool
	// LR is the learning rate the step used (or would have); Beta1 and
	// Beta2 are set when OneCycle cycles the momentum.
	LR           float64
	Beta1, Beta2 float64
	// LossScale is the loss scale the step's gradients carried (1 without
	// fp16); NextLossScale the one for the next step's loss.
	LossScale, NextLossScale float64
	// GradNorm is the global L2 norm of the unscaled gradients over every
	// rank, when it was computed (gradient_clipping or fp16 on; else NaN).
	GradNorm float64
	// ClipCoef is what the gradients were multiplied by for clipping: 1
	// when clipping did not trigger (or is off), else
	// gradient_clipping / (GradNorm + 1e-6).
	ClipCoef float64
	// Clipped reports that clipping triggered.
	Clipped bool
	// Speculated reports that the step's update started during the
	// backward pass (StepTensor) before the norm and overflow were known;
	// RolledBack that it had to be discarded (the step was clipped, skipped
	// or its learning rate changed), costing RollbackTime.
	Speculated, RolledBack bool
	RollbackTime           time.Duration
	// Overlapped reports that Step returned while the step's update was
	// still running (zinf.overlap_update): its parameters are published
	// layer by layer for the next forward pass, and a failure surfaces as
	// ErrUpdateFailed from the next call that needs it.
	Overlapped bool
}

// bgStep is a step whose update runs on after Step returned, with what
// Step changed ahead of its commit and puts back if it fails.
type bgStep struct {
	txn *optimizer.StepTxn

	scaler    schedule.LossScaler
	history   []bool
	stats     TrainStats
	last      StepInfo
	stepCount int
}

// step is the optimizer step bg takes.
func (bg *bgStep) step() int { return bg.txn.Step() }

func (bg *bgStep) finished() bool {
	select {
	case <-bg.txn.Done():
		return true
	default:
		return false
	}
}
