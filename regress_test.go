package zinf_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestIssueReproductionsNeverHang replays, through the runtime, the
// configurations that used to hang (issue "The runtime is the system"):
//
//   - a GoMLX-style loop: 1024x1024 fp32 tensors, a 16 MiB pinned pool,
//     prefetch 1, each tensor's update started during backward;
//   - 4 MiB pinned, sub-groups of 16384, one tensor of 400000 fp32
//     elements.
//
// Each either is refused at Open with a PoolTooSmallError naming the
// minimum, or trains; at the minimum it names, it trains bit for bit as in
// memory. A watchdog fails the test, printing the pool's holders, if
// anything waits.
func TestIssueReproductionsNeverHang(t *testing.T) {
	var gomlx [][]tensor.Desc
	for l := range 3 {
		gomlx = append(gomlx, []tensor.Desc{{Name: fmt.Sprintf("l%d.w", l), Shape: []int{1024, 1024}}, {Name: fmt.Sprintf("l%d.b", l), Shape: []int{1024}}})
	}
	cases := []struct {
		name  string
		model zinf.Model
		pool  int64
		tweak func(*config.Config)
		opts  zinf.Options
	}{
		{"gomlx 1024x1024, 16 MiB, prefetch 1, overlap", zinf.LayeredModel(gomlx...), 16 << 20, nil, zinf.Options{PrefetchDepth: 1}},
		{"4 MiB, sub-groups of 16384, 400000 elements", zinf.LayeredModel([]tensor.Desc{{Name: "w", Shape: []int{400_000}}}), 4 << 20,
			func(c *config.Config) { c.ZeroOptimization.SubGroupSize = 16384 }, zinf.Options{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, watch := watchdog(t, 3*time.Minute)
			cfg, _ := testConfig(t)
			if c.tweak != nil {
				c.tweak(cfg)
			}
			cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(c.pool)
			o := c.opts
			o.Logger, o.NoBandwidthProbe = quietLog, true
			rt, err := zinf.Open(cfg, c.model, o)
			if err != nil {
				var small *zinf.PoolTooSmallError
				if !errors.As(err, &small) || small.Need <= c.pool {
					t.Fatalf("Open with %d bytes: %v", c.pool, err)
				}
				t.Logf("refused up front: the minimum is %d bytes", small.Need)
				cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(small.Need)
				if rt, err = zinf.Open(cfg, c.model, o); err != nil {
					t.Fatalf("at the minimum it named: %v", err)
				}
			}
			defer rt.Close()
			watch(rt)
			if !rt.Placement().OverlapStep {
				t.Logf("the plan does not overlap the step here")
			}
			tr := &trainRun{t: t, model: c.model, cfg: cfg, rts: []*zinf.Runtime{rt}, micro: 1, steps: 2}
			tr.run(ctx)
		})
	}
}

// TestPrefetchOverrideAtMinimumPool: Options.PrefetchDepth asks for
// layers to be fetched ahead, but at the minimum pool there is no
// prefetch window: nothing may be fetched ahead, or a prefetched layer
// takes (and fragments) the memory of the layer in use. The metamorphic
// test found the hang (a layer of a thousand tiny tensors and a larger
// one, world 3, pool at the minimum, PrefetchDepth 2).
func TestPrefetchOverrideAtMinimumPool(t *testing.T) {
	var tiny []tensor.Desc
	for i := range 1000 {
		tiny = append(tiny, tensor.Desc{Name: fmt.Sprintf("tiny.%d", i), Shape: []int{1 + i%3}})
	}
	tiny = append(tiny, tensor.Desc{Name: "odd", Shape: []int{5503}})
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "a", Shape: []int{4093, 13}}, {Name: "b", Shape: []int{251}}},
		tiny,
		[]tensor.Desc{{Name: "c", Shape: []int{8191, 7}}},
	)
	cfg, _ := testConfig(t)
	cfg.ZeroOptimization.SubGroupSize = 16384
	plan, err := zinf.PlanModel(t.Context(), cfg, model, zinf.Options{WorldSize: 2, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(plan.Reservations.MinPoolBytes)
	ctx, watch := watchdog(t, 2*time.Minute)
	var rts []*zinf.Runtime
	for r := range 2 {
		rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, Rank: r, WorldSize: 2, PrefetchDepth: 2, NoBandwidthProbe: true})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		watch(rt)
		rts = append(rts, rt)
	}
	tr := &trainRun{t: t, model: model, cfg: cfg, rts: rts, micro: 2, steps: 2}
	tr.run(ctx)
	// Rank 0 holds the largest partitions: the pool is its minimum (rank
	// 1's is smaller, so it has a window and prefetches).
	if w := rts[0].Reservations().PrefetchBytes; w != 0 {
		t.Fatalf("rank 0 at its minimum pool has a %d-byte prefetch window", w)
	}
	if s := rts[0].Metrics().Schedule; s.Prefetches != 0 || s.PeakPrefetchedBytes != 0 {
		t.Errorf("rank 0 prefetched %d layers (%d bytes at most) with no prefetch window", s.Prefetches, s.PeakPrefetchedBytes)
	}
}
