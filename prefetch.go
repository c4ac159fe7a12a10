package zinf

import (
	"context"
	"fmt"
	"strconv"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// PrefetchTensor starts reading the named tensor's optimizer states (its
// fp32 master and the rule's moments) from NVMe into pinned buffers now,
// while the backward pass is still computing its gradient, so that once
// StepTensor hands the tensor over only the arithmetic that needs the
// gradient and the write-back remain. It suits a tensor whose gradient is
// final last, such as the first layer's embedding table: call it as the
// backward pass of the last micro-step begins, and again at each layer
// after (a call reads ahead only what an earlier one could not). It
// returns how many of the tensor's sub-groups it started
// reading and never waits: it takes only the optimizer's pinned buffers
// that the step's pipeline can spare (keeping one set free for the tensors
// handed over already, whose updates may still be running) and leaves the
// rest, which StepTensor then reads as usual.
//
// The records read are those the update would read: they change only
// when a step commits, and the read belongs to the step in progress. A
// step that is rolled back, aborted or fails gives the buffers back. The
// results are bit for bit those without PrefetchTensor.
//
// Like StepTensor, it opens the step's update if none is open yet (ctx
// then governs it as StepTensor's does). It does nothing and returns 0
// when updates wait for Step (the plan has no room to overlap them, or
// zinf.speculate holds them back), while the last step's update still
// runs under zinf.overlap_update (it never waits for it) or has failed,
// when the tensor was handed over already, and when the optimizer states
// live in pinned memory. It fails
// for a name that is not a tensor of the model and on a runtime opened
// for inference or closed; once the step has failed in the background it
// returns that failure, which Step returns too.
func (r *Runtime) PrefetchTensor(ctx context.Context, name string) (int, error) {
	if err := r.closedErr("prefetch tensor "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return 0, err
	}
	if r.inference {
		return 0, errInference
	}
	if _, ok := r.model.Numel[name]; !ok {
		return 0, fmt.Errorf("zinf: prefetch tensor %q: not a tensor of the model", name)
	}
	if !r.overlap {
		return 0, nil
	}
	if r.txn == nil {
		// Open the step's transaction as its first StepTensor would, so
		// that the reads can start before any gradient is final; not
		// while the last step's update still runs (zinf.overlap_update:
		// that would wait) or failed (StepTensor reports it), nor when
		// updates wait for the norm (zinf.speculate).
		if r.poll() != nil || r.bg != nil || !r.speculate() {
			return 0, nil
		}
		txn, err := r.beginStep(ctx)
		if err != nil {
			return 0, err
		}
		r.txn = txn
	}
	return r.txn.Prefetch(name)
}
