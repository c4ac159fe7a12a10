package schedule

import (
	"errors"
	"fmt"
	"math"

	"github.com/zinfio/zinf/config"
)

// ErrLossScaleAtMinimum is returned by LossScaler.Update when the gradients
// overflowed, the scale is due to be lowered and is already at
// min_loss_scale: the training has diverged (DeepSpeed raises "Current loss
// scale already at minimum - cannot decrease scale anymore" here).
var ErrLossScaleAtMinimum = errors.New("schedule: the gradients overflowed with the loss scale already at fp16.min_loss_scale")

// ScaleFactor is what the dynamic loss scale is multiplied or divided by
// (DeepSpeed's scale_factor, fixed at 2).
const ScaleFactor = 2.0

// LossScalerOptions configure a LossScaler; NewLossScaler takes them from a
// config.
type LossScalerOptions struct {
	// FP16 turns loss scaling (and the overflow check it comes with) on.
	// Without it the scale is 1 and Update does nothing.
	FP16 bool
	// Static, when > 0, is a fixed scale (fp16.loss_scale); 0 means
	// dynamic scaling.
	Static float64
	// Initial is the first dynamic scale (2^fp16.initial_scale_power).
	Initial float64
	// Window is fp16.loss_scale_window (>= 1).
	Window int
	// Hysteresis is fp16.hysteresis (>= 1).
	Hysteresis int
	// Consecutive is fp16.consecutive_hysteresis.
	Consecutive bool
	// Min is fp16.min_loss_scale (> 0).
	Min float64
}

// ScalerState is a LossScaler's state between steps (what a checkpoint
// keeps): the field names are DeepSpeed's DynamicLossScaler's.
type ScalerState struct {
	Scale            float64 `json:"cur_scale"`
	Iter             int     `json:"cur_iter"`
	LastOverflowIter int     `json:"last_overflow_iter"`
	Hysteresis       int     `json:"cur_hysteresis"`
}

// LossScaler is the fp16 loss scale: static, or dynamic with DeepSpeed's
// DynamicLossScaler rules (see Update). The training loop multiplies its
// loss by Scale before the backward pass; the optimizer step divides the
// gradients by it, skips the step when they overflowed, and reports the
// outcome with Update. A LossScaler is not safe for concurrent use.
type LossScaler struct {
	opts LossScalerOptions
	st   ScalerState
}

// NewLossScaler returns a scaler at its initial state. Options are checked
// as the config keys they come from are.
func NewLossScaler(o LossScalerOptions) (*LossScaler, error) {
	if o.FP16 {
		var errs []error
		finitePos := func(name string, v float64) {
			if !(v > 0) || math.IsInf(v, 0) {
				errs = append(errs, fmt.Errorf("schedule: %s = %v: must be a finite number > 0", name, v))
			}
		}
		if o.Static < 0 || math.IsNaN(o.Static) || math.IsInf(o.Static, 0) {
			errs = append(errs, fmt.Errorf("schedule: fp16.loss_scale = %v: must be 0 (dynamic) or a finite number > 0", o.Static))
		}
		if o.Static == 0 {
			finitePos("the initial loss scale (2^fp16.initial_scale_power)", o.Initial)
			finitePos("fp16.min_loss_scale", o.Min)
			if o.Window < 1 {
				errs = append(errs, fmt.Errorf("schedule: fp16.loss_scale_window = %d: must be >= 1", o.Window))
			}
			if o.Hysteresis < 1 {
				errs = append(errs, fmt.Errorf("schedule: fp16.hysteresis = %d: must be >= 1", o.Hysteresis))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	s := &LossScaler{opts: o}
	s.st = ScalerState{Scale: 1, LastOverflowIter: -1, Hysteresis: o.Hysteresis}
	switch {
	case !o.FP16:
	case o.Static > 0:
		s.st.Scale = o.Static
	default:
		s.st.Scale = o.Initial
	}
	return s, nil
}

// NewLossScalerFromConfig is NewLossScaler with the config's fp16 keys.
func NewLossScalerFromConfig(cfg *config.Config) (*LossScaler, error) {
	return NewLossScaler(LossScalerOptionsOf(cfg))
}

// LossScalerOptionsOf maps the config's fp16 keys to a scaler's options
// (unchecked: NewLossScaler checks them).
func LossScalerOptionsOf(cfg *config.Config) LossScalerOptions {
	l := cfg.LossScaling
	return LossScalerOptions{FP16: cfg.FP16, Static: l.LossScale, Initial: math.Ldexp(1, l.InitialScalePower),
		Window: l.LossScaleWindow, Hysteresis: l.Hysteresis, Consecutive: l.ConsecutiveHysteresis, Min: l.MinLossScale}
}

// Enabled reports whether loss scaling is on (fp16): the gradients are
// divided by Scale and checked for overflow at every step.
func (s *LossScaler) Enabled() bool { return s.opts.FP16 }

// Dynamic reports whether the scale changes with overflows.
func (s *LossScaler) Dynamic() bool { return s.opts.FP16 && s.opts.Static == 0 }

// Scale is the current loss scale (1 when not Enabled).
func (s *LossScaler) Scale() float64 { return s.st.Scale }

// State returns the scaler's state, for a checkpoint.
func (s *LossScaler) State() ScalerState { return s.st }

// Restore sets the scaler's state (from a checkpoint of a scaler with the
// same options). A scale that is not a finite number > 0 is refused.
func (s *LossScaler) Restore(st ScalerState) error {
	if !(st.Scale > 0) || math.IsInf(st.Scale, 0) || st.Hysteresis < 0 {
		return fmt.Errorf("schedule: loss scaler state %+v: the scale must be a finite number > 0 and the hysteresis >= 0", st)
	}
	s.st = st
	return nil
}

// Check reports whether Update(overflow) would fail (ErrLossScaleAtMinimum),
// without changing anything.
func (s *LossScaler) Check(overflow bool) error {
	c := *s
	return c.Update(overflow)
}

// Update records one optimizer step's overflow check: overflow says that
// the gradients held an inf or NaN (the step was skipped). A static or
// disabled scaler does nothing. A dynamic one follows DeepSpeed's
// DynamicLossScaler.update_scale, with factor 2:
//
//	overflow:
//	    if hysteresis == 1 or cur_hysteresis == 1:
//	        if scale == min_loss_scale: fail with ErrLossScaleAtMinimum (state unchanged)
//	        scale = max(scale / 2, min_loss_scale)
//	    else:
//	        cur_hysteresis -= 1
//	    last_overflow_iter = cur_iter
//	clean step:
//	    if consecutive_hysteresis: cur_hysteresis = hysteresis
//	    stable = cur_iter - last_overflow_iter - 1     // clean steps before this one since the last overflow
//	    if stable > 0 and stable % loss_scale_window == 0:
//	        if not consecutive_hysteresis: cur_hysteresis = hysteresis
//	        scale = scale * 2
//	cur_iter += 1
//
// with cur_iter = 0, last_overflow_iter = -1 and cur_hysteresis =
// hysteresis at the start. So the scale halves at the hysteresis-th
// overflow (counting from the start or from the last raise; without
// consecutive_hysteresis the count is not refilled by clean steps, and
// once used up every further overflow halves the scale), and doubles on
// the clean step that follows loss_scale_window clean steps, and every
// loss_scale_window clean steps after that.
func (s *LossScaler) Update(overflow bool) error {
	if !s.Dynamic() {
		return nil
	}
	o := s.opts
	st := s.st
	if overflow {
		if o.Hysteresis == 1 || st.Hysteresis == 1 {
			if st.Scale == o.Min {
				return fmt.Errorf("%w (%v): the loss keeps overflowing; training has diverged", ErrLossScaleAtMinimum, o.Min)
			}
			st.Scale = math.Max(st.Scale/ScaleFactor, o.Min)
		} else {
			st.Hysteresis--
		}
		st.LastOverflowIter = st.Iter
	} else {
		if o.Consecutive {
			st.Hysteresis = o.Hysteresis
		}
		stable := st.Iter - st.LastOverflowIter - 1
		if stable > 0 && stable%o.Window == 0 {
			if !o.Consecutive {
				st.Hysteresis = o.Hysteresis
			}
			st.Scale *= ScaleFactor
		}
	}
	st.Iter++
	s.st = st
	return nil
}
