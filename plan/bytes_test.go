package plan_test

import (
	"math"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestStepBytesPerParam: the bytes per parameter per step that zinf plan
// prints, for parameters and optimizer states on NVMe: fp32 everything
// is the 44 (parameters read twice and written once, the gradient
// written and read back, 12 bytes of record read and written); 8-bit
// moments save 2*(8 - 2*(1 + 4/256)) = 11.9375 of them; bf16 parameters
// halve the parameter bytes; micro-batch-major multiplies the parameter
// reads and gradient trips by the micro-batches; tiers in memory move
// nothing. Gradients kept in pinned memory (zinf.pinned_grads) drop their
// write-behind and read-back, 8 bytes per parameter per trip: all of them
// take fp32 from 44 to 36 and bf16 parameters with 8-bit moments to
// 14 + 2*(4 + 2*(1 + 4/256)), the fraction kept in proportion.
func TestStepBytesPerParam(t *testing.T) {
	nvme := func(mod func(c *config.Config)) *config.Config {
		c := config.Default()
		c.ZeroOptimization.OffloadParam.Device = config.OffloadNVMe
		c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadNVMe
		if mod != nil {
			mod(c)
		}
		return c
	}
	for _, c := range []struct {
		name     string
		cfg      *config.Config
		f        optimizer.StateFormat
		micro    int
		schedule string
		kept     float64
		want     float64
	}{
		{"fp32", nvme(nil), optimizer.FormatFP32, 1, policy.ScheduleLayerMajor, 0, 44},
		{"8bit", nvme(nil), optimizer.FormatBlockwise8, 1, policy.ScheduleLayerMajor, 0, 44 - 2*(8-2*(1+4.0/256))},
		{"bf16 states", nvme(nil), optimizer.FormatBF16, 1, policy.ScheduleLayerMajor, 0, 44 - 2*4},
		{"bf16 params, 8bit", nvme(func(c *config.Config) { c.BF16 = true }), optimizer.FormatBlockwise8, 1, policy.ScheduleLayerMajor, 0, 6 + 8 + 2*(4+2*(1+4.0/256))},
		{"layer-major k=8", nvme(nil), optimizer.FormatFP32, 8, policy.ScheduleLayerMajor, 0, 44},
		{"micro-batch-major k=8", nvme(nil), optimizer.FormatFP32, 8, policy.ScheduleMicroBatchMajor, 0, 2*8*4 + 4 + 2*8*4 + 24},
		{"optimizer on cpu", nvme(func(c *config.Config) { c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU }), optimizer.FormatBlockwise8, 1, policy.ScheduleLayerMajor, 0, 12},
		{"nothing on nvme", nvme(func(c *config.Config) {
			c.ZeroOptimization.OffloadParam.Device = config.OffloadNone
			c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
		}), optimizer.FormatFP32, 1, policy.ScheduleLayerMajor, 0, 0},
		{"fp32, grads pinned", nvme(nil), optimizer.FormatFP32, 1, policy.ScheduleLayerMajor, 1, 36},
		{"bf16 params, 8bit, grads pinned", nvme(func(c *config.Config) { c.BF16 = true }), optimizer.FormatBlockwise8, 1, policy.ScheduleLayerMajor, 1, 6 + 2*(4+2*(1+4.0/256))},
		{"micro-batch-major k=8, a quarter pinned", nvme(nil), optimizer.FormatFP32, 8, policy.ScheduleMicroBatchMajor, 0.25, 2*8*4 + 4 + 0.75*2*8*4 + 24},
		{"optimizer on cpu, grads pinned", nvme(func(c *config.Config) { c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU }), optimizer.FormatFP32, 1, policy.ScheduleLayerMajor, 1, 12},
	} {
		got := plan.StepBytesPerParam(c.cfg, c.f, c.micro, c.schedule).KeepGrads(c.kept).Total()
		if math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: %.6f bytes per parameter per step, want %.6f", c.name, got, c.want)
		}
	}
}

// TestStateFormatOfConfig: zinf.optimizer_states reaches the optimizer's
// options, and with 8-bit states the sub-group size is rounded down to a
// whole number of blocks (at least one); zinf plan's lines name both
// configurations.
func TestStateFormatOfConfig(t *testing.T) {
	c, err := config.Parse([]byte(`{"zero_optimization": {"stage": 3, "sub_group_size": 1000000, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}},
		"zinf": {"optimizer_states": "8bit"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if f := plan.StateFormatOf(c); f != optimizer.FormatBlockwise8 {
		t.Fatalf("StateFormatOf: %v", f)
	}
	if n := plan.SubGroupSizeOf(c); n != 999936 {
		t.Errorf("SubGroupSizeOf: %d, want 999936 (1000000 rounded down to a multiple of 256)", n)
	}
	c.ZeroOptimization.SubGroupSize = 100
	if n := plan.SubGroupSizeOf(c); n != 256 {
		t.Errorf("SubGroupSizeOf(100): %d, want 256", n)
	}
	c.Zinf.OptimizerStatesFP32 = []string{"*embed*"}
	s := plan.SettingsOf(c)
	if s.Optimizer.StateFormat != optimizer.FormatBlockwise8 || s.Optimizer.SubGroupSize != 256 || s.Optimizer.StateFormatFor == nil {
		t.Fatalf("SettingsOf: optimizer format %v, sub-group %d", s.Optimizer.StateFormat, s.Optimizer.SubGroupSize)
	}
	for _, x := range []struct {
		name  string
		elems int
		want  optimizer.StateFormat
	}{{"l0.w", 1 << 20, optimizer.FormatBlockwise8}, {"tok_embed.w", 1 << 20, optimizer.FormatFP32}, {"l0.b", 4095, optimizer.FormatFP32}} {
		if f := s.Optimizer.StateFormatFor(x.name, x.elems); f != x.want {
			t.Errorf("StateFormatFor(%s, %d) = %v, want %v", x.name, x.elems, f, x.want)
		}
	}
	var b strings.Builder
	plan.WriteStepBytes(&b, c, &policy.Placement{Schedule: policy.ScheduleLayerMajor, MicroBatches: 1})
	out := b.String()
	for _, want := range []string{"nvme bytes per parameter per step", "optimizer states 8bit:", "20.06", "layer-major, k=1", "optimizer states fp32:", "32.00"} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteStepBytes lacks %q:\n%s", want, out)
		}
	}
}
