package zinf_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestPlanTellsOverrides: rt.Placement() says what the runtime does, not what
// the planner would have done: Options.PrefetchDepth -1 turns prefetching
// off, 2 and 3 set the depth (capped at the layers there are), a pool at
// its minimum leaves no prefetch window, SerialStep stops the step
// overlapping backward; each with a note saying why, and the predicted
// step follows the depth.
func TestPlanTellsOverrides(t *testing.T) {
	var layers [][]tensor.Desc
	for l := range 5 {
		layers = append(layers, []tensor.Desc{{Name: "l" + string(rune('0'+l)) + ".w", Shape: []int{64, 1024}}})
	}
	model := zinf.LayeredModel(layers...)
	open := func(t *testing.T, pool int64, opts zinf.Options) *zinf.Runtime {
		t.Helper()
		cfg, _ := testConfig(t)
		cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
		// The disk's figures are the config's: not whatever bandwidth an
		// earlier test of this process measured on the filesystem (the
		// planner memoizes it), so the plans compared are of one disk.
		// (At read bandwidths below about 1 GB/s the shared-disk model
		// predicts a deeper window exposing more: the fetches it queues
		// early delay the gradient writes: a limit of that model, not what
		// this test is about.)
		cfg.Zinf.Bandwidth.ReadBytesPerSec, cfg.Zinf.Bandwidth.WriteBytesPerSec = 2e9, 2e9
		opts.Logger, opts.NoBandwidthProbe, opts.ComputePerLayer = quietLog, true, time.Millisecond
		rt, err := zinf.Open(cfg, model, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	base := open(t, 64<<20, zinf.Options{})
	planned := base.Placement()
	if planned.PrefetchDepth < 1 || !planned.OverlapStep {
		t.Fatalf("the plain runtime's plan: prefetch %d, overlap %v (want prefetch >= 1, overlap: the test needs both to change them)", planned.PrefetchDepth, planned.OverlapStep)
	}
	hasNote := func(notes []string, sub string) bool {
		for _, n := range notes {
			if strings.Contains(n, sub) {
				return true
			}
		}
		return false
	}
	cases := []struct {
		name      string
		pool      int64
		opts      zinf.Options
		depth     int
		overlap   bool
		depthNote string
	}{
		{"prefetch off", 64 << 20, zinf.Options{PrefetchDepth: -1}, 0, true, "PrefetchDepth -1"},
		{"prefetch 2", 64 << 20, zinf.Options{PrefetchDepth: 2}, 2, true, "PrefetchDepth 2"},
		{"prefetch 3", 64 << 20, zinf.Options{PrefetchDepth: 3}, 3, true, "PrefetchDepth 3"},
		{"prefetch 9 capped", 64 << 20, zinf.Options{PrefetchDepth: 9}, 4, true, "PrefetchDepth 9"},
		{"serial step", 64 << 20, zinf.Options{SerialStep: true}, planned.PrefetchDepth, false, ""},
		{"minimum pool", base.Reservations().MinPoolBytes, zinf.Options{}, 0, true, "minimum"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt := open(t, c.pool, c.opts)
			p := rt.Placement()
			if p.PrefetchDepth != c.depth || p.OverlapStep != c.overlap {
				t.Fatalf("Placement(): prefetch %d, overlap %v; want %d, %v (notes %q)", p.PrefetchDepth, p.OverlapStep, c.depth, c.overlap, p.Notes)
			}
			if c.depthNote != "" && c.depth != planned.PrefetchDepth && !hasNote(p.Notes, c.depthNote) {
				t.Errorf("no note naming %q: %q", c.depthNote, p.Notes)
			}
			if !c.overlap && !hasNote(p.Notes, "SerialStep") {
				t.Errorf("no note naming SerialStep: %q", p.Notes)
			}
			if c.depth == 0 && (p.Predicted.ExposedParamIO <= planned.Predicted.ExposedParamIO || p.Predicted.Total <= planned.Predicted.Total) {
				t.Errorf("no prefetch, yet the prediction exposes %v of parameter I/O (step %v), the planned depth %d %v (step %v)",
					p.Predicted.ExposedParamIO, p.Predicted.Total, planned.PrefetchDepth, planned.Predicted.ExposedParamIO, planned.Predicted.Total)
			}
			if c.depth > planned.PrefetchDepth && p.Predicted.ExposedParamIO > planned.Predicted.ExposedParamIO {
				t.Errorf("prefetch %d predicts more exposed parameter I/O (%v) than the planned %d (%v)", c.depth, p.Predicted.ExposedParamIO, planned.PrefetchDepth, planned.Predicted.ExposedParamIO)
			}
			if base.Placement() != planned || planned.PrefetchDepth != base.Placement().PrefetchDepth {
				t.Fatal("the plain runtime's plan changed")
			}
		})
	}
}
