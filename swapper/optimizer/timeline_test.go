package optimizer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestStepTimeline checks the per-sub-group timeline a step records
// (StepStats.Timeline) against what the step did: one entry per
// sub-group, each naming its tensor and index once, with the bytes it
// moved, stages in pipeline order, everything within the step's elapsed
// time, and IOGaps no longer than the span of the step's I/O. With states
// in pinned memory there is no record read or write to time.
func TestStepTimeline(t *testing.T) {
	for _, memory := range []bool{false, true} {
		for _, depth := range []int{0, 2} {
			t.Run(fmt.Sprintf("memory=%v/depth=%d", memory, depth), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: memory, specs: mixed, seed: 7,
					opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth}})
				r.mustStep()
				before := time.Now()
				r.mustStep()
				after := time.Now()
				st := r.opt.Stats()
				last := st.Last
				if st.Total.Timeline != nil {
					t.Error("Total has a timeline; only Last should")
				}
				// Start is when the last step began; its offsets count from it.
				if last.Start.Before(before) || last.Start.After(after) || !st.Total.Start.IsZero() {
					t.Errorf("Last.Start %v outside the step's call [%v, %v], or Total has one (%v)", last.Start, before, after, st.Total.Start)
				}
				if len(last.Timeline) != r.subGroups() {
					t.Fatalf("%d timeline entries, %d sub-groups", len(last.Timeline), r.subGroups())
				}
				seen := map[string]bool{}
				var firstIO, lastIO time.Duration = -1, 0
				for i, tm := range last.Timeline {
					key := fmt.Sprintf("%s/%d", tm.Tensor, tm.SubGroup)
					if seen[key] {
						t.Fatalf("%s appears twice", key)
					}
					seen[key] = true
					if i > 0 && tm.Ahead < last.Timeline[i-1].Ahead {
						t.Fatalf("entry %d (%s) is out of read-ahead order", i, key)
					}
					n := int64(0)
					for _, s := range mixed {
						if s.name == tm.Tensor {
							n = int64(min(1000, s.n-1000*tm.SubGroup))
						}
					}
					if n <= 0 || tm.GradBytes != 4*n {
						t.Fatalf("%s: gradient bytes %d, want %d", key, tm.GradBytes, 4*n)
					}
					order := []struct {
						name string
						at   time.Duration
					}{{"ahead", tm.Ahead}, {"buffered", tm.Buffered}, {"read issued", tm.ReadIssued}, {"gradient read", tm.GradRead},
						{"picked", tm.Picked}, {"updated", tm.Updated}, {"write issued", tm.WriteIssued}, {"write done", tm.WriteDone},
						{"retired", tm.Retired}}
					if memory {
						if tm.RecordBytes != 0 || tm.ReadIssued != 0 || tm.ReadDone != 0 || tm.WriteIssued != 0 || tm.WriteDone != 0 {
							t.Fatalf("%s: record I/O timed with states in memory: %+v", key, tm)
						}
						order = append(order[:2], order[3:6]...)
						order = append(order, struct {
							name string
							at   time.Duration
						}{"retired", tm.Retired})
					} else {
						if tm.RecordBytes != 12*n {
							t.Fatalf("%s: record bytes %d, want %d", key, tm.RecordBytes, 12*n)
						}
						if tm.ReadDone < tm.ReadIssued || tm.ReadDone > tm.Updated {
							t.Fatalf("%s: record read done at %v, issued at %v, updated at %v", key, tm.ReadDone, tm.ReadIssued, tm.Updated)
						}
						if firstIO < 0 || tm.ReadIssued < firstIO {
							firstIO = tm.ReadIssued
						}
						lastIO = max(lastIO, tm.WriteDone)
					}
					for j := 1; j < len(order); j++ {
						if order[j].at < order[j-1].at || order[j-1].at <= 0 {
							t.Fatalf("%s: %s at %v is before %s at %v (or a stage was not reached)", key, order[j].name, order[j].at, order[j-1].name, order[j-1].at)
						}
					}
					if tm.Retired > last.Elapsed {
						t.Fatalf("%s retired at %v, after the step's %v", key, tm.Retired, last.Elapsed)
					}
				}
				if last.IOGaps < 0 || (!memory && last.IOGaps > lastIO-firstIO) || (memory && last.IOGaps != 0) {
					t.Fatalf("IOGaps %v outside [0, %v]", last.IOGaps, lastIO-firstIO)
				}
				if st.Total.IOGaps < last.IOGaps {
					t.Fatalf("Total.IOGaps %v below the last step's %v", st.Total.IOGaps, last.IOGaps)
				}
			})
		}
	}
}
