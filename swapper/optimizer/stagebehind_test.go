package optimizer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestStageBehindUpdate: with a pipeline, a sub-group's new master is
// staged (RangeSink.StageRange, which converts it to the parameters'
// dtype and starts their write) on a goroutine of its own while the
// update goroutine goes on with the next sub-group, not between the two
// updates: the first StageRange here returns only once the next
// sub-group's update has waited for its gradient. Ranges still arrive in
// ascending order and the step is bit for bit the reference, with the
// 8-bit and fp32 records. Before, StageRange ran on the update goroutine
// and the next update waited for it (the hook timed out).
func TestStageBehindUpdate(t *testing.T) {
	for _, f := range []optimizer.StateFormat{optimizer.FormatFP32, optimizer.FormatBlockwise8} {
		t.Run(f.String(), func(t *testing.T) {
			r := newRig(t, rigConfig{checksums: true, asyncGrads: true, specs: []spec{{"w", 3 * 4096}, {"b", 100}}, seed: 5,
				opts: optimizer.Options{SubGroupSize: 4096, PipelineDepth: 2, StateFormat: f}})
			calls := 0
			var base, overlapped, timedOut int
			r.sink.mu.Lock()
			r.sink.stageErr = func(name string) error {
				if name != "w" {
					return nil
				}
				calls++
				if calls%3 != 1 { // the first range of each step
					return nil
				}
				deadline := time.Now().Add(3 * time.Second)
				for time.Now().Before(deadline) {
					// The step's first gradient wait is w's first
					// sub-group's, the second its next one's.
					if _, waited, _ := r.async.counts(); waited >= base+2 {
						overlapped++
						return nil
					}
					time.Sleep(100 * time.Microsecond)
				}
				timedOut++
				return nil
			}
			r.sink.mu.Unlock()
			var ref *compressedRef
			if f != optimizer.FormatFP32 {
				ref = newCompressedRef(f, r.md)
			}
			for step := 1; step <= 3; step++ {
				_, base, _ = r.async.counts()
				if ref == nil {
					r.mustStep()
					r.check(fmt.Sprintf("step %d", step))
					continue
				}
				g := r.md.grads(step)
				r.grads.set(g)
				p := r.opt.DefaultParams()
				if err := r.opt.StepWith(context.Background(), p); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				ref.step(r.md, g, step, p)
				checkCompressed(t, fmt.Sprintf("step %d", step), r, ref)
			}
			if timedOut > 0 || overlapped != 3 {
				t.Fatalf("the next sub-group's update began while the first range was staged in %d of 3 steps (%d waited 3 s in vain)", overlapped, timedOut)
			}
			if errs := r.rsink.rangeErrors(); len(errs) > 0 {
				t.Fatalf("ranges out of order: %v", errs)
			}
		})
	}
}
