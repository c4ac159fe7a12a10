package zinf

// A tensor's life outside the loop: its initial values (Init) and its
// optimizer states read back.

import (
	"context"
	"fmt"
	"strconv"

	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
)

// Init sets a tensor's initial values: values is the FULL tensor in fp32
// (this rank keeps its partition). The parameter is stored in the param
// dtype on its planned tier, the optimizer keeps the fp32 master and zeroed
// Adam states, and the gradient swapper gets a slot. It is all or nothing:
// on error (a full disk, say) nothing of the tensor remains and Init may be
// called again. Every tensor of the model must be initialized before its
// layer is begun or a step is taken.
func (r *Runtime) Init(ctx context.Context, name string, values []float32) error {
	if err := r.closedErr("init "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.settled(ctx); err != nil {
		return err
	}
	numel, ok := r.model.Numel[name]
	if !ok {
		return fmt.Errorf("zinf: init %q: not a tensor of the model", name)
	}
	if int64(len(values)) != numel {
		return fmt.Errorf("zinf: init %q: %d values for a tensor of %d elements", name, len(values), numel)
	}
	r.mu.Lock()
	done := r.inited[name]
	r.mu.Unlock()
	if done {
		return fmt.Errorf("zinf: init %q: already initialized", name)
	}
	lo, hi := partition(len(values), r.Rank, r.World)
	part := values[lo:hi]
	if err := r.Params.Init(ctx, name, part); err != nil {
		return fmt.Errorf("zinf: init %q: %w", name, err)
	}
	if r.inference {
		r.mu.Lock()
		r.inited[name] = true
		r.params = append(r.params, name)
		r.numel[name] = len(values)
		r.mu.Unlock()
		return nil
	}
	// The optimizer writes the initial states (it may fail, e.g. a full
	// disk, and then keeps nothing of the tensor); the gradient slot only
	// checks sizes the reservations already cover, so it goes last.
	if err := r.Optimizer.Register(name, part); err != nil {
		// All or nothing: the parameter was stored; forget it again.
		if uerr := r.forgetParam(name); uerr != nil {
			return fmt.Errorf("zinf: init %q: %w (and undoing the parameter's init: %v)", name, err, uerr)
		}
		return fmt.Errorf("zinf: init %q: %w", name, err)
	}
	if err := r.grads.Register(name, hi-lo); err != nil {
		return fmt.Errorf("zinf: init %q: %w", name, err)
	}
	r.mu.Lock()
	r.inited[name] = true
	r.params = append(r.params, name)
	r.numel[name] = len(values)
	r.mu.Unlock()
	return nil
}

// forgetParam undoes a parameter's Init: its stored partition is freed and
// it is registered again, without values.
func (r *Runtime) forgetParam(name string) error {
	if err := r.Params.Unregister(name); err != nil {
		return err
	}
	return r.Params.Register(name, int(r.model.Numel[name]), r.tiers[name])
}

// ReadOptimizerStates returns this rank's partition of a tensor's fp32
// master weights and of its optimizer states (optimizer.Hyper.StateNames
// order: Adam exp_avg, exp_avg_sq; SGD with momentum momentum_buffer;
// Adagrad sum; Lion exp_avg), as of the last committed step.
func (r *Runtime) ReadOptimizerStates(ctx context.Context, name string) (master []float32, states [][]float32, err error) {
	if err := r.closedErr("read state "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return nil, nil, err
	}
	if err := r.settled(ctx); err != nil {
		return nil, nil, err
	}
	if _, ok := r.model.Numel[name]; !ok {
		return nil, nil, fmt.Errorf("zinf: read state %q: not a tensor of the model", name)
	}
	return r.Optimizer.ReadStates(ctx, name)
}

// VisitOptimizerStates calls fn for each optimizer sub-group of this
// rank's partition of a tensor, in order, with the offset of its first
// element in the partition and its fp32 master weights and states
// (Hyper.StateNames order) as of the last committed step. The slices live
// in pinned memory for the call only and must not be written. Unlike
// ReadOptimizerStates it copies nothing: reading a few elements of a large
// tensor costs one sub-group's record of pinned memory, no heap.
func (r *Runtime) VisitOptimizerStates(ctx context.Context, name string, fn func(off int, master []float32, states [][]float32) error) error {
	if err := r.closedErr("read state "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return err
	}
	if err := r.settled(ctx); err != nil {
		return err
	}
	if _, ok := r.model.Numel[name]; !ok {
		return fmt.Errorf("zinf: read state %q: not a tensor of the model", name)
	}
	return r.Optimizer.VisitStates(ctx, name, fn)
}

// ReadOptimizerState returns this rank's partition of a tensor's fp32
// master weights and Adam moments, as of the last committed step (for
// another optimizer, its first two states, nil where it has fewer).
func (r *Runtime) ReadOptimizerState(ctx context.Context, name string) (master, expAvg, expAvgSq []float32, err error) {
	if err := r.closedErr("read state "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return nil, nil, nil, err
	}
	if err := r.settled(ctx); err != nil {
		return nil, nil, nil, err
	}
	if _, ok := r.model.Numel[name]; !ok {
		return nil, nil, nil, fmt.Errorf("zinf: read state %q: not a tensor of the model", name)
	}
	return r.Optimizer.ReadState(ctx, name)
}
