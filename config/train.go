package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// LossScaling is the loss-scaling part of the "fp16" section. It acts only
// when fp16.enabled is true (bf16 and fp32 training need no loss scaling,
// as in DeepSpeed); the package documentation gives the exact rules.
type LossScaling struct {
	// LossScale is "fp16.loss_scale": 0 means dynamic loss scaling, a
	// value > 0 a static scale. Default 0.
	LossScale float64
	// InitialScalePower is "fp16.initial_scale_power": the dynamic scale
	// starts at 2^InitialScalePower. 0..126. Default 16.
	InitialScalePower int
	// LossScaleWindow is "fp16.loss_scale_window": clean steps (no
	// overflow) before the dynamic scale doubles. Default 1000.
	LossScaleWindow int
	// Hysteresis is "fp16.hysteresis": overflows tolerated before the
	// dynamic scale halves. Default 2.
	Hysteresis int
	// ConsecutiveHysteresis is "fp16.consecutive_hysteresis": refill the
	// hysteresis on every clean step instead of when the scale doubles.
	// Default false.
	ConsecutiveHysteresis bool
	// MinLossScale is "fp16.min_loss_scale": the dynamic scale never goes
	// below it (> 0). Default 1.
	MinLossScale float64
}

// Dynamic reports whether the loss scale is dynamic (fp16.loss_scale 0).
func (l LossScaling) Dynamic() bool { return l.LossScale == 0 }

// SchedulerType names a learning-rate schedule of DeepSpeed's "scheduler"
// section.
type SchedulerType string

// The schedules zinf implements, with DeepSpeed's names. SchedulerNone is
// the absence of a "scheduler" section: the learning rate stays
// optimizer.params.lr.
const (
	SchedulerNone           SchedulerType = ""
	SchedulerWarmupLR       SchedulerType = "WarmupLR"
	SchedulerWarmupDecayLR  SchedulerType = "WarmupDecayLR"
	SchedulerWarmupCosineLR SchedulerType = "WarmupCosineLR"
	SchedulerOneCycle       SchedulerType = "OneCycle"
)

// Warmup shapes of WarmupLR, WarmupDecayLR and WarmupCosineLR.
const (
	WarmupLog    = "log"
	WarmupLinear = "linear"
)

// Scheduler is the "scheduler" section: {"type": ..., "params": {...}}.
// Each field is one key of "params", with DeepSpeed's name and default; a
// key belongs to the types listed beside it and is refused for the others.
// The schedules' formulas are in the package documentation.
type Scheduler struct {
	// Type is "type". Default SchedulerNone (no section).
	Type SchedulerType

	// WarmupMinLR is "warmup_min_lr" (WarmupLR, WarmupDecayLR), >= 0.
	// Default 0.
	WarmupMinLR float64
	// WarmupMaxLR is "warmup_max_lr" (WarmupLR, WarmupDecayLR), >= 0.
	// Default: optimizer.params.lr for WarmupLR, 0.001 for WarmupDecayLR
	// (DeepSpeed's defaults).
	WarmupMaxLR float64
	// WarmupNumSteps is "warmup_num_steps" (WarmupLR, WarmupDecayLR,
	// WarmupCosineLR), >= 1; values below 2 act as 2. Default 1000.
	WarmupNumSteps int
	// WarmupType is "warmup_type" (WarmupLR, WarmupDecayLR,
	// WarmupCosineLR): "log" or "linear". Default "log".
	WarmupType string
	// TotalNumSteps is "total_num_steps" (WarmupDecayLR, WarmupCosineLR),
	// >= 1. Required for those types, or "auto" (TotalNumStepsAuto).
	TotalNumSteps int
	// TotalNumStepsAuto is total_num_steps "auto", which the Hugging Face
	// integration replaces by the run's number of optimizer steps: zinf
	// takes the run's (zinf.Options.TotalSteps, zinf train --steps).
	// TotalNumSteps is 0 then.
	TotalNumStepsAuto bool
	// WarmupMinRatio is "warmup_min_ratio" (WarmupCosineLR): the warmup
	// starts at this fraction of optimizer.params.lr, >= 0. Default 0.
	WarmupMinRatio float64
	// CosMinRatio is "cos_min_ratio" (WarmupCosineLR): the fraction of
	// optimizer.params.lr the cosine ends at, >= 0. Default 0.0001.
	CosMinRatio float64

	// CycleMinLR is "cycle_min_lr" (OneCycle), >= 0. Required.
	CycleMinLR float64
	// CycleMaxLR is "cycle_max_lr" (OneCycle), >= 0. Required.
	CycleMaxLR float64
	// DecayLRRate is "decay_lr_rate" (OneCycle), >= 0. Default 0.
	DecayLRRate float64
	// CycleFirstStepSize is "cycle_first_step_size" (OneCycle): steps of
	// the rising half of the cycle, >= 1. Default 2000.
	CycleFirstStepSize int
	// CycleSecondStepSize is "cycle_second_step_size" (OneCycle): steps of
	// the falling half, >= 1. Default: CycleFirstStepSize.
	CycleSecondStepSize int
	// CycleFirstStairCount is "cycle_first_stair_count" (OneCycle): stairs
	// of the rising half, 0 for a continuous ramp. Default 0.
	CycleFirstStairCount int
	// CycleSecondStairCount is "cycle_second_stair_count" (OneCycle).
	// Default: CycleFirstStairCount.
	CycleSecondStairCount int
	// DecayStepSize is "decay_step_size" (OneCycle): steps per decay
	// interval after the cycle, 0 for no decay. Default 0.
	DecayStepSize int
	// CycleMomentum is "cycle_momentum" (OneCycle): cycle the optimizer's
	// beta1 inversely to the learning rate (optimizers with betas only;
	// see the package documentation). Default true.
	CycleMomentum bool
	// CycleMinMom is "cycle_min_mom" (OneCycle), in [0, 1). Default 0.8.
	CycleMinMom float64
	// CycleMaxMom is "cycle_max_mom" (OneCycle), in [0, 1). Default 0.9.
	CycleMaxMom float64
	// DecayMomRate is "decay_mom_rate" (OneCycle), >= 0. Default 0.
	DecayMomRate float64
}

// PinnedGradsMode is the "zinf.pinned_grads" policy: whether gradients
// stay in pinned memory through the step when the pool has room for them.
type PinnedGradsMode string

// The pinned-gradient policies.
const (
	// PinnedGradsAuto keeps in pinned memory, for the whole step, the
	// gradients the pool has room for beyond every minimum and the planned
	// prefetch window: the optimizer's update reads them there, and they are
	// never written to NVMe nor read back. The others take the NVMe round
	// trip; Open logs how many stay and what pool keeps them all.
	PinnedGradsAuto PinnedGradsMode = "auto"
	// PinnedGradsOff writes every gradient behind to NVMe and reads it back
	// at the update (the layout before zinf.pinned_grads).
	PinnedGradsOff PinnedGradsMode = "off"
)

// SpeculateMode is the "zinf.speculate" policy: whether, with
// gradient_clipping or fp16 on, each layer's optimizer update still starts
// during the backward pass before the global gradient norm and overflow
// are known.
type SpeculateMode string

// The speculation policies.
const (
	// SpeculateAuto speculates while the recent steps rarely needed a
	// correction (see the package documentation for the rule).
	SpeculateAuto SpeculateMode = "auto"
	// SpeculateAlways always speculates (rolls back when wrong).
	SpeculateAlways SpeculateMode = "always"
	// SpeculateNever runs the optimizer step after the norm and overflow
	// are known (no overlap when they are needed).
	SpeculateNever SpeculateMode = "never"
)

// OptimizerStates is the "zinf.optimizer_states" format: how the
// optimizer's states are stored (optimizer.ParseStateFormat takes the
// same words).
type OptimizerStates string

// The state formats.
const (
	// OptimizerStatesFP32 keeps every state as fp32 (12 bytes an element
	// for Adam's record: master and two moments).
	OptimizerStatesFP32 OptimizerStates = "fp32"
	// OptimizerStatesBF16 keeps Adam's moments as bfloat16 (8 bytes an
	// element for the record).
	OptimizerStatesBF16 OptimizerStates = "bf16"
	// OptimizerStates8Bit keeps Adam's moments 8-bit blockwise, as
	// bitsandbytes' 8-bit optimizers do (about 6.03 bytes an element for
	// the record).
	OptimizerStates8Bit OptimizerStates = "8bit"
)

// ScheduleMode is the "zinf.schedule" policy: the order of work within
// a step of several micro-batches (gradient_accumulation_steps). Both
// orders give the same results bit for bit; they differ in NVMe traffic
// and pinned memory.
type ScheduleMode string

// The schedules.
const (
	// ScheduleAuto lets the planner predict both orders from the NVMe
	// bandwidth, the compute per layer, the micro-batches and the pool,
	// and pick the faster.
	ScheduleAuto ScheduleMode = "auto"
	// ScheduleLayerMajor runs every micro-batch of a layer while its
	// parameters are in: each layer's parameters are read once per pass
	// and its gradient is summed over the micro-batches in pinned memory
	// and written once per step.
	ScheduleLayerMajor ScheduleMode = "layer-major"
	// ScheduleMicroBatchMajor is ZeRO-Infinity's order: every micro-batch
	// runs forward and backward through every layer, so parameters are
	// read 2k times per step and gradients read back and rewritten k
	// times.
	ScheduleMicroBatchMajor ScheduleMode = "micro-batch-major"
)

// schedulerParam is one key of scheduler.params: its reader and the types
// it belongs to.
type schedulerParam struct {
	name  string
	read  func(c *Config) reader
	types []SchedulerType
}

var (
	warmupTypes  = []SchedulerType{SchedulerWarmupLR, SchedulerWarmupDecayLR}
	anyWarmup    = []SchedulerType{SchedulerWarmupLR, SchedulerWarmupDecayLR, SchedulerWarmupCosineLR}
	decayTypes   = []SchedulerType{SchedulerWarmupDecayLR, SchedulerWarmupCosineLR}
	cosineOnly   = []SchedulerType{SchedulerWarmupCosineLR}
	oneCycleOnly = []SchedulerType{SchedulerOneCycle}
)

// schedulerParams lists every key of scheduler.params zinf knows.
var schedulerParams = []schedulerParam{
	{"warmup_min_lr", func(c *Config) reader { return autoable("0", floatInto(&c.Scheduler.WarmupMinLR)) }, warmupTypes},
	{"warmup_max_lr", func(c *Config) reader {
		return autoable("(optimizer.params.lr for WarmupLR, 0.001 for WarmupDecayLR)", floatInto(&c.Scheduler.WarmupMaxLR))
	}, warmupTypes},
	{"warmup_num_steps", func(c *Config) reader { return autoable("1000", intInto(&c.Scheduler.WarmupNumSteps)) }, anyWarmup},
	{"warmup_type", func(c *Config) reader { return stringInto(&c.Scheduler.WarmupType) }, anyWarmup},
	{"total_num_steps", func(c *Config) reader { return totalSteps(&c.Scheduler) }, decayTypes},
	{"warmup_min_ratio", func(c *Config) reader { return floatInto(&c.Scheduler.WarmupMinRatio) }, cosineOnly},
	{"cos_min_ratio", func(c *Config) reader { return floatInto(&c.Scheduler.CosMinRatio) }, cosineOnly},
	{"cycle_min_lr", func(c *Config) reader { return floatInto(&c.Scheduler.CycleMinLR) }, oneCycleOnly},
	{"cycle_max_lr", func(c *Config) reader { return floatInto(&c.Scheduler.CycleMaxLR) }, oneCycleOnly},
	{"decay_lr_rate", func(c *Config) reader { return floatInto(&c.Scheduler.DecayLRRate) }, oneCycleOnly},
	{"cycle_first_step_size", func(c *Config) reader { return intInto(&c.Scheduler.CycleFirstStepSize) }, oneCycleOnly},
	{"cycle_second_step_size", func(c *Config) reader { return intInto(&c.Scheduler.CycleSecondStepSize) }, oneCycleOnly},
	{"cycle_first_stair_count", func(c *Config) reader { return intInto(&c.Scheduler.CycleFirstStairCount) }, oneCycleOnly},
	{"cycle_second_stair_count", func(c *Config) reader { return intInto(&c.Scheduler.CycleSecondStairCount) }, oneCycleOnly},
	{"decay_step_size", func(c *Config) reader { return intInto(&c.Scheduler.DecayStepSize) }, oneCycleOnly},
	{"cycle_momentum", func(c *Config) reader { return boolInto(&c.Scheduler.CycleMomentum) }, oneCycleOnly},
	{"cycle_min_mom", func(c *Config) reader { return floatInto(&c.Scheduler.CycleMinMom) }, oneCycleOnly},
	{"cycle_max_mom", func(c *Config) reader { return floatInto(&c.Scheduler.CycleMaxMom) }, oneCycleOnly},
	{"decay_mom_rate", func(c *Config) reader { return floatInto(&c.Scheduler.DecayMomRate) }, oneCycleOnly},
}

// totalSteps reads total_num_steps: a number, or Hugging Face's "auto",
// which stands for the run's number of optimizer steps.
func totalSteps(s *Scheduler) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind == kString && n.str == "auto" {
			d.warn(`%s: "auto" is filled in by the Hugging Face integration with the run's number of optimizer steps; zinf uses the run's (zinf train --steps; the TotalSteps option of the Go API)`, key)
			s.TotalNumStepsAuto = true
			return
		}
		intInto(&s.TotalNumSteps)(d, n, key)
	}
}

// schedulerTypes are the values of scheduler.type zinf accepts.
var schedulerTypes = []string{string(SchedulerWarmupLR), string(SchedulerWarmupDecayLR), string(SchedulerWarmupCosineLR), string(SchedulerOneCycle)}

// schedulerSpecs is the "scheduler" section as the key index sees it: type
// and every parameter of every type (for suggestions); schedulerSection
// reads it against the parameters of the type actually written.
func schedulerSpecs(c *Config) []spec {
	params := make([]spec, len(schedulerParams))
	for i, p := range schedulerParams {
		params[i] = leaf(p.name, p.read(c))
	}
	return []spec{leaf("type", stringInto(&c.Scheduler.Type)), section("params", params...)}
}

// schedulerSection reads "scheduler": its type first (wherever it is
// written), then the params that type has. A key of another type's params
// is refused, naming the types it belongs to.
func schedulerSection(c *Config) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind != kObject {
			d.typeProblem(n, key, "an object {\"type\": ..., \"params\": {...}}")
			return
		}
		var typ *node
		for _, m := range n.members {
			if m.key == "type" {
				typ = m.val
			}
		}
		if typ == nil || typ.kind == kNull {
			d.problemAt(n.off, Problem{Key: key + ".type", Msg: "is missing", Allowed: strings.Join(schedulerTypes, ", ")})
			return
		}
		if typ.kind != kString {
			d.typeProblem(typ, key+".type", "a string")
			return
		}
		t := SchedulerType(typ.str)
		known := false
		for _, s := range schedulerTypes {
			known = known || s == typ.str
		}
		if !known {
			msg := "is not allowed"
			switch {
			case typ.str == "LRRangeTest":
				msg = "is not implemented by zinf"
			case strings.EqualFold(typ.str, "warmuplr") || strings.EqualFold(typ.str, "warmupdecaylr") ||
				strings.EqualFold(typ.str, "warmupcosinelr") || strings.EqualFold(typ.str, "onecycle"):
				msg = "is not allowed (schedule names are case-sensitive, as in DeepSpeed)"
			}
			d.valueProblem(typ, key+".type", msg, strings.Join(schedulerTypes, ", "))
			return
		}
		params := make([]spec, 0, len(schedulerParams))
		for _, p := range schedulerParams {
			if slices.Contains(p.types, t) {
				params = append(params, leaf(p.name, p.read(d.c)))
				continue
			}
			owners := make([]string, len(p.types))
			for i, o := range p.types {
				owners[i] = string(o)
			}
			params = append(params, leaf(p.name, func(d *decoder, n *node, key string) {
				d.valueProblem(n, key, fmt.Sprintf("is not a parameter of %s (it belongs to %s)", t, strings.Join(owners, ", ")), "")
			}))
		}
		d.object(n, key, []spec{leaf("type", stringInto(&d.c.Scheduler.Type)), section("params", params...)})
		// OneCycle's learning rates have no default, and 0 is a valid value,
		// so only the file can tell that they are missing (Validate checks
		// total_num_steps).
		if t != SchedulerOneCycle {
			return
		}
		for _, k := range []string{"cycle_min_lr", "cycle_max_lr"} {
			if _, ok := d.set[key+".params."+k]; !ok {
				d.problemAt(n.off, Problem{Key: key + ".params." + k, Msg: "is missing: " + string(t) + " has no default for it"})
			}
		}
	}
}

// lossScalingSpecs are the loss-scaling keys of "fp16".
func lossScalingSpecs(c *Config) []spec {
	l := &c.LossScaling
	return []spec{
		leaf("loss_scale", floatInto(&l.LossScale)),
		leaf("initial_scale_power", intInto(&l.InitialScalePower)),
		leaf("loss_scale_window", intInto(&l.LossScaleWindow)),
		leaf("hysteresis", intInto(&l.Hysteresis)),
		leaf("consecutive_hysteresis", boolInto(&l.ConsecutiveHysteresis)),
		leaf("min_loss_scale", floatInto(&l.MinLossScale)),
	}
}

// resolveTraining fills the defaults that depend on other keys and warns
// about training keys that will not act.
func (d *decoder) resolveTraining() {
	d.resolveOptimizer()
	c := d.c
	given := func(k string) bool {
		n, ok := d.set[k]
		return ok && !(n.kind == kString && n.str == "auto")
	}
	s := &c.Scheduler
	if s.Type == SchedulerWarmupLR && !given("scheduler.params.warmup_max_lr") {
		s.WarmupMaxLR = c.Optimizer.LR
	}
	if s.Type == SchedulerOneCycle {
		if !given("scheduler.params.cycle_second_step_size") {
			s.CycleSecondStepSize = s.CycleFirstStepSize
			if s.CycleFirstStepSize < 1 {
				s.CycleSecondStepSize = defaults().Scheduler.CycleFirstStepSize // the first is reported
			}
		}
		if !given("scheduler.params.cycle_second_stair_count") {
			s.CycleSecondStairCount = s.CycleFirstStairCount
		}
		if s.CycleMomentum && !c.Optimizer.HasBetas() {
			d.warn("scheduler.params.cycle_momentum: optimizer %s has no betas; momentum is not cycled (as in DeepSpeed)", c.Optimizer.Type)
		}
	}
	if !c.FP16 {
		var written []string
		for _, k := range []string{"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale"} {
			if _, ok := d.set["fp16."+k]; ok {
				written = append(written, "fp16."+k)
			}
		}
		if len(written) > 0 {
			d.warn("%s: no loss scaling, fp16.enabled is false (loss scaling is for fp16 training only)", strings.Join(written, ", "))
		}
	}
}

// validateTraining checks gradient_clipping, the loss-scaling keys, the
// scheduler and zinf.speculate.
func (c *Config) validateTraining(k *checker) {
	nonNeg := func(key string, v float64) {
		if !(v >= 0) || math.IsInf(v, 0) {
			k.add(key, formatFloat(v), "is out of range", "a finite number >= 0")
		}
	}
	positive := func(key string, v float64) {
		if !(v > 0) || math.IsInf(v, 0) {
			k.add(key, formatFloat(v), "is out of range", "a finite number > 0")
		}
	}
	// A learning rate reaches the step as a float32 (see Validate).
	rate := func(key string, v float64) { k.float32Key(key, v, v >= 0, "a finite number >= 0") }
	c.validateOptimizer(k)
	nonNeg("gradient_clipping", c.GradientClipping)
	l := &c.LossScaling
	nonNeg("fp16.loss_scale", l.LossScale)
	k.limit("fp16.initial_scale_power", int64(l.InitialScalePower))
	k.limit("fp16.loss_scale_window", int64(l.LossScaleWindow))
	k.limit("fp16.hysteresis", int64(l.Hysteresis))
	positive("fp16.min_loss_scale", l.MinLossScale)

	s := &c.Scheduler
	if s.Type != SchedulerNone {
		k.enum("scheduler.type", string(s.Type))
	}
	p := "scheduler.params."
	switch s.Type {
	case SchedulerWarmupLR, SchedulerWarmupDecayLR, SchedulerWarmupCosineLR:
		if s.Type != SchedulerWarmupCosineLR {
			rate(p+"warmup_min_lr", s.WarmupMinLR)
			rate(p+"warmup_max_lr", s.WarmupMaxLR)
		}
		k.limit(p+"warmup_num_steps", int64(s.WarmupNumSteps))
		k.enum(p+"warmup_type", s.WarmupType)
		if s.Type != SchedulerWarmupLR {
			switch {
			case s.TotalNumStepsAuto && s.TotalNumSteps == 0:
			case s.TotalNumStepsAuto:
				k.add(p+"total_num_steps", strconv.Itoa(s.TotalNumSteps), "is set and \"auto\" at once", "a number or \"auto\"")
			case s.TotalNumSteps == 0:
				k.add(p+"total_num_steps", "", "is missing: "+string(s.Type)+" has no default for it", ">= 1")
			case s.TotalNumSteps < 0:
				k.add(p+"total_num_steps", strconv.Itoa(s.TotalNumSteps), "is out of range", ">= 1")
			}
		}
		if s.Type == SchedulerWarmupCosineLR {
			nonNeg(p+"warmup_min_ratio", s.WarmupMinRatio)
			nonNeg(p+"cos_min_ratio", s.CosMinRatio)
		}
	case SchedulerOneCycle:
		rate(p+"cycle_min_lr", s.CycleMinLR)
		rate(p+"cycle_max_lr", s.CycleMaxLR)
		nonNeg(p+"decay_lr_rate", s.DecayLRRate)
		k.limit(p+"cycle_first_step_size", int64(s.CycleFirstStepSize))
		k.limit(p+"cycle_second_step_size", int64(s.CycleSecondStepSize))
		k.limit(p+"cycle_first_stair_count", int64(s.CycleFirstStairCount))
		k.limit(p+"cycle_second_stair_count", int64(s.CycleSecondStairCount))
		k.limit(p+"decay_step_size", int64(s.DecayStepSize))
		for _, m := range []struct {
			key string
			v   float64
		}{{"cycle_min_mom", s.CycleMinMom}, {"cycle_max_mom", s.CycleMaxMom}} {
			if !(m.v >= 0 && m.v < 1) {
				k.add(p+m.key, formatFloat(m.v), "is out of range", ">= 0 and < 1 (it becomes the optimizer's beta1)")
			}
		}
		nonNeg(p+"decay_mom_rate", s.DecayMomRate)
	}
	k.enum("zinf.speculate", string(c.Zinf.Speculate))
	k.enum("zinf.pinned_grads", string(c.Zinf.PinnedGrads))
	k.enum("zinf.schedule", string(c.Zinf.Schedule))
	k.enum("zinf.optimizer_states", string(c.Zinf.OptimizerStates))
	for _, p := range c.Zinf.OptimizerStatesFP32 {
		if p == "" {
			k.add("zinf.optimizer_states_fp32", strconv.Quote(p), "is empty", `tensor name patterns ('*' any characters, '/' included; '?' one), such as "*embed*"`)
		}
	}
	if s := c.Zinf.OptimizerStates; s != OptimizerStatesFP32 && slices.Contains(enumValues["zinf.optimizer_states"], string(s)) &&
		!slices.Contains(adamTypes, c.Optimizer.Type) {
		k.add("zinf.optimizer_states", strconv.Quote(string(s)), fmt.Sprintf("is for Adam and AdamW; optimizer.type is %s", c.Optimizer.Type), string(OptimizerStatesFP32)+" (or optimizer.type Adam, AdamW)")
	}
}
