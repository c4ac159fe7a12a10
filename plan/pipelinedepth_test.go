package plan_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

// TestAutoPipelineDepth: under zinf.pipeline_depth "auto" (the default)
// a model of small sub-groups gets the depth that keeps
// aio.queue_depth x aio.block_size of them in flight each way, with the
// 2*depth+1 buffer sets it needs reserved and a note saying so; a pool
// with less room gets a shallower one, spending at most a sixteenth of
// itself on it and the minimum pool stays the configured depth's; a
// number is kept as given; states in pinned memory and sub-groups of
// that size or more keep depth 1 and no note.
func TestAutoPipelineDepth(t *testing.T) {
	mk := func(t *testing.T, m plan.Model, pool int64, sg int64, depth any) *plan.Plan {
		t.Helper()
		cfg := nvmeConfig(filepath.Join(t.TempDir(), "nvme"))
		cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
		cfg.ZeroOptimization.SubGroupSize = sg
		if d, ok := depth.(int); ok {
			cfg.Zinf.PipelineDepth, cfg.Zinf.PipelineDepthAuto = d, false
		}
		in, err := plan.Check(cfg, m, plan.Given{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := plan.Make(in, measured(t, in, plan.StaticBandwidth(cfg)), plan.Options{ComputePerLayer: 2 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	note := func(p *plan.Plan) string {
		for _, n := range p.Placement.Notes {
			if strings.Contains(n, `zinf.pipeline_depth "auto"`) {
				return n
			}
		}
		return ""
	}
	target := plan.AutoPipelineBytes(config.Default())
	if target != 8<<20 {
		t.Fatalf("the default config's target %d bytes, want aio.queue_depth 8 x block_size 1 MiB", target)
	}

	const sg = 40_009 // records of 480 KB
	// 40 sub-groups: more than any depth's buffer sets.
	var layers [][]tensor.Desc
	for l := range 20 {
		layers = append(layers, []tensor.Desc{{Name: fmt.Sprintf("l%d.w", l), Shape: []int{283, 283}}})
	}
	model := plan.LayeredModel(layers...)
	fixed := mk(t, model, 1<<30, sg, 1)
	if o := fixed.Components.Optimizer; o.PipelineDepth != 1 || o.BufferCount != 4 || note(fixed) != "" {
		t.Fatalf("pipeline_depth 1: depth %d, %d buffer sets, note %q; want 1, the config's 4, none", o.PipelineDepth, o.BufferCount, note(fixed))
	}
	// With a pool of room: the full depth. The optimizer's reservation is
	// its buffer sets' blocks (the records are on NVMe): at depth 1, 3.
	block := fixed.Reservations.OptimizerBytes / 3
	roomy := mk(t, model, 1<<30, sg, "auto")
	o := roomy.Components.Optimizer
	want := int(min(16, max(1, (target+block-1)/block)))
	if o.PipelineDepth != want || want <= 1 || o.BufferCount != 2*want+1 || block*int64(o.BufferCount) != roomy.Reservations.OptimizerBytes {
		t.Fatalf("auto, a 1 GiB pool: depth %d, %d buffer sets, optimizer reservation %d (block %d); want depth %d > 1 and %d sets",
			o.PipelineDepth, o.BufferCount, roomy.Reservations.OptimizerBytes, block, want, 2*want+1)
	}
	if n := note(roomy); !strings.Contains(n, fmt.Sprintf("depth %d rather than 1", want)) || !strings.Contains(n, fmt.Sprintf("%d buffer sets", 2*want+1)) {
		t.Errorf("auto's note %q: want the depth and the buffer sets", n)
	}
	if roomy.Reservations.OptimizerBytes <= fixed.Reservations.OptimizerBytes {
		t.Errorf("auto reserves %d bytes for the optimizer, depth 1 %d: want more", roomy.Reservations.OptimizerBytes, fixed.Reservations.OptimizerBytes)
	}

	// A 64 MiB pool: at most 4 MiB more for the pipeline.
	const small = 64 << 20
	tight := mk(t, model, small, sg, "auto")
	base := mk(t, model, small, sg, 1)
	ot := tight.Components.Optimizer
	extra := tight.Reservations.OptimizerBytes - base.Reservations.OptimizerBytes
	if tight.Reservations.MinPoolBytes != base.Reservations.MinPoolBytes || roomy.Reservations.MinPoolBytes != fixed.Reservations.MinPoolBytes {
		t.Errorf("minimum pools: auto %d / %d, depth 1 %d / %d; want the same", tight.Reservations.MinPoolBytes, roomy.Reservations.MinPoolBytes, base.Reservations.MinPoolBytes, fixed.Reservations.MinPoolBytes)
	}
	if ot.PipelineDepth >= want || ot.PipelineDepth < 1 || extra > small/16 || tight.Reservations.MinPoolBytes > small {
		t.Fatalf("auto, a 64 MiB pool: depth %d (%d with room), %d bytes more than depth 1 (at most %d), minimum pool %d", ot.PipelineDepth, want, extra, small/16, tight.Reservations.MinPoolBytes)
	}
	t.Logf("sub-groups of %d elements, blocks of %d bytes: depth %d with room, %d in a 64 MiB pool (%d bytes more than depth 1)", sg, block, want, ot.PipelineDepth, extra)
	if ot.PipelineDepth > 1 {
		if n := note(tight); !strings.Contains(n, fmt.Sprintf("has room for %d", ot.PipelineDepth)) {
			t.Errorf("auto in a small pool: note %q, want it to say what the pool had room for", n)
		}
	}

	// States in pinned memory: a step moves no records; the depth stays.
	cpuCfg := nvmeConfig(filepath.Join(t.TempDir(), "nvme"))
	cpuCfg.Zinf.Tiers.CPUPinnedBytes = 1 << 30
	cpuCfg.ZeroOptimization.SubGroupSize = sg
	cpuCfg.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
	in, err := plan.Check(cpuCfg, model, plan.Given{})
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := plan.Make(in, measured(t, in, plan.StaticBandwidth(cpuCfg)), plan.Options{ComputePerLayer: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if oc := cpu.Components.Optimizer; oc.PipelineDepth != 1 || note(cpu) != "" {
		t.Errorf("states in pinned memory: depth %d, note %q; want 1 and none", oc.PipelineDepth, note(cpu))
	}

	// Large sub-groups keep depth 1.
	bigModel := plan.LayeredModel([]tensor.Desc{{Name: "w0", Shape: []int{2048, 2048}}}, []tensor.Desc{{Name: "w1", Shape: []int{2048, 2048}}})
	large := mk(t, bigModel, 1<<30, 1<<20, "auto")
	if ol := large.Components.Optimizer; ol.PipelineDepth != 1 || note(large) != "" {
		t.Errorf("sub-groups of 1 Mi elements: depth %d, note %q; want 1 and none", ol.PipelineDepth, note(large))
	}
}
