package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
)

// backend is where the model's state lives: fully in memory (the
// reference) or in zinf runtimes (one per simulated rank). The training
// arithmetic is in the shared loop below, so the two runs differ only in
// how tensors are stored and moved: equal results prove the moving lossless.
type backend interface {
	// beginLayer makes layer l's parameters available (a barrier: waits for
	// their swap-in, prefetching what comes next) for k micro-batches: the
	// loop hands each of the layer's gradients k times before endLayer
	// (layer-major), or once (k = 1).
	beginLayer(ctx context.Context, l, k int) error
	// gather writes the full compute values of a parameter (in the param
	// dtype, widened to fp32) into dst.
	gather(ctx context.Context, name string, dst []float32) error
	// endLayer releases layer l's parameters (no write-back).
	endLayer(l int)
	// handGrad hands a micro-step's gradients of a parameter: per[i] is
	// the gradient of the i-th data-parallel rank the loop computes. The
	// backend sums them with every other data-parallel rank's in rank
	// order (locally, or across processes), scales the sum by inv when
	// there are several data-parallel ranks, rounds it to fp16 with fp16
	// params (as fp16 gradients are communicated), and accumulates it.
	// scratch has the tensor's length, for a backend that sums locally.
	handGrad(ctx context.Context, name string, per [][]float32, inv float32, scratch []float32) error
	// totalLoss sums the micro-step losses of a step over every
	// data-parallel rank: losses[m*len+i] is micro-step m of the loop's
	// i-th rank; the sum runs over micro-steps, then ranks in rank order.
	totalLoss(ctx context.Context, losses []float32) (float32, error)
	// step runs the optimizer over every parameter and clears gradients.
	step(ctx context.Context) error
	// startPass announces the order the next pass visits layers in, so
	// prefetching can follow it.
	startPass(order []int)
	// handOver tells the backend layer l's gradients are final for this
	// step (the last micro-step's backward passed it), so its optimizer
	// update may start while backward goes on.
	handOver(ctx context.Context, l int)
	// lossScale is the fp16 loss scale of the current step (1 without
	// fp16): the loop multiplies its loss gradient by it.
	lossScale() float64
}

// actTier is where a layer-major loop hands its activations
// (zinf.Activations).
type actTier interface {
	Save(ctx context.Context, l, m int, data []byte) error
	Load(ctx context.Context, l, m int, dst []byte) (int, error)
	Flush(ctx context.Context) error
	Reset()
}

// loopOptions control the shared loop.
type loopOptions struct {
	// World is the data-parallel degree: the ranks whose micro-batches
	// make a step. With Part, the loop computes Local of them (possibly
	// none), from First on; without, all of them.
	Steps, Micro, World int
	Part                bool
	First, Local        int
	// OverlapStep starts each layer's optimizer update as soon as its last
	// gradient is in, overlapping the step with the rest of backward.
	OverlapStep bool
	// Start is the index of the first step (a resumed run's data continues
	// where the checkpointed run stopped); default 0.
	Start int
	// ComputePerLayer is simulated accelerator time per layer per pass
	// (forward and backward each) and micro-batch.
	ComputePerLayer time.Duration
	// LayerMajor runs every micro-batch of a layer while it is begun (one
	// forward and one backward pass per step, each gradient handed once
	// per micro-batch in micro-batch order) instead of a forward and a
	// backward pass per micro-batch: the same arithmetic, the same bits.
	LayerMajor bool
	// Acts, when set, keeps a layer-major step's activations between a
	// layer's forward and its backward (each layer's input and
	// pre-activations, per micro-batch and rank): the loop holds only the
	// current ones. Nil: every activation stays in the loop's memory.
	Acts actTier
	// OnStep is called after each step with its index, loss and duration.
	OnStep func(step int, loss float32, d time.Duration) error
	// OnStepError, when set, is called when the optimizer step fails; if it
	// returns true the step is tried again (the step is all or nothing, so
	// a retry after the fault clears gives the fault-free result).
	OnStepError func(step int, err error) bool
}

// runLoop trains spec on b: data-parallel over World simulated ranks, each
// with its own micro-batches; gradients are summed over ranks in rank order
// and scaled by 1/World (a reduce-scatter), then accumulated over Micro
// micro-steps; then one optimizer step.
//
// With fp16 params the loop is a simulated fp16 backward pass with loss
// scaling: the loss gradient is multiplied by the loss scale, and each
// layer's reduced gradient is rounded to fp16 (as fp16 gradients are
// communicated), so a scale that is too large overflows to inf and the
// step is skipped.
func runLoop(ctx context.Context, spec Spec, b backend, o loopOptions) error {
	if !o.Part {
		o.First, o.Local = 0, o.World
	}
	if o.LayerMajor && o.Micro > 1 {
		if o.Acts != nil {
			return runLayerMajorTiered(ctx, spec, b, o)
		}
		return runLayerMajor(ctx, spec, b, o)
	}
	L, W, B, R := spec.Layers, spec.Width, spec.Batch, o.Local
	w := make([]float32, W*W)
	bias := make([]float32, W)
	// Per rank: activations per layer boundary, pre-activations per layer.
	acts := make([][][]float32, R)
	zs := make([][][]float32, R)
	for r := range R {
		acts[r] = make([][]float32, L+1)
		zs[r] = make([][]float32, L)
		for l := 0; l <= L; l++ {
			acts[r][l] = make([]float32, B*W)
			if l < L {
				zs[r][l] = make([]float32, B*W)
			}
		}
	}
	dOut := make([][]float32, R)
	dIn := make([][]float32, R)
	dW := make([][]float32, R)
	dB := make([][]float32, R)
	for r := range R {
		dOut[r] = make([]float32, B*W)
		dIn[r] = make([]float32, B*W)
		dW[r] = make([]float32, W*W)
		dB[r] = make([]float32, W)
	}
	// With one rank here its gradient is the reduced one (reduce copies it
	// onto itself; fp16 rounds it in place, as dW is cleared per layer):
	// no third W x W buffer on the heap.
	var gW, gB []float32
	if R == 1 {
		gW, gB = dW[0], dB[0]
	} else {
		gW, gB = make([]float32, W*W), make([]float32, W)
	}
	inv := 1 / float32(o.World)
	losses := make([]float32, o.Micro*R)
	fwdOrder := make([]int, L)
	bwdOrder := make([]int, L)
	for l := range L {
		fwdOrder[l], bwdOrder[l] = l, L-1-l
	}
	compute := func() {
		if o.ComputePerLayer > 0 {
			time.Sleep(o.ComputePerLayer)
		}
	}
	return drive(ctx, b, o, func(step int, t0 time.Time) error {
		lossScale := float32(b.lossScale())
		for m := 0; m < o.Micro; m++ {
			var ys [][]float32
			for r := range R {
				x, y := spec.Data(step, m, o.First+r)
				copy(acts[r][0], x)
				ys = append(ys, y)
			}
			b.startPass(fwdOrder)
			for l := 0; l < L; l++ {
				if err := layerParams(ctx, b, l, w, bias); err != nil {
					return err
				}
				for r := range R {
					Forward(acts[r][l], w, bias, zs[r][l], acts[r][l+1], B, W, l == L-1)
				}
				compute()
				b.endLayer(l)
			}
			for r := range R {
				losses[m*R+r] = LossGrad(acts[r][L], ys[r], dOut[r])
				if lossScale != 1 {
					for i := range dOut[r] {
						dOut[r][i] *= lossScale
					}
				}
			}
			b.startPass(bwdOrder)
			for l := L - 1; l >= 0; l-- {
				if err := layerParams(ctx, b, l, w, nil); err != nil {
					return err
				}
				for r := range R {
					clear(dW[r])
					clear(dB[r])
					var din []float32
					if l > 0 {
						din = dIn[r]
					}
					Backward(dOut[r], acts[r][l], zs[r][l], w, dW[r], dB[r], din, B, W, l == L-1)
					dOut[r], dIn[r] = dIn[r], dOut[r]
				}
				compute()
				for _, g := range []struct {
					name    string
					per     [][]float32
					scratch []float32
				}{{WeightName(l), dW, gW}, {BiasName(l), dB, gB}} {
					// A failed hand-off adds nothing, so it can be retried.
					for {
						err := b.handGrad(ctx, g.name, g.per, inv, g.scratch)
						if err == nil {
							break
						}
						if errors.Is(err, zinf.ErrUpdateFailed) || o.OnStepError == nil || !o.OnStepError(step, err) {
							// Steps are numbered from 1 in messages, as in the
							// progress lines and the optimizer's own errors.
							return fmt.Errorf("step %d (micro-step %d of %d) layer %d: %w", step+1, m+1, o.Micro, l, err)
						}
					}
				}
				if m == o.Micro-1 && o.OverlapStep {
					b.handOver(ctx, l)
				}
				b.endLayer(l)
			}
		}
		return finishStep(ctx, b, o, step, losses, t0)
	})
}

// finishStep ends step (begun at t0) the same way in every order: the
// optimizer step (retried while o.OnStepError says so), the step's loss
// over every rank and micro-batch, and o.OnStep.
func finishStep(ctx context.Context, b backend, o loopOptions, step int, losses []float32, t0 time.Time) error {
	for {
		err := b.step(ctx)
		if err == nil {
			break
		}
		if o.OnStepError == nil || !o.OnStepError(step, err) {
			return fmt.Errorf("step %d: optimizer step: %w", step+1, err)
		}
	}
	loss, err := b.totalLoss(ctx, losses)
	if err != nil {
		return fmt.Errorf("step %d: the loss: %w", step+1, err)
	}
	if o.OnStep != nil {
		return o.OnStep(step, loss/float32(o.World*o.Micro), time.Since(t0))
	}
	return nil
}

// layerParams begins layer l and gathers its weight (and bias when b is
// not nil).
func layerParams(ctx context.Context, be backend, l int, w, b []float32) error {
	return layerParamsK(ctx, be, l, 1, w, b)
}

// layerParamsK is layerParams for k micro-batches.
func layerParamsK(ctx context.Context, be backend, l, k int, w, b []float32) error {
	if err := be.beginLayer(ctx, l, k); err != nil {
		return fmt.Errorf("layer %d: %w", l, err)
	}
	if err := be.gather(ctx, WeightName(l), w); err != nil {
		return err
	}
	if b != nil {
		return be.gather(ctx, BiasName(l), b)
	}
	return nil
}

// reduce sums per-rank gradients in rank order and scales by inv (1/world)
// when there are several.
func reduce(dst []float32, per [][]float32, inv float32) {
	copy(dst, per[0])
	for _, g := range per[1:] {
		for i, v := range g {
			dst[i] += v
		}
	}
	if len(per) > 1 {
		for i := range dst {
			dst[i] *= inv
		}
	}
}

// sumLosses sums a step's losses of every data-parallel rank, computed in
// one loop (losses[m*ranks+r]), as the loop always has: micro-step by
// micro-step, rank by rank.
func sumLosses(losses []float32) float32 {
	var loss float32
	for _, l := range losses {
		loss += l
	}
	return loss
}

// runLayerMajor is runLoop in the layer-major order: per step one forward
// pass, each layer computing every micro-batch (whose activations are
// kept, one set per micro-batch), and one backward pass, each layer
// computing every micro-batch's gradients and handing them in micro-batch
// order. Every micro-batch computes what it computes in runLoop, and each
// gradient's micro-batches reach the backend in the same order, so the
// results are runLoop's bit for bit.
func runLayerMajor(ctx context.Context, spec Spec, b backend, o loopOptions) error {
	L, W, B, R, K := spec.Layers, spec.Width, spec.Batch, o.Local, o.Micro
	w := make([]float32, W*W)
	bias := make([]float32, W)
	// Per micro-batch and rank: activations per layer boundary,
	// pre-activations per layer, the backward's running gradients.
	acts := make([][][][]float32, K)
	zs := make([][][][]float32, K)
	dOut := make([][][]float32, K)
	dIn := make([][][]float32, K)
	for m := range K {
		acts[m] = make([][][]float32, R)
		zs[m] = make([][][]float32, R)
		dOut[m] = make([][]float32, R)
		dIn[m] = make([][]float32, R)
		for r := range R {
			acts[m][r] = make([][]float32, L+1)
			zs[m][r] = make([][]float32, L)
			for l := 0; l <= L; l++ {
				acts[m][r][l] = make([]float32, B*W)
				if l < L {
					zs[m][r][l] = make([]float32, B*W)
				}
			}
			dOut[m][r] = make([]float32, B*W)
			dIn[m][r] = make([]float32, B*W)
		}
	}
	dW := make([][]float32, R)
	dB := make([][]float32, R)
	for r := range R {
		dW[r] = make([]float32, W*W)
		dB[r] = make([]float32, W)
	}
	var gW, gB []float32
	if R == 1 {
		gW, gB = dW[0], dB[0]
	} else {
		gW, gB = make([]float32, W*W), make([]float32, W)
	}
	inv := 1 / float32(o.World)
	losses := make([]float32, K*R)
	fwdOrder := make([]int, L)
	bwdOrder := make([]int, L)
	for l := range L {
		fwdOrder[l], bwdOrder[l] = l, L-1-l
	}
	compute := func() {
		if o.ComputePerLayer > 0 {
			time.Sleep(time.Duration(K) * o.ComputePerLayer)
		}
	}
	return drive(ctx, b, o, func(step int, t0 time.Time) error {
		lossScale := float32(b.lossScale())
		ys := make([][][]float32, K)
		for m := range K {
			for r := range R {
				x, y := spec.Data(step, m, o.First+r)
				copy(acts[m][r][0], x)
				ys[m] = append(ys[m], y)
			}
		}
		b.startPass(fwdOrder)
		for l := 0; l < L; l++ {
			if err := layerParamsK(ctx, b, l, K, w, bias); err != nil {
				return err
			}
			for m := range K {
				for r := range R {
					Forward(acts[m][r][l], w, bias, zs[m][r][l], acts[m][r][l+1], B, W, l == L-1)
				}
			}
			compute()
			b.endLayer(l)
		}
		for m := range K {
			for r := range R {
				losses[m*R+r] = LossGrad(acts[m][r][L], ys[m][r], dOut[m][r])
				if lossScale != 1 {
					for i := range dOut[m][r] {
						dOut[m][r][i] *= lossScale
					}
				}
			}
		}
		b.startPass(bwdOrder)
		for l := L - 1; l >= 0; l-- {
			if err := layerParamsK(ctx, b, l, K, w, nil); err != nil {
				return err
			}
			for m := range K {
				for r := range R {
					clear(dW[r])
					clear(dB[r])
					var din []float32
					if l > 0 {
						din = dIn[m][r]
					}
					Backward(dOut[m][r], acts[m][r][l], zs[m][r][l], w, dW[r], dB[r], din, B, W, l == L-1)
					dOut[m][r], dIn[m][r] = dIn[m][r], dOut[m][r]
				}
				for _, g := range []struct {
					name    string
					per     [][]float32
					scratch []float32
				}{{WeightName(l), dW, gW}, {BiasName(l), dB, gB}} {
					for {
						err := b.handGrad(ctx, g.name, g.per, inv, g.scratch)
						if err == nil {
							break
						}
						if errors.Is(err, zinf.ErrUpdateFailed) || o.OnStepError == nil || !o.OnStepError(step, err) {
							return fmt.Errorf("step %d (micro-step %d of %d) layer %d: %w", step+1, m+1, o.Micro, l, err)
						}
					}
				}
			}
			compute()
			if o.OverlapStep {
				b.handOver(ctx, l)
			}
			b.endLayer(l)
		}
		return finishStep(ctx, b, o, step, losses, t0)
	})
}

// runLayerMajorTiered is runLayerMajor with the activations in o.Acts:
// the forward pass saves each layer's input and pre-activations of each
// micro-batch and rank (one entry, input then pre-activations) and keeps
// only the boundary it computes; the backward pass loads them back. The
// arithmetic is runLayerMajor's, on the same values. A step whose
// activations fail (a full disk under the tier) is given up — the tier
// reset, the backend's step aborted — and run again when o.OnStepError
// says so.
func runLayerMajorTiered(ctx context.Context, spec Spec, b backend, o loopOptions) error {
	L, W, B, R, K := spec.Layers, spec.Width, spec.Batch, o.Local, o.Micro
	w := make([]float32, W*W)
	bias := make([]float32, W)
	cur := make([][]float32, K*R) // each (micro-batch, rank)'s activation at the layer boundary
	dOut := make([][]float32, K*R)
	for i := range cur {
		cur[i] = make([]float32, B*W)
		dOut[i] = make([]float32, B*W)
	}
	next, dIn := make([]float32, B*W), make([]float32, B*W)
	entry := make([]float32, 2*B*W) // input, then pre-activations
	dW := make([][]float32, R)
	dB := make([][]float32, R)
	for r := range R {
		dW[r] = make([]float32, W*W)
		dB[r] = make([]float32, W)
	}
	var gW, gB []float32
	if R == 1 {
		gW, gB = dW[0], dB[0]
	} else {
		gW, gB = make([]float32, W*W), make([]float32, W)
	}
	inv := 1 / float32(o.World)
	losses := make([]float32, K*R)
	fwdOrder := make([]int, L)
	bwdOrder := make([]int, L)
	for l := range L {
		fwdOrder[l], bwdOrder[l] = l, L-1-l
	}
	compute := func() {
		if o.ComputePerLayer > 0 {
			time.Sleep(time.Duration(K) * o.ComputePerLayer)
		}
	}
	acts := o.Acts
	passes := func(step int, lossScale float32) error {
		ys := make([][]float32, K*R)
		for m := range K {
			for r := range R {
				x, y := spec.Data(step, m, o.First+r)
				copy(cur[m*R+r], x)
				ys[m*R+r] = y
			}
		}
		b.startPass(fwdOrder)
		for l := 0; l < L; l++ {
			if err := layerParamsK(ctx, b, l, K, w, bias); err != nil {
				return err
			}
			for i := range cur {
				copy(entry[:B*W], cur[i])
				Forward(cur[i], w, bias, entry[B*W:], next, B, W, l == L-1)
				if err := acts.Save(ctx, l, i, buffers.AsBytes(entry)); err != nil {
					b.endLayer(l)
					return err
				}
				cur[i], next = next, cur[i]
			}
			compute()
			b.endLayer(l)
		}
		for i := range cur {
			losses[i] = LossGrad(cur[i], ys[i], dOut[i])
			if lossScale != 1 {
				for j := range dOut[i] {
					dOut[i][j] *= lossScale
				}
			}
		}
		b.startPass(bwdOrder)
		for l := L - 1; l >= 0; l-- {
			if err := layerParamsK(ctx, b, l, K, w, nil); err != nil {
				return err
			}
			for m := range K {
				for r := range R {
					i := m*R + r
					if _, err := acts.Load(ctx, l, i, buffers.AsBytes(entry)); err != nil {
						b.endLayer(l)
						return err
					}
					clear(dW[r])
					clear(dB[r])
					var din []float32
					if l > 0 {
						din = dIn
					}
					Backward(dOut[i], entry[:B*W], entry[B*W:], w, dW[r], dB[r], din, B, W, l == L-1)
					if l > 0 {
						dOut[i], dIn = dIn, dOut[i]
					}
				}
				for _, g := range []struct {
					name    string
					per     [][]float32
					scratch []float32
				}{{WeightName(l), dW, gW}, {BiasName(l), dB, gB}} {
					for {
						err := b.handGrad(ctx, g.name, g.per, inv, g.scratch)
						if err == nil {
							break
						}
						if errors.Is(err, zinf.ErrUpdateFailed) || o.OnStepError == nil || !o.OnStepError(step, err) {
							return fmt.Errorf("step %d (micro-step %d of %d) layer %d: %w", step+1, m+1, o.Micro, l, err)
						}
					}
				}
			}
			compute()
			if o.OverlapStep {
				b.handOver(ctx, l)
			}
			b.endLayer(l)
		}
		return acts.Flush(ctx)
	}
	return drive(ctx, b, o, func(step int, t0 time.Time) error {
		for {
			err := passes(step, float32(b.lossScale()))
			if err == nil {
				break
			}
			acts.Reset()
			if errors.Is(err, zinf.ErrUpdateFailed) {
				return err // the last step's, not this one's: drive retries it
			}
			ab, ok := b.(interface{ abortStep() })
			if !ok || o.OnStepError == nil || !o.OnStepError(step, err) {
				return fmt.Errorf("step %d: %w", step+1, err)
			}
			ab.abortStep() // nothing of the step stays; it runs again
		}
		return finishStep(ctx, b, o, step, losses, t0)
	})
}

// updateRecoverer is a backend whose optimizer step may go on after it
// returned (zinf.overlap_update).
type updateRecoverer interface {
	// recoverUpdate waits for the last step's update on every rank and,
	// on a rank where it failed, runs that step again (Step) while retry
	// allows; it returns the failure retry refused.
	recoverUpdate(ctx context.Context, retry func(error) bool) error
}

// maxUpdateRetries bounds how often one step starts over because the
// step before it failed after its Step returned.
const maxUpdateRetries = 20

// drive runs the steps, one at a time (one(step, t0) does a step begun at
// t0). With zinf.overlap_update a step's update runs on under the next
// step's forward pass, and when it fails the next step's calls report
// zinf.ErrUpdateFailed: the failed step is retried — as o.OnStepError
// allows, like any failed optimizer step — and the step under way runs
// again from its start (its forward may have read the failed step's
// parameters). After the last step, drive waits for its update too.
func drive(ctx context.Context, b backend, o loopOptions, one func(step int, t0 time.Time) error) error {
	recoverLast := func(step int, cause error) error {
		u, ok := b.(updateRecoverer)
		if !ok {
			return cause
		}
		err := u.recoverUpdate(ctx, func(err error) bool { return o.OnStepError != nil && o.OnStepError(step, err) })
		if err != nil {
			return fmt.Errorf("step %d: optimizer step (its update failed after Step returned): %w", step+1, err)
		}
		return nil
	}
	for step := o.Start; step < o.Start+o.Steps; step++ {
		t0 := time.Now()
		for attempt := 0; ; attempt++ {
			err := one(step, t0)
			if err == nil {
				break
			}
			if !errors.Is(err, zinf.ErrUpdateFailed) || step == o.Start || attempt >= maxUpdateRetries {
				return err
			}
			if err := recoverLast(step-1, err); err != nil {
				return err
			}
		}
	}
	if o.Steps == 0 {
		return nil
	}
	return recoverLast(o.Start+o.Steps-1, nil)
}
