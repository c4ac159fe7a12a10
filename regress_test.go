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
			if !rt.Plan().OverlapStep {
				t.Logf("the plan does not overlap the step here")
			}
			tr := &trainRun{t: t, model: c.model, cfg: cfg, rts: []*zinf.Runtime{rt}, micro: 1, steps: 2}
			tr.run(ctx)
		})
	}
}
