package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestTrainingKeysDefaults(t *testing.T) {
	unsetRankEnv(t)
	c := mustParse(t, `{}`)
	if c.GradientClipping != 0 || c.Scheduler.Type != SchedulerNone || c.Zinf.Speculate != SpeculateAuto {
		t.Errorf("defaults: clipping %v scheduler %q speculate %q", c.GradientClipping, c.Scheduler.Type, c.Zinf.Speculate)
	}
	want := LossScaling{LossScale: 0, InitialScalePower: 16, LossScaleWindow: 1000, Hysteresis: 2, MinLossScale: 1}
	if c.LossScaling != want || !c.LossScaling.Dynamic() {
		t.Errorf("loss scaling defaults %+v", c.LossScaling)
	}
	c = mustParse(t, `{"fp16": {"enabled": true, "loss_scale": 128, "initial_scale_power": 8, "loss_scale_window": 50,
		"hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.5}, "gradient_clipping": 0.5,
		"zinf": {"speculate": "never"}}`)
	want = LossScaling{LossScale: 128, InitialScalePower: 8, LossScaleWindow: 50, Hysteresis: 3, ConsecutiveHysteresis: true, MinLossScale: 0.5}
	if c.LossScaling != want || c.LossScaling.Dynamic() || c.GradientClipping != 0.5 || c.Zinf.Speculate != SpeculateNever || len(c.Ignored) != 0 {
		t.Errorf("read %+v clip %v speculate %q ignored %q", c.LossScaling, c.GradientClipping, c.Zinf.Speculate, c.Ignored)
	}
	// Loss-scaling keys without fp16 are accepted with a warning that they
	// do not act.
	c = mustParse(t, `{"fp16": {"enabled": false, "loss_scale": 0, "hysteresis": 4}}`)
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "fp16.loss_scale, fp16.hysteresis: no loss scaling") {
		t.Errorf("warnings %q", c.Warnings)
	}
}

func TestSchedulerParse(t *testing.T) {
	unsetRankEnv(t)
	// WarmupLR's warmup_max_lr defaults to the optimizer's lr, WarmupDecayLR's
	// to 0.001, as in DeepSpeed.
	c := mustParse(t, `{"optimizer": {"type": "AdamW", "params": {"lr": 0.02}}, "scheduler": {"params": {"warmup_num_steps": 10}, "type": "WarmupLR"}}`)
	s := c.Scheduler
	if s.Type != SchedulerWarmupLR || s.WarmupMaxLR != 0.02 || s.WarmupMinLR != 0 || s.WarmupNumSteps != 10 || s.WarmupType != WarmupLog {
		t.Errorf("WarmupLR %+v", s)
	}
	c = mustParse(t, `{"optimizer": {"params": {"lr": 0.02}}, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_type": "linear"}}}`)
	if s := c.Scheduler; s.WarmupMaxLR != 0.001 || s.TotalNumSteps != 100 || s.WarmupType != WarmupLinear {
		t.Errorf("WarmupDecayLR %+v", s)
	}
	c = mustParse(t, `{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.2}}}`)
	if s := c.Scheduler; s.TotalNumSteps != 100 || s.WarmupMinRatio != 0.1 || s.CosMinRatio != 0.2 || s.WarmupNumSteps != 1000 {
		t.Errorf("WarmupCosineLR %+v", s)
	}
	c = mustParse(t, `{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 7, "cycle_first_stair_count": 3}}}`)
	if s := c.Scheduler; s.CycleMinLR != 0.001 || s.CycleMaxLR != 0.01 || s.CycleFirstStepSize != 7 || s.CycleSecondStepSize != 7 ||
		s.CycleFirstStairCount != 3 || s.CycleSecondStairCount != 3 || !s.CycleMomentum || s.CycleMinMom != 0.8 || s.CycleMaxMom != 0.9 {
		t.Errorf("OneCycle %+v", s)
	}
	// Hugging Face's "auto" reads as the default, except where there is none.
	c = mustParse(t, `{"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}}}`)
	if s := c.Scheduler; s.WarmupMaxLR != 1e-3 || s.WarmupNumSteps != 1000 || len(c.Warnings) != 3 {
		t.Errorf("auto: %+v %q", s, c.Warnings)
	}
	// total_num_steps "auto" stands for the run's number of steps.
	c = mustParse(t, `{"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}}`)
	if s := c.Scheduler; !s.TotalNumStepsAuto || s.TotalNumSteps != 0 || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "the run's number of optimizer steps") {
		t.Errorf("total_num_steps auto: %+v %q", s, c.Warnings)
	}
}

func TestTrainingKeysInvalid(t *testing.T) {
	unsetRankEnv(t)
	for _, tc := range []struct{ in, want string }{
		{`{"gradient_clipping": -1}`, `gradient_clipping: -1 is out of range (allowed: a finite number >= 0)`},
		{`{"gradient_clipping": "big"}`, `gradient_clipping: "big" is a string, not a number`},
		{`{"fp16": {"loss_scale": -2}}`, `fp16.loss_scale: -2 is out of range (allowed: a finite number >= 0)`},
		{`{"fp16": {"initial_scale_power": 200}}`, `fp16.initial_scale_power: 200 is out of range (allowed: 0..126)`},
		{`{"fp16": {"loss_scale_window": 0}}`, `fp16.loss_scale_window: 0 is out of range (allowed: >= 1)`},
		{`{"fp16": {"hysteresis": 0}}`, `fp16.hysteresis: 0 is out of range (allowed: >= 1)`},
		{`{"fp16": {"hysteresis": 1.5}}`, `fp16.hysteresis: 1.5 is not an integer`},
		{`{"fp16": {"min_loss_scale": 0}}`, `fp16.min_loss_scale: 0 is out of range (allowed: a finite number > 0)`},
		{`{"fp16": {"consecutive_hysteresis": 1}}`, `fp16.consecutive_hysteresis: 1 is a number, not a boolean (true or false)`},
		{`{"zinf": {"speculate": "sometimes"}}`, `zinf.speculate: "sometimes" is not allowed (allowed: auto, always, never)`},
		{`{"scheduler": {"params": {}}}`, `scheduler.type: is missing (allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)`},
		{`{"scheduler": {"type": "LRRangeTest", "params": {}}}`, `scheduler.type: "LRRangeTest" is not implemented by zinf (allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)`},
		{`{"scheduler": {"type": "warmuplr"}}`, `scheduler.type: "warmuplr" is not allowed (schedule names are case-sensitive, as in DeepSpeed) (allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)`},
		{`{"scheduler": {"type": "StepLR"}}`, `scheduler.type: "StepLR" is not allowed (allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)`},
		{`{"scheduler": "WarmupLR"}`, `scheduler: "WarmupLR" is a string, not an object {"type": ..., "params": {...}}`},
		{`{"scheduler": {"type": "WarmupLR", "params": {"cycle_min_lr": 0.1}}}`, `scheduler.params.cycle_min_lr: 0.1 is not a parameter of WarmupLR (it belongs to OneCycle)`},
		{`{"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}}`, `scheduler.params.total_num_steps: 10 is not a parameter of WarmupLR (it belongs to WarmupDecayLR, WarmupCosineLR)`},
		{`{"scheduler": {"type": "WarmupLR", "params": {"warmup_nm_steps": 10}}}`, `scheduler.params.warmup_nm_steps: unknown key (did you mean "scheduler.params.warmup_num_steps"?)`},
		{`{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}`, `scheduler.params.warmup_num_steps: 0 is out of range (allowed: >= 1)`},
		{`{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}}`, `scheduler.params.warmup_type: "exp" is not allowed (allowed: log, linear)`},
		{`{"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": -0.1}}}`, `scheduler.params.warmup_min_lr: -0.1 is out of range (allowed: a finite number >= 0)`},
		{`{"scheduler": {"type": "WarmupDecayLR", "params": {}}}`, `scheduler.params.total_num_steps: is missing: WarmupDecayLR has no default for it (allowed: >= 1)`},
		{`{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "many"}}}`, `scheduler.params.total_num_steps: "many" is a string, not an integer (allowed: >= 1)`},
		{`{"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}}`, `scheduler.params.cycle_min_lr: is missing: OneCycle has no default for it`},
		{`{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 0.1, "cycle_max_mom": 1}}}`, `scheduler.params.cycle_max_mom: 1 is out of range (allowed: >= 0 and < 1 (it becomes the optimizer's beta1))`},
		{`{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 0.1, "cycle_first_step_size": 0}}}`, `scheduler.params.cycle_first_step_size: 0 is out of range (allowed: >= 1)`},
		{`{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 0.1, "decay_step_size": -1}}}`, `scheduler.params.decay_step_size: -1 is out of range (allowed: >= 0)`},
	} {
		e := parseErr(t, tc.in)
		if got := e.Problems[0].String(); !strings.HasSuffix(got, tc.want) || len(e.Problems) != 1 {
			t.Errorf("%s:\n got %q (%d problems: %v)\nwant %q", tc.in, got, len(e.Problems), e, tc.want)
		}
	}
}

func TestTrainingKeysValidateInCode(t *testing.T) {
	unsetRankEnv(t)
	c := mustParse(t, `{}`)
	c.Scheduler.Type = SchedulerWarmupCosineLR // total_num_steps left at 0
	c.LossScaling.MinLossScale = -1
	c.Zinf.Speculate = ""
	err := c.Validate()
	for _, want := range []string{
		`scheduler.params.total_num_steps: is missing: WarmupCosineLR has no default for it`,
		`fp16.min_loss_scale: -1 is out of range`,
		`zinf.speculate: "" is not allowed`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want %q", err, want)
		}
	}
}

func TestTrainingKeysRoundTrip(t *testing.T) {
	unsetRankEnv(t)
	for _, text := range []string{
		`{"gradient_clipping": 1.5, "fp16": {"enabled": true, "loss_scale": 0, "hysteresis": 1, "consecutive_hysteresis": true}, "zinf": {"speculate": "always"}}`,
		`{"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0001, "warmup_num_steps": 5, "warmup_type": "linear"}}}`,
		`{"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 50, "warmup_max_lr": 0.3}}}`,
		`{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "cos_min_ratio": 0.5}}}`,
		`{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto"}}}`,
		`{"optimizer": {"type": "AdamW"}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_second_step_size": 3, "decay_step_size": 2, "decay_lr_rate": 0.1, "cycle_momentum": false}}}`,
	} {
		c := mustParse(t, text)
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", text, err, out)
		}
		if !reflect.DeepEqual(comparable(c), comparable(back)) {
			t.Errorf("%s: round trip changed the config:\n%+v\n%+v", text, comparable(c), comparable(back))
		}
		if len(back.Warnings) != 0 && !c.Scheduler.TotalNumStepsAuto { // "auto" is always said
			t.Errorf("%s: marshalled config has warnings %q\n%s", text, back.Warnings, out)
		}
	}
}

func TestOptimizerTypes(t *testing.T) {
	unsetRankEnv(t)
	c := mustParse(t, `{"optimizer": {"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true, "weight_decay": 0.01}}}`)
	if o := c.Optimizer; o.Type != OptimizerSGD || o.LR != 0.1 || o.Momentum != 0.9 || !o.Nesterov || o.WeightDecay != 0.01 || o.HasBetas() {
		t.Errorf("SGD %+v", o)
	}
	// Adagrad's and Lion's defaults are their own.
	c = mustParse(t, `{"optimizer": {"type": "Adagrad", "params": {"lr_decay": 0.1, "initial_accumulator_value": 0.5}}}`)
	if o := c.Optimizer; o.Type != OptimizerAdagrad || o.LR != 1e-2 || o.Eps != 1e-10 || o.LRDecay != 0.1 || o.InitialAccumulatorValue != 0.5 {
		t.Errorf("Adagrad %+v", o)
	}
	c = mustParse(t, `{"optimizer": {"type": "Lion", "params": {"weight_decay": 0.1}}}`)
	if o := c.Optimizer; o.Type != OptimizerLion || o.LR != 1e-4 || o.Betas != [2]float64{0.9, 0.99} || !o.HasBetas() {
		t.Errorf("Lion %+v", o)
	}
	c = mustParse(t, `{"optimizer": {"type": "Lion", "params": {"lr": 0.001, "betas": [0.95, 0.98]}}}`)
	if o := c.Optimizer; o.LR != 0.001 || o.Betas != [2]float64{0.95, 0.98} {
		t.Errorf("Lion given %+v", o)
	}
	// OneCycle cycles no momentum for SGD, with a warning (as DeepSpeed).
	c = mustParse(t, `{"optimizer": {"type": "SGD"}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1}}}`)
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "optimizer SGD has no betas") {
		t.Errorf("warnings %q", c.Warnings)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"optimizer": {"type": "SGD", "params": {"eps": 1e-8}}}`, `optimizer.params.eps: 1e-8 is not a parameter of SGD (it belongs to Adam, AdamW, Adagrad)`},
		{`{"optimizer": {"type": "Adam", "params": {"momentum": 0.9}}}`, `optimizer.params.momentum: 0.9 is not a parameter of Adam (it belongs to SGD)`},
		{`{"optimizer": {"params": {"betas": [0.9, 0.99]}, "type": "Adagrad"}}`, `optimizer.params.betas: [0.9, 0.99] is not a parameter of Adagrad (it belongs to Adam, AdamW, Lion)`},
		{`{"optimizer": {"type": "SGD", "params": {"nesterov": true}}}`, `optimizer.params.nesterov: true needs momentum > 0 and dampening 0 (they are 0 and 0), as in torch.optim.SGD`},
		{`{"optimizer": {"type": "SGD", "params": {"momentum": -1}}}`, `optimizer.params.momentum: -1 is out of range (allowed: a finite number >= 0)`},
		{`{"optimizer": {"type": "SGD", "params": {"maximize": true}}}`, `optimizer.params.maximize: true is not supported by zinf (allowed: false)`},
		{`{"optimizer": {"type": "Adagrad", "params": {"lr_decay": -0.5}}}`, `optimizer.params.lr_decay: -0.5 is out of range (allowed: a finite number >= 0)`},
		{`{"optimizer": {"type": "Lion", "params": {"betas": [0.9, 1]}}}`, `optimizer.params.betas[1]: 1 is out of range (allowed: >= 0 and < 1)`},
		{`{"optimizer": "Adam"}`, `optimizer: "Adam" is a string, not an object {"type": ..., "params": {...}}`},
	} {
		e := parseErr(t, tc.in)
		if got := e.Problems[0].String(); !strings.HasSuffix(got, tc.want) || len(e.Problems) != 1 {
			t.Errorf("%s:\n got %q (%d problems: %v)\nwant %q", tc.in, got, len(e.Problems), e, tc.want)
		}
	}
	for _, text := range []string{
		`{"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}}}`,
		`{"optimizer": {"type": "Adagrad", "params": {"lr_decay": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-6}}}`,
		`{"optimizer": {"type": "Lion", "params": {"betas": [0.95, 0.98], "weight_decay": 0.1}}}`,
	} {
		c := mustParse(t, text)
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", text, err, out)
		}
		if !reflect.DeepEqual(comparable(c), comparable(back)) || len(back.Warnings) != 0 {
			t.Errorf("%s: round trip:\n%+v\n%+v\n%q", text, comparable(c), comparable(back), back.Warnings)
		}
	}
}
