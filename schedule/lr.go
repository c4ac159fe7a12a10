package schedule

import (
	"errors"
	"fmt"
	"math"

	"github.com/zinfio/zinf/config"
)

// Values are what a schedule sets for one optimizer step.
type Values struct {
	// LR is the learning rate, in float64 as the schedule computes it (the
	// optimizer rounds it to float32 once).
	LR float64
	// Betas reports that Beta1 and Beta2 replace the optimizer's betas for
	// this step (OneCycle's momentum cycling).
	Betas        bool
	Beta1, Beta2 float64
}

// Schedule gives the hyperparameters of each applied optimizer step. k is
// the step's number among applied steps, from 1: steps skipped for an fp16
// overflow do not count, as DeepSpeed does not step its scheduler on them.
// At must be a pure function of k.
type Schedule interface {
	At(k int) Values
}

// iteration maps applied step k to DeepSpeed's last_batch_iteration at
// the time the step runs: the scheduler is built at -1 and stepped once
// after each applied step, so step k sees k-2 (and step 1 the value the
// constructor set, which it reports as -1).
func iteration(k int) int { return k - 2 }

// Constant is a fixed learning rate (no "scheduler" section, or a loop
// that sets the rate itself).
type Constant float64

// At returns the rate for every step.
func (c Constant) At(int) Values { return Values{LR: float64(c)} }

// Warmup is the warmup ramp WarmupLR, WarmupDecayLR and WarmupCosineLR
// share.
type Warmup struct {
	// NumSteps is warmup_num_steps; values below 2 act as 2.
	NumSteps int
	// Linear selects warmup_type "linear"; false is "log".
	Linear bool
}

func (w Warmup) steps() int { return max(2, w.NumSteps) }

// gamma is the warmup fraction at iteration it (0 <= it < steps()):
//
//	log:    (1/ln(W)) * ln(it+1)
//	linear: it / W
//
// with W = max(2, warmup_num_steps), in float64, in that order of
// operations (DeepSpeed's).
func (w Warmup) gamma(it int) float64 {
	W := w.steps()
	if w.Linear {
		return float64(it) / float64(W)
	}
	inv := 1.0 / math.Log(float64(W))
	return inv * math.Log(float64(it+1))
}

// WarmupLR is DeepSpeed's WarmupLR: the rate rises from MinLR to MaxLR over
// the warmup and stays at MaxLR. At iteration it (see the package
// documentation):
//
//	it < 0:  MinLR
//	it < W:  MinLR + (MaxLR-MinLR) * gamma(it)
//	else:    MaxLR  (MinLR + (MaxLR-MinLR) * 1.0)
type WarmupLR struct {
	MinLR, MaxLR float64
	Warmup
}

// At implements Schedule.
func (s WarmupLR) At(k int) Values {
	it := iteration(k)
	if it < 0 {
		return Values{LR: s.MinLR}
	}
	g := 1.0
	if it < s.steps() {
		g = s.gamma(it)
	}
	return Values{LR: s.MinLR + (s.MaxLR-s.MinLR)*g}
}

// WarmupDecayLR is DeepSpeed's WarmupDecayLR: WarmupLR's warmup, then a
// linear decay to 0 at TotalNumSteps. After the warmup:
//
//	gamma = max(0, float64(T - it) / float64(max(1, T - W)))
//
// with T = total_num_steps (T - W in integers, then converted).
type WarmupDecayLR struct {
	WarmupLR
	TotalNumSteps int
}

// At implements Schedule.
func (s WarmupDecayLR) At(k int) Values {
	it := iteration(k)
	if it < 0 {
		return Values{LR: s.MinLR}
	}
	W := s.steps()
	var g float64
	if it < W {
		g = s.gamma(it)
	} else {
		g = max(0.0, float64(s.TotalNumSteps-it)/math.Max(1.0, float64(s.TotalNumSteps-W)))
	}
	return Values{LR: s.MinLR + (s.MaxLR-s.MinLR)*g}
}

// WarmupCosineLR is DeepSpeed's WarmupCosineLR: the rate is BaseLR (the
// optimizer's lr) times a ratio that rises from WarmupMinRatio to 1 over
// the warmup and then follows a half cosine down to CosMinRatio at
// TotalNumSteps, where it stays:
//
//	it < 0:  0 (DeepSpeed's constructor sets the rate to 0)
//	it < W:  r = WarmupMinRatio + gamma(it) * (1 - WarmupMinRatio)
//	else:    p = min(1, float64(it - W + 1) / float64(max(1, T - W)))
//	         r = max(0, CosMinRatio + (1 - CosMinRatio) * ((1 + cos(pi*p)) / 2))
//	lr = BaseLR * r
type WarmupCosineLR struct {
	BaseLR         float64
	WarmupMinRatio float64
	CosMinRatio    float64
	TotalNumSteps  int
	Warmup
}

// At implements Schedule.
func (s WarmupCosineLR) At(k int) Values {
	it := iteration(k)
	if it < 0 {
		return Values{LR: 0}
	}
	W := s.steps()
	var r float64
	if it < W {
		r = s.WarmupMinRatio + s.gamma(it)*(1.0-s.WarmupMinRatio)
	} else {
		p := math.Min(1.0, float64(it-W+1)/float64(max(1, s.TotalNumSteps-W)))
		c := (1 + math.Cos(math.Pi*p)) / 2
		r = math.Max(0.0, s.CosMinRatio+(1.0-s.CosMinRatio)*c)
	}
	return Values{LR: s.BaseLR * r}
}

// OneCycle is DeepSpeed's OneCycle: one triangular cycle of the rate from
// MinLR up to MaxLR (FirstStepSize steps) and back (SecondStepSize), then
// an optional decay; with Momentum, beta1 moves inversely between MaxMom
// and MinMom and beta2 is set to 0.99 (DeepSpeed's OneCycle sets the
// optimizer's betas to (momentum, 0.99)). The formulas are in the package
// documentation.
type OneCycle struct {
	MinLR, MaxLR                      float64
	DecayLRRate                       float64
	FirstStepSize, SecondStepSize     int
	FirstStairCount, SecondStairCount int
	DecayStepSize                     int
	Momentum                          bool
	MinMom, MaxMom, DecayMomRate      float64
}

// oneCycleBeta2 is the beta2 DeepSpeed's OneCycle writes with every
// momentum it sets.
const oneCycleBeta2 = 0.99

func (s OneCycle) total() float64 { return float64(s.FirstStepSize) + float64(s.SecondStepSize) }

// scaleFactor is the position in the cycle, 0 at MinLR and 1 at MaxLR, of
// iteration it.
func (s OneCycle) scaleFactor(it int) float64 {
	total := s.total()
	stepRatio := float64(s.FirstStepSize) / total
	bi := float64(it + 1)
	cycle := math.Floor(1 + bi/total)
	x := 1. + bi/total - cycle
	var sf float64
	var stairs int
	if x <= stepRatio {
		sf = x / stepRatio
		stairs = s.FirstStairCount
	} else {
		sf = (x - 1) / (stepRatio - 1)
		stairs = s.SecondStairCount
	}
	if stairs > 0 {
		ci := math.Mod(bi, total) // bi >= 0: Python's % and Go's Mod agree
		var pos float64
		if ci <= float64(s.FirstStepSize) {
			pos = ci * float64(stairs) / float64(s.FirstStepSize)
		} else {
			pos = (total - ci) * float64(stairs) / float64(s.SecondStepSize)
		}
		sf = math.Floor(pos) / float64(stairs)
	}
	return sf
}

// At implements Schedule.
func (s OneCycle) At(k int) Values {
	it := iteration(k)
	var v Values
	if it < 0 {
		v.LR = s.MinLR
		if s.Momentum {
			v.Betas, v.Beta1, v.Beta2 = true, s.MinMom, oneCycleBeta2
		}
		return v
	}
	if float64(it) < s.total() {
		sf := s.scaleFactor(it)
		v.LR = s.MinLR + (s.MaxLR-s.MinLR)*sf
		if s.Momentum {
			v.Betas, v.Beta1, v.Beta2 = true, s.MaxMom-(s.MaxMom-s.MinMom)*sf, oneCycleBeta2
		}
		return v
	}
	dbi := float64(it) - s.total() + 1
	v.LR = s.MinLR
	if s.DecayStepSize != 0 && s.DecayLRRate != 0 {
		v.LR = s.MinLR / (1 + s.DecayLRRate*(dbi/float64(s.DecayStepSize)))
	}
	if s.Momentum {
		v.Betas, v.Beta1, v.Beta2 = true, s.MaxMom, oneCycleBeta2
		if s.DecayStepSize != 0 && s.DecayMomRate != 0 {
			v.Beta1 = s.MaxMom * (1 + s.DecayMomRate*(dbi/float64(s.DecayStepSize)))
		}
	}
	return v
}

// FromConfig returns the schedule a config's "scheduler" section
// describes, or Constant(optimizer.params.lr) without one. The config
// must be valid (Validate). totalSteps is the run's number of optimizer
// steps, which stands for a total_num_steps of "auto" (0: unknown, and
// such a config is refused). Momentum cycling needs an optimizer with
// betas (Config.Optimizer.HasBetas); for another, it is off, as in
// DeepSpeed.
func FromConfig(cfg *config.Config, totalSteps int) (Schedule, error) {
	if cfg == nil {
		return nil, errors.New("schedule: nil config")
	}
	s := cfg.Scheduler
	if s.TotalNumStepsAuto && (s.Type == config.SchedulerWarmupDecayLR || s.Type == config.SchedulerWarmupCosineLR) {
		if totalSteps < 1 {
			return nil, fmt.Errorf("schedule: scheduler.params.total_num_steps is \"auto\" (the Hugging Face integration fills in the run's number of steps): give the run's number of optimizer steps (zinf.Options.TotalSteps, zinf train --steps)")
		}
		s.TotalNumSteps = totalSteps
	}
	w := Warmup{NumSteps: s.WarmupNumSteps, Linear: s.WarmupType == config.WarmupLinear}
	if s.Type != config.SchedulerNone && s.Type != config.SchedulerOneCycle && s.WarmupType != config.WarmupLog && s.WarmupType != config.WarmupLinear {
		return nil, fmt.Errorf("schedule: scheduler.params.warmup_type %q: allowed: log, linear", s.WarmupType)
	}
	switch s.Type {
	case config.SchedulerNone:
		return Constant(cfg.Optimizer.LR), nil
	case config.SchedulerWarmupLR:
		return WarmupLR{MinLR: s.WarmupMinLR, MaxLR: s.WarmupMaxLR, Warmup: w}, nil
	case config.SchedulerWarmupDecayLR:
		return WarmupDecayLR{WarmupLR: WarmupLR{MinLR: s.WarmupMinLR, MaxLR: s.WarmupMaxLR, Warmup: w}, TotalNumSteps: s.TotalNumSteps}, nil
	case config.SchedulerWarmupCosineLR:
		return WarmupCosineLR{BaseLR: cfg.Optimizer.LR, WarmupMinRatio: s.WarmupMinRatio, CosMinRatio: s.CosMinRatio,
			TotalNumSteps: s.TotalNumSteps, Warmup: w}, nil
	case config.SchedulerOneCycle:
		if s.CycleFirstStepSize < 1 || s.CycleSecondStepSize < 1 {
			return nil, fmt.Errorf("schedule: OneCycle step sizes %d and %d: both must be >= 1", s.CycleFirstStepSize, s.CycleSecondStepSize)
		}
		return OneCycle{MinLR: s.CycleMinLR, MaxLR: s.CycleMaxLR, DecayLRRate: s.DecayLRRate,
			FirstStepSize: s.CycleFirstStepSize, SecondStepSize: s.CycleSecondStepSize,
			FirstStairCount: s.CycleFirstStairCount, SecondStairCount: s.CycleSecondStairCount, DecayStepSize: s.DecayStepSize,
			Momentum: s.CycleMomentum && cfg.Optimizer.HasBetas(), MinMom: s.CycleMinMom, MaxMom: s.CycleMaxMom, DecayMomRate: s.DecayMomRate}, nil
	}
	return nil, fmt.Errorf("schedule: scheduler.type %q: allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle", s.Type)
}
