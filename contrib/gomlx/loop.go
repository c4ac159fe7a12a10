package zgomlx

import (
	"context"
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// paramSource is where a loop's registered variables come from and where
// their gradients go: zinf (Trainer) or Go memory (MemoryTrainer). Both
// run the same executors in the same order, so their steps differ only
// in that.
type paramSource interface {
	// startPass announces a pass over the layers (forward: 0, 1, ...;
	// backward: the last first).
	startPass(forward bool)
	// bind makes layer l's registered variables readable by its
	// executors (sets every Var.cur); unbind ends that.
	bind(ctx context.Context, l int) error
	unbind(l int)
	// grad hands over v's gradient of this micro-step; last says it is the
	// step's last micro-step, so v's gradient is final.
	grad(ctx context.Context, v *Var, g []float32, last bool) error
	// layerDone: every gradient of layer l is final (last micro-step).
	layerDone(ctx context.Context, l int) error
	// fail is called when a micro-step fails before its commit.
	fail()
}

// loop runs micro-steps of a Net over a paramSource with per-layer
// executors: forward layer by layer (keeping each layer's input), the
// loss and its gradient, then backward from the last layer, each layer
// recomputed and differentiated (its variables' gradients handed over
// as they are produced).
type loop struct {
	ex      *executors
	src     paramSource
	acts    []*tensors.Tensor
	scratch []float32 // widens bf16/fp16 gradients
}

// run is one micro-step; it returns the loss.
func (lp *loop) run(ctx context.Context, x, labels *tensors.Tensor, last bool) (loss float32, err error) {
	if x == nil || labels == nil {
		return 0, fmt.Errorf("zgomlx: nil input or labels")
	}
	layers := lp.ex.layers
	L := len(layers)
	acts := append(lp.acts[:0], x)
	var dy *tensors.Tensor
	defer func() {
		// acts[0] is the caller's; the others are ours.
		for i := 1; i < len(acts); i++ {
			finalize(acts[i])
			acts[i] = nil
		}
		finalize(dy)
		lp.acts = acts[:0]
		if err != nil {
			lp.src.fail()
		}
	}()
	lp.src.startPass(true)
	for l, le := range layers {
		if err := lp.src.bind(ctx, l); err != nil {
			return 0, err
		}
		out, err := le.fwd.Call(acts[l])
		lp.src.unbind(l)
		if err != nil {
			return 0, fmt.Errorf("zgomlx: forward of layer %q: %w", le.layer.Scope, err)
		}
		acts = append(acts, out[0])
	}
	lo, err := lp.ex.loss.Call(acts[L], labels)
	if err != nil {
		return 0, fmt.Errorf("zgomlx: loss: %w", err)
	}
	loss, err = lp.scalar(lo[0])
	finalize(lo[0])
	dy = lo[1]
	if err != nil {
		return 0, err
	}
	finalize(acts[L])
	acts[L] = nil
	lp.src.startPass(false)
	for l := L - 1; l >= 0; l-- {
		le := layers[l]
		in := acts[l]
		float := in.DType().IsFloat()
		if !le.needsBackward(float) {
			finalize(dy)
			dy = nil
			continue
		}
		if err := lp.src.bind(ctx, l); err != nil {
			return 0, err
		}
		outs, err := le.bwd.Call(in, dy)
		lp.src.unbind(l)
		if err != nil {
			return 0, fmt.Errorf("zgomlx: backward of layer %q: %w", le.layer.Scope, err)
		}
		finalize(dy)
		dy = nil
		if l > 0 {
			finalize(in)
			acts[l] = nil
		}
		k := 0
		if float {
			dy, k = outs[0], 1
		}
		var gerr error
		for i, v := range le.vars {
			if gerr == nil {
				gerr = lp.grad(ctx, v, outs[k+i], last)
			}
			finalize(outs[k+i])
		}
		if gerr != nil {
			return 0, gerr
		}
		if last {
			if err := lp.src.layerDone(ctx, l); err != nil {
				return 0, err
			}
		}
	}
	return loss, nil
}

// grad hands a gradient tensor over as fp32: a view of its buffer when it
// is fp32, widened into the loop's scratch otherwise; nothing is
// allocated in steady state.
func (lp *loop) grad(ctx context.Context, v *Var, t *tensors.Tensor, last bool) error {
	_, b, err := bufferOf(lp.ex.backend, t)
	if err != nil {
		return fmt.Errorf("zgomlx: gradient of %q: %w", v.Name, err)
	}
	if len(b) != v.numel*v.dtype.Size() {
		return fmt.Errorf("zgomlx: gradient of %q has %d bytes, the variable %d", v.Name, len(b), v.numel*v.dtype.Size())
	}
	if v.dtype == swapper.Float32 {
		return lp.src.grad(ctx, v, buffers.Float32Bytes(b), last)
	}
	if cap(lp.scratch) < v.numel {
		lp.scratch = make([]float32, v.numel)
	}
	g := lp.scratch[:v.numel]
	swapper.Decode(v.dtype, g, b)
	return lp.src.grad(ctx, v, g, last)
}

// scalar reads a scalar float tensor without copying it to Go.
func (lp *loop) scalar(t *tensors.Tensor) (float32, error) {
	return scalarOf(lp.ex.backend, t)
}

func scalarOf(backend compute.Backend, t *tensors.Tensor) (float32, error) {
	buf, err := t.Buffer(backend, 0)
	if err != nil {
		return 0, err
	}
	flat, err := buf.Data()
	if err != nil {
		return 0, err
	}
	switch f := flat.(type) {
	case []float32:
		return f[0], nil
	case []float64:
		return float32(f[0]), nil
	}
	b := dtypes.UnsafeByteSliceFromAny(flat)
	dt, ok := zinfDType(t.DType())
	if !ok || len(b) < dt.Size() {
		return 0, fmt.Errorf("zgomlx: the loss is %s (a float scalar is needed)", t.Shape())
	}
	var one [1]float32
	swapper.Decode(dt, one[:], b[:dt.Size()])
	return one[0], nil
}
