package zgomlx_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// TestReadAheadTables trains the tied zoo transformer with its embedding
// table's optimizer states read ahead of its gradient
// (Options.ReadAheadTables), micro-batch-major and layer-major:
// every loss, variable, master and moment equals in-memory training bit
// for bit, and the steps updated the table from records read before its
// hand-over (the optimizer's Prefetched count).
func TestReadAheadTables(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	c := tiedZooCase(t)
	init := c.store(t, b)
	const k, steps = 2, 2
	for _, sched := range []config.ScheduleMode{config.ScheduleMicroBatchMajor, config.ScheduleLayerMajor} {
		t.Run(string(sched), func(t *testing.T) {
			memStore := clone(t, init)
			mt, err := reference.NewMemoryTrainer(b, memStore, c.net, c.config(t, k, sched), zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer mt.Close()
			opts := c.opts
			opts.ReadAheadTables = true
			tr, err := zgomlx.Create(ctx, b, c.config(t, k, sched), clone(t, init), c.net, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			rt := tr.Offload().Runtime()
			if !rt.Placement().OverlapStep {
				t.Fatal("the plan does not start updates during the backward pass")
			}
			for step := range steps {
				mbs := c.microBatches(step, k)
				want := stepMemory(ctx, t, mt, mbs)
				got, err := tr.StepMicroBatches(ctx, mbs)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				sameLosses(t, fmt.Sprintf("step %d", step), got, want)
			}
			sameModel(ctx, t, string(sched), tr, mt, memStore)
			if n := rt.Metrics().Optimizer.Total.Prefetched; n == 0 {
				t.Fatal("no sub-group of the table was read ahead of its gradient")
			} else {
				t.Logf("%d sub-groups read ahead in %d steps", n, steps)
			}
		})
	}
}

// TestReadAheadTablesOffByDefault trains the same model layer-major
// without Options.ReadAheadTables: nothing of the table is read ahead of
// its gradient (the option, not the schedule, turns it on).
func TestReadAheadTablesOffByDefault(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	c := tiedZooCase(t)
	const k = 2
	tr, err := zgomlx.Create(ctx, b, c.config(t, k, config.ScheduleLayerMajor), c.store(t, b), c.net, c.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	rt := tr.Offload().Runtime()
	if !rt.Placement().OverlapStep {
		t.Fatal("the plan does not start updates during the backward pass")
	}
	if _, err := tr.StepMicroBatches(ctx, c.microBatches(0, k)); err != nil {
		t.Fatal(err)
	}
	if n := rt.Metrics().Optimizer.Total.Prefetched; n != 0 {
		t.Fatalf("%d sub-groups read ahead without Options.ReadAheadTables", n)
	}
}
