package zinf_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
)

// TestPrefetchTensorBitForBit: reading the first layer's optimizer states
// ahead (PrefetchTensor as the backward pass begins, before any update is
// open, or during the backward of layer 1) leaves
// training bit for bit in-memory Adam's, with and without
// zinf.overlap_update; the reads were issued before the layer was handed
// over, and the step used them (Metrics().Optimizer.Last.Prefetched).
func TestPrefetchTensorBitForBit(t *testing.T) {
	for _, c := range []struct {
		overlapUpdate bool
		at            int // the layer whose backward starts the read-ahead
	}{{false, 1}, {true, 1}, {false, 3}, {true, 3}} {
		overlapUpdate := c.overlapUpdate
		t.Run(fmt.Sprintf("overlap_update=%v/at=%d", overlapUpdate, c.at), func(t *testing.T) {
			const steps = 3
			model, names, numel := overlapModel()
			cfg := config.Default()
			cfg.SetScratchDir(t.TempDir())
			cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
			cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
			cfg.ZeroOptimization.SubGroupSize = 8192 // layer0.w: 5 sub-groups
			cfg.Zinf.OverlapUpdate = overlapUpdate
			cfg.Optimizer.LR = 0.01
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			ref := overlapReference(cfg, names, numel, steps)
			ctx, watch := watchdog(t, 2*time.Minute)
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quiet, NoBandwidthProbe: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rt.Close() })
			watch(rt)
			if !rt.Placement().OverlapStep {
				t.Fatalf("the plan does not overlap the update with the backward pass: %+v", rt.Reservations())
			}
			for _, n := range names {
				if err := rt.Init(ctx, n, overlapInit(n, numel[n])); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := rt.PrefetchTensor(ctx, "nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
				t.Fatalf("PrefetchTensor(unknown) = %v, want an error naming it", err)
			}
			for s := range steps {
				if err := overlapForward(ctx, rt, names, numel, s, ref[s]); err != nil {
					t.Fatal(err)
				}
				rt.Backward()
				var n int
				var handOff time.Time
				for l := len(names) - 1; l >= 0; l-- {
					if err := rt.BeginLayer(ctx, l); err != nil {
						t.Fatal(err)
					}
					if l == c.at {
						// The backward of layer 1 computes while the
						// updates of layers 3 and 2 run: the read-ahead
						// takes the buffers they free. At layer 3 it
						// opens the step's update (after the last one's
						// has landed, with overlap_update).
						for n == 0 {
							k, err := rt.PrefetchTensor(ctx, names[0])
							if err != nil {
								t.Fatal(err)
							}
							n += k
							if err := ctx.Err(); err != nil {
								t.Fatalf("step %d: nothing of %s read ahead: %v", s+1, names[0], err)
							}
							time.Sleep(time.Millisecond)
						}
						k, err := rt.PrefetchTensor(ctx, names[0])
						if err != nil {
							t.Fatal(err)
						}
						n += k
					}
					name := names[l]
					if err := rt.AccumulateGrad(ctx, name, overlapGrad(name, s, numel[name])); err != nil {
						t.Fatal(err)
					}
					if l == 0 {
						handOff = time.Now()
					}
					if err := rt.StepLayer(ctx, l); err != nil {
						t.Fatal(err)
					}
					rt.EndLayer(l)
				}
				if err := rt.Step(ctx); err != nil {
					t.Fatal(err)
				}
				if err := rt.WaitStep(ctx); err != nil {
					t.Fatal(err)
				}
				last := rt.Metrics().Optimizer.Last
				if !last.Committed || last.Prefetched != n {
					t.Fatalf("step %d: committed %v, %d sub-groups prefetched, PrefetchTensor started %d", s+1, last.Committed, last.Prefetched, n)
				}
				ahead := 0
				for _, tm := range last.Timeline {
					if tm.Tensor == names[0] && last.Start.Add(tm.ReadIssued).Before(handOff) {
						ahead++
					}
				}
				if ahead < n {
					t.Fatalf("step %d: %d of %s's record reads issued before its hand-over, want %d", s+1, ahead, names[0], n)
				}
			}
			forwardEquals(ctx, t, rt, names, numel, ref[steps])
		})
	}
}
