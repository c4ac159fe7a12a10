package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestVisitStates: a visit gives every sub-group once, in order, with the
// states ReadStates copies (bit for bit, from NVMe or pinned memory), holds
// no copy of the tensor on the heap, stops at fn's error and returns it,
// and refuses an unknown tensor and a closed optimizer.
func TestVisitStates(t *testing.T) {
	for _, memory := range []bool{false, true} {
		t.Run(fmt.Sprintf("memory=%v", memory), func(t *testing.T) {
			specs := []spec{{"big", 200_000}, {"odd", 2501}}
			r := newRig(t, rigConfig{memory: memory, specs: specs, seed: 3, poolBytes: 32 << 20,
				opts: optimizer.Options{SubGroupSize: 50_000, PipelineDepth: 1}})
			for range 2 {
				r.mustStep()
			}
			ctx := context.Background()
			for _, s := range specs {
				master, states, err := r.opt.ReadStates(ctx, s.name)
				if err != nil {
					t.Fatal(err)
				}
				next, calls := 0, 0
				err = r.opt.VisitStates(ctx, s.name, func(off int, m []float32, st [][]float32) error {
					calls++
					if off != next || len(m) == 0 || len(m) > 50_000 || len(st) != len(states) {
						return fmt.Errorf("sub-group at %d of %d elements (%d states); want offset %d", off, len(m), len(st), next)
					}
					for i := range m {
						if math.Float32bits(m[i]) != math.Float32bits(master[off+i]) {
							return fmt.Errorf("master[%d] differs", off+i)
						}
						for k := range st {
							if math.Float32bits(st[k][i]) != math.Float32bits(states[k][off+i]) {
								return fmt.Errorf("state %d [%d] differs", k, off+i)
							}
						}
					}
					next = off + len(m)
					return nil
				})
				if err != nil || next != s.n || calls != (s.n+49_999)/50_000 {
					t.Fatalf("%s: %v; visited %d of %d elements in %d calls", s.name, err, next, s.n, calls)
				}
			}
			// No heap copy of the tensor: far less allocated than its states.
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			if err := r.opt.VisitStates(ctx, "big", func(int, []float32, [][]float32) error { return nil }); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			if got := after.TotalAlloc - before.TotalAlloc; got > 200_000*4/8 {
				t.Fatalf("a visit of 200000 elements allocated %d bytes on the heap", got)
			}
			stop := errors.New("enough")
			calls := 0
			if err := r.opt.VisitStates(ctx, "big", func(int, []float32, [][]float32) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
				t.Fatalf("fn's error: %v after %d calls", err, calls)
			}
			if err := r.opt.VisitStates(ctx, "nope", func(int, []float32, [][]float32) error { return nil }); !errors.Is(err, optimizer.ErrNotRegistered) {
				t.Fatalf("unknown tensor: %v", err)
			}
			r.opt.Close()
			if err := r.opt.VisitStates(ctx, "big", func(int, []float32, [][]float32) error { return nil }); !errors.Is(err, optimizer.ErrClosed) {
				t.Fatalf("closed: %v", err)
			}
			if _, _, err := r.opt.ReadStates(ctx, "big"); !errors.Is(err, optimizer.ErrClosed) {
				t.Fatalf("ReadStates closed: %v", err)
			}
		})
	}
}
