package schedule_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/schedule"
)

func mustParse(t *testing.T, text string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLossScalerDynamic(t *testing.T) {
	// Worked by hand from DeepSpeed's rules: window 3, hysteresis 2.
	s, err := schedule.NewLossScaler(schedule.LossScalerOptions{FP16: true, Initial: 16, Window: 3, Hysteresis: 2, Min: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Enabled() || !s.Dynamic() || s.Scale() != 16 {
		t.Fatalf("new scaler: enabled %v dynamic %v scale %v", s.Enabled(), s.Dynamic(), s.Scale())
	}
	seq := []struct {
		overflow bool
		scale    float64
	}{
		{false, 16}, {false, 16}, {false, 16}, // the clean steps before a raise
		{false, 32}, // 3 clean steps before this one: double, hysteresis refilled
		{true, 32},  // first overflow: hysteresis 2 -> 1, no change
		{false, 32}, // not consecutive: a clean step does not refill it
		{true, 16},  // hysteresis used up: halve
		{true, 8},   // and again: still used up
		{false, 8}, {false, 8}, {false, 8},
		{false, 16}, // 3 clean steps since the overflow before this one
		{true, 16},  // refilled by the raise: 2 -> 1
	}
	for i, st := range seq {
		if err := s.Update(st.overflow); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
		if s.Scale() != st.scale {
			t.Fatalf("after update %d (overflow %v): scale %v, want %v (state %+v)", i, st.overflow, s.Scale(), st.scale, s.State())
		}
	}
}

func TestLossScalerConsecutiveHysteresis(t *testing.T) {
	s, err := schedule.NewLossScaler(schedule.LossScalerOptions{FP16: true, Initial: 1024, Window: 100, Hysteresis: 2, Consecutive: true, Min: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range []struct {
		overflow bool
		scale    float64
	}{{true, 1024}, {false, 1024}, {true, 1024}, {true, 512}, {false, 512}, {true, 512}, {true, 256}} {
		if err := s.Update(st.overflow); err != nil || s.Scale() != st.scale {
			t.Fatalf("update %d: err %v, scale %v, want %v", i, err, s.Scale(), st.scale)
		}
	}
}

func TestLossScalerAtMinimum(t *testing.T) {
	s, err := schedule.NewLossScaler(schedule.LossScalerOptions{FP16: true, Initial: 4, Window: 10, Hysteresis: 1, Min: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(true); err != nil || s.Scale() != 2 {
		t.Fatalf("first overflow: %v, scale %v", err, s.Scale())
	}
	before := s.State()
	if err := s.Check(true); !errors.Is(err, schedule.ErrLossScaleAtMinimum) {
		t.Fatalf("Check at the minimum: %v", err)
	}
	if err := s.Update(true); !errors.Is(err, schedule.ErrLossScaleAtMinimum) {
		t.Fatalf("overflow at the minimum: %v", err)
	}
	if s.State() != before {
		t.Fatalf("a refused update changed the state: %+v, was %+v", s.State(), before)
	}
	if err := s.Check(false); err != nil {
		t.Fatal(err)
	}
	// The floor holds a halving that would go below it.
	s, _ = schedule.NewLossScaler(schedule.LossScalerOptions{FP16: true, Initial: 3, Window: 10, Hysteresis: 1, Min: 2})
	if err := s.Update(true); err != nil || s.Scale() != 2 {
		t.Fatalf("halving 3 with floor 2: %v, scale %v", err, s.Scale())
	}
}

func TestLossScalerStaticAndOff(t *testing.T) {
	s, err := schedule.NewLossScalerFromConfig(mustParse(t, `{"fp16": {"enabled": true, "loss_scale": 128}}`))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := s.Update(true); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Enabled() || s.Dynamic() || s.Scale() != 128 {
		t.Fatalf("static: enabled %v dynamic %v scale %v", s.Enabled(), s.Dynamic(), s.Scale())
	}
	s, err = schedule.NewLossScalerFromConfig(mustParse(t, `{"fp16": {"enabled": true, "initial_scale_power": 20}}`))
	if err != nil || s.Scale() != 1<<20 || !s.Dynamic() {
		t.Fatalf("dynamic from config: %v, scale %v", err, s.Scale())
	}
	for _, text := range []string{`{"bf16": {"enabled": true}}`, `{}`} {
		s, err := schedule.NewLossScalerFromConfig(mustParse(t, text))
		if err != nil || s.Enabled() || s.Scale() != 1 || s.Update(true) != nil || s.Scale() != 1 {
			t.Fatalf("%s: %v, enabled %v, scale %v", text, err, s.Enabled(), s.Scale())
		}
	}
	if _, err := schedule.NewLossScaler(schedule.LossScalerOptions{FP16: true, Initial: 0, Window: 0, Hysteresis: 0, Min: -1}); err == nil {
		t.Fatal("invalid options accepted")
	}
}

func TestLossScalerRestore(t *testing.T) {
	s, _ := schedule.NewLossScaler(schedule.LossScalerOptions{FP16: true, Initial: 64, Window: 2, Hysteresis: 2, Min: 1})
	for _, o := range []bool{false, true, false, false, true} {
		_ = s.Update(o)
	}
	st := s.State()
	r, _ := schedule.NewLossScaler(schedule.LossScalerOptions{FP16: true, Initial: 64, Window: 2, Hysteresis: 2, Min: 1})
	if err := r.Restore(st); err != nil {
		t.Fatal(err)
	}
	for _, o := range []bool{false, false, false, true, true, false} {
		_ = s.Update(o)
		_ = r.Update(o)
		if s.State() != r.State() {
			t.Fatalf("restored scaler diverged: %+v vs %+v", r.State(), s.State())
		}
	}
	if err := r.Restore(schedule.ScalerState{Scale: math.Inf(1)}); err == nil {
		t.Fatal("an infinite scale was restored")
	}
}

func TestScheduleEdges(t *testing.T) {
	// No scheduler: the optimizer's rate, every step.
	s, err := schedule.FromConfig(mustParse(t, `{"optimizer": {"params": {"lr": 0.25}}}`), 0)
	if err != nil || s.At(1).LR != 0.25 || s.At(1000).LR != 0.25 {
		t.Fatalf("constant: %v %+v", err, s.At(1))
	}
	// warmup_num_steps 1 acts as 2; step 1 is the constructor's rate.
	s, _ = schedule.FromConfig(mustParse(t, `{"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.3, "warmup_num_steps": 1, "warmup_type": "linear"}}}`), 0)
	for k, want := range map[int]float64{1: 0.1, 2: 0.1, 3: 0.1 + (0.3-0.1)*0.5, 4: 0.1 + (0.3 - 0.1), 9: 0.1 + (0.3 - 0.1)} {
		if got := s.At(k).LR; got != want {
			t.Errorf("WarmupLR step %d: %v, want %v", k, got, want)
		}
	}
	// WarmupCosineLR's first step has rate 0 (DeepSpeed's constructor);
	// past total_num_steps it stays at cos_min_ratio.
	s, _ = schedule.FromConfig(mustParse(t, `{"optimizer": {"params": {"lr": 2}}, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 2, "cos_min_ratio": 0.25}}}`), 0)
	if s.At(1).LR != 0 || s.At(50).LR != 2*0.25 || s.At(12).LR != s.At(500).LR {
		t.Errorf("WarmupCosineLR: step 1 %v, step 50 %v", s.At(1).LR, s.At(50).LR)
	}
	// WarmupDecayLR reaches warmup_min_lr at total_num_steps and stays.
	s, _ = schedule.FromConfig(mustParse(t, `{"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 8, "warmup_num_steps": 2, "warmup_min_lr": 0.5, "warmup_max_lr": 1}}}`), 0)
	if s.At(10).LR != 0.5 || s.At(100).LR != 0.5 || !(s.At(6).LR > 0.5) {
		t.Errorf("WarmupDecayLR: %v %v %v", s.At(6).LR, s.At(10).LR, s.At(100).LR)
	}
	// OneCycle: momentum cycling only for an optimizer with betas; cycle_momentum false turns it off.
	s, _ = schedule.FromConfig(mustParse(t, `{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_first_step_size": 2, "cycle_momentum": false}}}`), 0)
	if v := s.At(3); v.Betas || v.LR != 0.1+(1-0.1)*1 {
		t.Errorf("OneCycle at the peak: %+v", v)
	}
	s, _ = schedule.FromConfig(mustParse(t, `{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_first_step_size": 2}}}`), 0)
	if v := s.At(1); !v.Betas || v.Beta1 != 0.8 || v.Beta2 != 0.99 || v.LR != 0.1 {
		t.Errorf("OneCycle step 1: %+v (DeepSpeed's constructor sets betas (cycle_min_mom, 0.99))", v)
	}
	if v := s.At(3); !v.Betas || v.Beta1 != 0.9-(0.9-0.8)*1 {
		t.Errorf("OneCycle at the peak: %+v", v)
	}
	// total_num_steps "auto" is the run's number of steps.
	auto := mustParse(t, `{"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 2, "warmup_min_lr": 0.5, "warmup_max_lr": 1}}}`)
	if _, err := schedule.FromConfig(auto, 0); err == nil || !strings.Contains(err.Error(), "zinf.Options.TotalSteps") {
		t.Errorf("auto without the run's steps: %v", err)
	}
	s, err = schedule.FromConfig(auto, 8)
	if err != nil || s.At(10).LR != 0.5 || !(s.At(9).LR > 0.5) {
		t.Errorf("auto with 8 steps: %v", err)
	}
	if _, err := schedule.FromConfig(nil, 0); err == nil {
		t.Error("nil config accepted")
	}
}
