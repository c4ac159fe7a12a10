package train

import (
	"context"
	"fmt"
	"time"

	"github.com/zinfio/zinf/swapper"
)

// backend is where the model's state lives: fully in memory (the
// reference) or in zinf runtimes (one per simulated rank). The training
// arithmetic is in the shared loop below, so the two runs differ only in
// how tensors are stored and moved: equal results prove the moving lossless.
type backend interface {
	// beginLayer makes layer l's parameters available (a barrier: waits for
	// their swap-in, prefetching what comes next).
	beginLayer(ctx context.Context, l int) error
	// gather writes the full compute values of a parameter (in the param
	// dtype, widened to fp32) into dst.
	gather(ctx context.Context, name string, dst []float32) error
	// endLayer releases layer l's parameters (no write-back).
	endLayer(l int)
	// accumulate adds a micro-step's reduced gradient of a parameter.
	accumulate(ctx context.Context, name string, grad []float32) error
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

// loopOptions control the shared loop.
type loopOptions struct {
	Steps, Micro, World int
	// OverlapStep starts each layer's optimizer update as soon as its last
	// gradient is in, overlapping the step with the rest of backward.
	OverlapStep bool
	// Start is the index of the first step (a resumed run's data continues
	// where the checkpointed run stopped); default 0.
	Start int
	// ComputePerLayer is simulated accelerator time per layer per pass
	// (forward and backward each).
	ComputePerLayer time.Duration
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
	L, W, B, R := spec.Layers, spec.Width, spec.Batch, o.World
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
	gW := make([]float32, W*W)
	gB := make([]float32, W)
	inv := 1 / float32(R)
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
	fp16 := spec.DType == swapper.Float16
	for step := o.Start; step < o.Start+o.Steps; step++ {
		t0 := time.Now()
		var loss float32
		lossScale := float32(b.lossScale())
		for m := 0; m < o.Micro; m++ {
			var ys [][]float32
			for r := range R {
				x, y := spec.Data(step, m, r)
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
				loss += LossGrad(acts[r][L], ys[r], dOut[r])
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
				reduce(gW, dW, inv)
				reduce(gB, dB, inv)
				if fp16 {
					spec.Quantize(gW)
					spec.Quantize(gB)
				}
				for _, g := range []struct {
					name string
					v    []float32
				}{{WeightName(l), gW}, {BiasName(l), gB}} {
					// A failed hand-off adds nothing, so it can be retried.
					for {
						err := b.accumulate(ctx, g.name, g.v)
						if err == nil {
							break
						}
						if o.OnStepError == nil || !o.OnStepError(step, err) {
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
		for {
			err := b.step(ctx)
			if err == nil {
				break
			}
			if o.OnStepError == nil || !o.OnStepError(step, err) {
				return fmt.Errorf("step %d: optimizer step: %w", step+1, err)
			}
		}
		if o.OnStep != nil {
			if err := o.OnStep(step, loss/float32(R*o.Micro), time.Since(t0)); err != nil {
				return err
			}
		}
	}
	return nil
}

// layerParams begins layer l and gathers its weight (and bias when b is
// not nil).
func layerParams(ctx context.Context, be backend, l int, w, b []float32) error {
	if err := be.beginLayer(ctx, l); err != nil {
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

// reduce sums per-rank gradients in rank order and scales by inv (1/world).
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
