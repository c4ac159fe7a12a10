package optimizer

import (
	"context"

	"golang.org/x/sync/semaphore"
)

// windowUnits is what the largest sub-group of a step counts for in the
// step's windows: the buffer sets in use (BufferCount), the read-ahead and
// the write-behind (PipelineDepth each). A smaller sub-group counts in
// proportion to the pinned block its buffer takes, and at least 1.
//
// Counting sub-groups instead, as the windows did, a model whose large
// weights alternate with small biases and norms (every transformer layer)
// got k sub-groups read ahead and written behind, which is k/2 weights:
// measured with the step timeline (BenchmarkOptimizerVsIO, 1 M-element
// weights and 1 K-element biases), the read-ahead of weight i+1 waited
// for buffers until the write-behind of weight i-1 retired, and the disk
// went idle in between. Weighted, depth 2 keeps two weights and their
// biases in each window. The pinned memory the windows allow is the same
// (PinnedNeedBytes): the blocks in flight add up to at most as many
// largest blocks as the windows hold units of them.
const windowUnits = 1024

// window is a weighted semaphore: Acquire blocks until n units are free.
type window struct{ *semaphore.Weighted }

func newWindow(slots int) window {
	return window{semaphore.NewWeighted(int64(slots) * windowUnits)}
}

// acquire takes n units, or fails when ctx ends first.
func (w window) acquire(ctx context.Context, n int64) error { return w.Acquire(ctx, n) }

// release gives n units back.
func (w window) release(n int64) { w.Release(n) }

// weight is what sg counts for in the step's windows (see windowUnits).
func (r *stepRun) weight(sg *subGroup) int64 {
	if r.maxBlock <= 0 {
		return windowUnits
	}
	b := r.o.sz.block(r.o.sz.slot(sg.off, sg.off+sg.n))
	return max(1, min(windowUnits, (b*windowUnits+r.maxBlock-1)/r.maxBlock))
}

// initWindows sizes the step's windows: the largest block any of its
// sub-groups takes, and the buffer-set window (BufferCount).
func (r *stepRun) initWindows() {
	z := r.o.sz
	for _, sg := range r.sgs {
		r.maxBlock = max(r.maxBlock, z.block(z.slot(sg.off, sg.off+sg.n)))
	}
	r.tokens = newWindow(r.o.opts.BufferCount)
}

// chanCap is the capacity a channel between the step's goroutines needs to
// hold every item a window of k slots admits: k sub-groups of the largest
// size, or up to windowUnits times as many small ones, never more than
// the step has.
func (r *stepRun) chanCap(k int) int { return max(1, min(k*windowUnits, len(r.sgs))) }
