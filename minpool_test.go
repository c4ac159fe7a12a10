package zinf_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestTrainAtPlannedMinimumPool: the minimum pool PlanModel reports (what
// `zinf plan` prints), without opening anything, is the one Open enforces:
// a config with exactly that pool trains, with micro-steps and the step
// overlapping backward, bit for bit as in memory, on every rank; one
// granule (the pool's block) below it is refused up front with a
// PoolTooSmallError naming the minimum.
func TestTrainAtPlannedMinimumPool(t *testing.T) {
	cases := []struct {
		name  string
		model zinf.Model
		world int
		tweak func(*config.Config)
	}{
		{"one large tensor", zinf.LayeredModel([]tensor.Desc{{Name: "w", Shape: []int{700_001}}}), 1, nil},
		{"layers, bf16, world 3", zinf.LayeredModel(
			[]tensor.Desc{{Name: "a.w", Shape: []int{509, 251}}, {Name: "a.b", Shape: []int{509}}},
			[]tensor.Desc{{Name: "b.w", Shape: []int{251, 509}}, {Name: "b.b", Shape: []int{3}}},
			[]tensor.Desc{{Name: "c.w", Shape: []int{127, 61}}},
		), 3, func(c *config.Config) { c.BF16 = true; c.Zinf.PipelineDepth = 2 }},
		{"optimizer on cpu, fp16, world 2", zinf.LayeredModel(
			[]tensor.Desc{{Name: "x", Shape: []int{8191}}, {Name: "y", Shape: []int{2039, 13}}},
			[]tensor.Desc{{Name: "z", Shape: []int{1021}}},
		), 2, func(c *config.Config) {
			c.FP16 = true
			c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
		}},
		{"sub-groups, no checksums", zinf.LayeredModel(
			[]tensor.Desc{{Name: "e", Shape: []int{4093, 31}}},
			[]tensor.Desc{{Name: "f", Shape: []int{100_003}}},
		), 1, func(c *config.Config) { c.Zinf.Checksums = false; c.ZeroOptimization.SubGroupSize = 10_007 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, _ := testConfig(t)
			cfg.ZeroOptimization.SubGroupSize = 16_384
			cfg.GradientAccumulationSteps = 2
			if c.tweak != nil {
				c.tweak(cfg)
			}
			plan, err := zinf.PlanModel(context.Background(), cfg, c.model, zinf.Options{WorldSize: c.world, NoBandwidthProbe: true})
			if err != nil {
				t.Fatal(err)
			}
			minPool, granule := plan.Reservations.MinPoolBytes, plan.Reservations.GranuleBytes
			t.Logf("planned minimum pool %d bytes (granule %d)", minPool, granule)

			cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(minPool - granule)
			_, err = zinf.Open(cfg, c.model, zinf.Options{Logger: quietLog, WorldSize: c.world, NoBandwidthProbe: true})
			var small *zinf.PoolTooSmallError
			if !errors.As(err, &small) || small.Need != minPool {
				t.Fatalf("one block below the planned minimum: %v (want a PoolTooSmallError naming %d)", err, minPool)
			}

			cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(minPool)
			ctx, watch := watchdog(t, 2*time.Minute)
			comms, err := comm.NewLocal(c.world, comm.LocalOptions{StallTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			var rts []*zinf.Runtime
			for r := range c.world {
				rt, err := zinf.Open(cfg, c.model, zinf.Options{Logger: quietLog, Rank: r, WorldSize: c.world, Comm: comms[r], NoBandwidthProbe: true})
				if err != nil {
					t.Fatalf("rank %d at the planned minimum %d: %v", r, minPool, err)
				}
				defer rt.Close()
				watch(rt)
				if r == 0 && rt.Reservations().MinPoolBytes != minPool {
					t.Fatalf("Open's minimum %d, the plan's %d", rt.Reservations().MinPoolBytes, minPool)
				}
				rts = append(rts, rt)
			}
			tr := &trainRun{t: t, rng: rand.New(rand.NewPCG(7, 7)), model: c.model, cfg: cfg, rts: rts, comms: comms, micro: 2, steps: 3}
			tr.run(ctx)
			if !t.Failed() {
				t.Logf("trained %d steps at the planned minimum pool", tr.steps)
			}
		})
	}
}

// TestLargestTensorEightSubGroupsRuntime: through the runtime, a model
// whose largest tensor is 8x the optimizer's sub-group trains bit for bit
// in a pool smaller than 3x that tensor's fp32 bytes: the planned minimum,
// with bf16 parameters and the unpipelined optimizer. What the pool must
// still hold whole is the parameter in use, its staged update and the
// gradient written behind; the optimizer holds one sub-group's record and
// gradient slice. (swapper/optimizer's TestLargestTensorEightSubGroups
// shows the optimizer's and gradients' part alone.)
func TestLargestTensorEightSubGroupsRuntime(t *testing.T) {
	// A sub-group's record and gradient slice (16 bytes per element, plus
	// the record's stagger) fill most of a 1 MiB pool block.
	const sg = 62000
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "big", Shape: []int{8 * sg}}},
		[]tensor.Desc{{Name: "mid", Shape: []int{3*sg + 5}}, {Name: "bias", Shape: []int{7}}},
	)
	largest := int64(4 * 8 * sg)
	cfg, _ := testConfig(t)
	cfg.BF16 = true
	cfg.Zinf.PipelineDepth = 0
	cfg.Zinf.Checksums = false // checked reads widen a sub-group's gradient slice to whole 1 MiB stripes
	cfg.ZeroOptimization.SubGroupSize = sg
	plan, err := zinf.PlanModel(context.Background(), cfg, model, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	r := plan.Reservations
	t.Logf("largest tensor %d bytes (fp32); minimum pool %d bytes = %.2fx: params in use %d, staged %d, gradients %d, optimizer %d",
		largest, r.MinPoolBytes, float64(r.MinPoolBytes)/float64(largest), r.ParamDemandBytes, r.ParamStageBytes, r.GradBytes, r.OptimizerBytes)
	if r.MinPoolBytes >= 3*largest {
		t.Fatalf("minimum pool %d is not below 3x the largest tensor (%d)", r.MinPoolBytes, 3*largest)
	}
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(r.MinPoolBytes)
	ctx, watch := watchdog(t, 2*time.Minute)
	rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	tr := &trainRun{t: t, rng: rand.New(rand.NewPCG(8, 8)), model: model, cfg: cfg, rts: []*zinf.Runtime{rt}, micro: 2, steps: 3}
	tr.run(ctx)
	m := rt.Metrics()
	t.Logf("pinned peak %d of %d bytes (%.2fx the largest tensor)", m.PinnedPeakBytes, m.PinnedBytes, float64(m.PinnedPeakBytes)/float64(largest))
}
