package plan_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/tensor"
)

// TestPredictionCountsCompressedStates: the step a plan predicts moves the
// optimizer states at the size zinf.optimizer_states stores them, the
// parameters in their dtype and no NVMe round trip for the gradients kept
// in pinned memory. Two layers of a 256 x 256 weight (65536 elements:
// 8-bit moments, each 65536 codes + 4 bytes of absmax for each of 256
// blocks = 66560 bytes) and a 256-element bias (under 4096 elements: fp32
// states, 1024 bytes each), k = 1, layer-major, figures by hand:
//
//	fp32, pinned_grads off: read  8 (params, 2 passes) + 4 (grads) + 12 (record) bytes an element
//	                        write 4 (params) + 4 (grads) + 12 (record)
//	bf16, 8-bit, kept:      read  4 (params) + record, write 2 + record,
//	                        the weight's record 4n + 2*66560, the bias's 12m
//
// so that the compact step moves 1323008 + 1059840 bytes where fp32
// moves 3158016 + 2631680 (0.41x). Before the states were sized, the
// planner counted the 8-bit moments as fp32 ones: 782336 bytes more each
// way a step (2 layers x 2 moments x (4 x 65536 - 66560)).
func TestPredictionCountsCompressedStates(t *testing.T) {
	m := plan.LayeredModel(
		[]tensor.Desc{{Name: "l0.w", Shape: []int{256, 256}}, {Name: "l0.b", Shape: []int{256}}},
		[]tensor.Desc{{Name: "l1.w", Shape: []int{256, 256}}, {Name: "l1.b", Shape: []int{256}}},
	)
	make1 := func(mod func(c *config.Config)) *plan.Plan {
		t.Helper()
		cfg := nvmeConfig(filepath.Join(t.TempDir(), "nvme"))
		cfg.ZeroOptimization.SubGroupSize = 65536
		mod(cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		in, err := plan.Check(cfg, m, plan.Given{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := plan.Make(in, measured(t, in, plan.StaticBandwidth(cfg)), plan.Options{ComputePerLayer: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if p.Placement.MicroBatches != 1 || p.Placement.BytesPerTier[tensor.TierNVMe] == 0 {
			t.Fatalf("k = %d, %d bytes on NVMe: the figures are for k = 1 with everything on NVMe", p.Placement.MicroBatches, p.Placement.BytesPerTier[tensor.TierNVMe])
		}
		return p
	}
	fp32 := make1(func(c *config.Config) { c.Zinf.PinnedGrads = config.PinnedGradsOff })
	compact := make1(func(c *config.Config) {
		c.BF16 = true
		c.Zinf.OptimizerStates = "8bit"
		c.Zinf.PinnedGrads = config.PinnedGradsAuto
	})
	if r := compact.Reservations; r.GradKeptElems != r.GradElems {
		t.Fatalf("pinned_grads auto keeps %d of %d gradient elements; the test wants all", r.GradKeptElems, r.GradElems)
	}
	for _, c := range []struct {
		name        string
		p           *plan.Plan
		read, write int64
	}{
		{"fp32", fp32, 2 * 24 * 65792, 2 * 20 * 65792},
		{"bf16 params, 8-bit moments, kept gradients", compact, 1323008, 1059840},
	} {
		pr := c.p.Placement.Predicted
		if pr.NVMeReadBytes != c.read || pr.NVMeWriteBytes != c.write {
			t.Errorf("%s: the plan predicts %d bytes read and %d written a step; want %d and %d", c.name, pr.NVMeReadBytes, pr.NVMeWriteBytes, c.read, c.write)
		}
	}
	if a, b := compact.Placement.Predicted.Total, fp32.Placement.Predicted.Total; a >= b {
		t.Errorf("the compact step is predicted at %v, fp32 at %v: fewer bytes must predict a shorter disk-bound step", a, b)
	}
}

// TestSizeStates: an inventory's optimizer states take their format's
// bytes (the master stays fp32; tensors under 4096 elements and those
// zinf.optimizer_states_fp32 names keep fp32 states), and fp32 states
// leave the inventory as policy.InventoryOf made it.
func TestSizeStates(t *testing.T) {
	descs := []tensor.Desc{{Name: "w", Shape: []int{1000, 10}}, {Name: "b", Shape: []int{100}}, {Name: "embed", Shape: []int{5000}}}
	numel := map[string]int64{"w": 10000, "b": 100, "embed": 5000}
	want := map[string]map[string]int64{
		"fp32": {"w.master": 40000, "w.exp_avg": 40000, "w.exp_avg_sq": 40000, "embed.exp_avg": 20000},
		"bf16": {"w.master": 40000, "w.exp_avg": 20000, "w.exp_avg_sq": 20000, "b.exp_avg": 400, "embed.exp_avg": 20000},
		// 10000 codes and 4 bytes for each of ceil(10000/256) = 40 blocks.
		"8bit": {"w.master": 40000, "w.exp_avg": 10160, "w.exp_avg_sq": 10160, "b.exp_avg_sq": 400, "embed.exp_avg_sq": 20000},
	}
	for format, sizes := range want {
		cfg := config.Default()
		cfg.Zinf.OptimizerStates = config.OptimizerStates(format)
		cfg.Zinf.OptimizerStatesFP32 = []string{"embed"}
		inv := plan.SizeStates(cfg, policy.InventoryOf(descs, numel, tensor.Float32, 1))
		got := map[string]int64{}
		for _, x := range inv {
			got[x.Name] = x.Bytes
		}
		for name, b := range sizes {
			if got[name] != b {
				t.Errorf("%s: %s takes %d bytes; want %d", format, name, got[name], b)
			}
		}
		if got["w"] != 40000 || got["w.grad"] != 40000 {
			t.Errorf("%s: the parameter and gradient changed: %d, %d", format, got["w"], got["w.grad"])
		}
	}
}

// TestSizeStatesByRule: the inventory keeps the states the configured
// rule keeps beside its fp32 master (SGD none, or one with momentum;
// Adagrad and Lion one; Adam two), so a plan's optimizer bytes are
// 4 x (1 + states) an element, as the optimizer's records hold them.
func TestSizeStatesByRule(t *testing.T) {
	descs := []tensor.Desc{{Name: "w", Shape: []int{1000, 10}}}
	numel := map[string]int64{"w": 10000}
	for _, c := range []struct {
		name   string
		set    func(*config.Config)
		states int
	}{
		{"adam", func(*config.Config) {}, 2},
		{"sgd", func(c *config.Config) { c.Optimizer.Type = config.OptimizerSGD; c.Optimizer.Momentum = 0 }, 0},
		{"sgd momentum", func(c *config.Config) { c.Optimizer.Type = config.OptimizerSGD; c.Optimizer.Momentum = 0.9 }, 1},
		{"adagrad", func(c *config.Config) { c.Optimizer.Type = config.OptimizerAdagrad }, 1},
		{"lion", func(c *config.Config) { c.Optimizer.Type = config.OptimizerLion }, 1},
	} {
		cfg := config.Default()
		c.set(cfg)
		var optim int64
		var names []string
		for _, x := range plan.SizeStates(cfg, policy.InventoryOf(descs, numel, tensor.Float32, 1)) {
			if x.Kind == policy.OptimState {
				optim += x.Bytes
				names = append(names, x.Name)
			}
		}
		if want := int64(4 * (1 + c.states) * 10000); optim != want {
			t.Errorf("%s: optimizer states of %d bytes (%v); want %d (the master and %d states)", c.name, optim, names, want, c.states)
		}
	}
}
