package train

import (
	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/swapper"
)

// deviceWritten sums what every rank's swap stores had the NVMe devices
// write (padded device bytes, every path): what an SSD's endurance rating
// is spent by.
func deviceWritten(rts []*zinf.Runtime) int64 {
	var n int64
	for _, rt := range rts {
		for _, s := range []*swapper.Store{rt.ParamStore, rt.GradStore, rt.OptimStore} {
			if s == nil {
				continue
			}
			for _, p := range s.Stats().Paths {
				n += p.BytesWritten
			}
		}
	}
	return n
}

// writtenTracker keeps each step's device bytes written.
type writtenTracker struct {
	rts   []*zinf.Runtime
	last  int64
	steps []float64
}

func newWrittenTracker(rts []*zinf.Runtime) *writtenTracker {
	return &writtenTracker{rts: rts, last: deviceWritten(rts)}
}

// step records the bytes written since the previous call.
func (w *writtenTracker) step() {
	n := deviceWritten(w.rts)
	w.steps = append(w.steps, float64(n-w.last))
	w.last = n
}

// rebase starts the next step's count from now: what was written since
// the last step (a checkpoint) belongs to no step.
func (w *writtenTracker) rebase() { w.last = deviceWritten(w.rts) }

// median is the median step's bytes.
func (w *writtenTracker) median() int64 { return int64(stats.Median(w.steps)) }
