package zinf

// The loop's walk through the layers: passes announced (Forward,
// Backward, Pass), layers begun and ended, parameters read while begun.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// Forward announces a forward pass (layers 0, 1, ...), so that prefetching
// follows it. Prefetching stops at the last layer: what comes next (a
// backward pass) is not known.
func (r *Runtime) Forward() {
	r.trace.setPass("forward")
	r.startPass(r.forwardOrder(), false)
}

// ForwardRepeating announces a forward pass that the next pass repeats:
// a decoding step of token generation, or a batch of evaluation, followed
// by another. Prefetching then runs on past the pass's last layer into
// the next pass's first ones (within the same prefetch depth and window,
// after every layer of this pass), so the disk keeps reading while the
// last layers compute and the next pass does not start on a demand miss.
// The next pass announced keeps them (Forward or ForwardRepeating), or
// releases them (Backward, Pass with another order). The last pass of a
// loop prefetches layers that are never used: ReleasePrefetched (or
// Close) gives them back. With Options.GatherLayers, the pass's last
// layer gathers the next pass's first ahead, as each layer gathers the
// next one of its pass. A training step, whose Forward is followed by
// Backward, calls Forward.
func (r *Runtime) ForwardRepeating() {
	r.trace.setPass("forward")
	r.startPass(r.forwardOrder(), true)
}

// ReleasePrefetched gives back the pinned memory of every layer
// prefetched and not yet begun, cancelling their reads in flight: for a
// loop of ForwardRepeating passes that has ended (the next pass would
// start on a demand miss again), and with Options.GatherLayers the
// layer gathered ahead. Layers begun stay until EndLayer.
func (r *Runtime) ReleasePrefetched() {
	if r.gatherOn {
		r.dropAhead(-1) // a gather ahead of the next pass's first layer
	}
	r.sched.ReleasePrefetched()
}

func (r *Runtime) forwardOrder() []int {
	order := make([]int, len(r.model.Layers))
	for l := range order {
		order[l] = l
	}
	return order
}

// startPass tells the scheduler (and, with GatherLayers, the gathers)
// the order of the next pass; repeat: the pass after it is the same.
func (r *Runtime) startPass(order []int, repeat bool) {
	if r.gatherOn {
		r.gatherPass(order, repeat)
	}
	if repeat {
		r.sched.StartRepeatingPass(order)
	} else {
		r.sched.StartPass(order)
	}
}

// Backward announces a backward pass (the last layer first).
func (r *Runtime) Backward() {
	L := len(r.model.Layers)
	order := make([]int, L)
	for l := range order {
		order[l] = L - 1 - l
	}
	r.trace.setPass("backward")
	r.startPass(order, false)
}

// Pass announces a pass visiting layers in order (for loops that are
// neither plain forward nor backward).
func (r *Runtime) Pass(order []int) {
	r.trace.setPassOrder(order)
	r.startPass(order, false)
}

// BeginLayer makes layer l's parameters readable: a barrier that waits for
// their swap-in (a demand miss jumps the queue) and prefetches the layers
// that follow in the pass within the prefetch window. Pair it with
// EndLayer. With Options.GatherLayers it also all-gathers the layer's
// full parameters from every rank's partitions (waiting for the gather
// started during the previous layer, if any) and starts gathering the
// next layer of the pass: a collective, called by every rank alike.
func (r *Runtime) BeginLayer(ctx context.Context, l int) error {
	if err := r.checkBegin(l); err != nil {
		return err
	}
	// With zinf.overlap_update the last step may still be updating: the
	// layer's own parameters are what this waits for.
	if err := r.waitTensors(ctx, r.model.Layers[l]...); err != nil {
		return err
	}
	if r.gatherOn {
		t0 := time.Now()
		err := r.beginGathered(ctx, l)
		r.trace.layerBegun(l, t0, err)
		if err == nil {
			r.beginVisit(l, 1)
		}
		return err
	}
	return r.beginResident(ctx, l)
}

// checkBegin refuses to begin layer l on a closed runtime, outside the
// model's layers, or before every tensor of the layer has its initial
// values.
func (r *Runtime) checkBegin(l int) error {
	if err := r.closedErr("begin layer "+strconv.Itoa(l), param.ErrClosed); err != nil {
		return err
	}
	if l < 0 || l >= len(r.model.Layers) {
		return fmt.Errorf("zinf: begin layer %d: the model has layers 0..%d", l, len(r.model.Layers)-1)
	}
	for _, n := range r.model.Layers[l] {
		r.mu.Lock()
		ok := r.inited[n]
		r.mu.Unlock()
		if !ok {
			return fmt.Errorf("zinf: begin layer %d: tensor %q has no initial values (call Init)", l, n)
		}
	}
	return nil
}

// beginResident begins layer l from this rank's own partitions (no
// gather): the scheduler's barrier for their swap-in, which prefetches
// the layers that follow in the pass.
func (r *Runtime) beginResident(ctx context.Context, l int) error {
	t0 := time.Now()
	err := r.sched.Begin(ctx, l)
	r.mu.Lock()
	r.ioWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	r.trace.layerBegun(l, t0, err)
	if err != nil {
		if errors.Is(err, buffers.ErrStalled) {
			if held := r.begunExcept(l); held != "" {
				// The likeliest cause: the loop holds them itself.
				return fmt.Errorf("zinf: begin layer %d: %w (%s begun and not ended: their parameters stay in pinned memory until EndLayer)", l, err, held)
			}
		}
		return fmt.Errorf("zinf: begin layer %d: %w", l, err)
	}
	if r.begun == nil {
		r.begun = map[int]bool{}
	}
	r.begun[l] = true
	r.beginVisit(l, 1)
	return nil
}

// BeginLayerMicroBatches begins layer l (as BeginLayer) for k
// micro-batches at once: the layer-major order, where every micro-batch
// of a layer runs while its parameters are in, so a step reads each
// parameter once per pass instead of once per pass and micro-batch. In the
// backward pass the loop hands each of the layer's gradients k times, in
// micro-batch order (AccumulateGrad or ReduceGrad); the runtime sums them
// in pinned memory, in that order — the same additions as k
// micro-batch-major visits, so the same bits — and writes each sum behind
// once, after its k-th. EndLayer writes behind what fewer than k
// hand-offs left in memory. k = 1 is BeginLayer.
//
// The next layer of a pass may be begun while this one is: a loop that
// reads layer l-1's weights while the last micro-batch of layer l
// computes holds both layers' sums, each until its own EndLayer.
//
// A layer-major step, with k := rt.MicroBatches():
//
//	rt.Forward()
//	for l := 0; l < rt.Layers(); l++ {
//		rt.BeginLayerMicroBatches(ctx, l, k)
//		// read the parameters; forward every micro-batch through layer l,
//		// keeping each one's activations for its backward
//		rt.EndLayer(l)
//	}
//	rt.Backward()
//	for l := rt.Layers() - 1; l >= 0; l-- {
//		rt.BeginLayerMicroBatches(ctx, l, k)
//		for m := 0; m < k; m++ {
//			// backward of micro-batch m through layer l
//			rt.AccumulateGrad(ctx, name, g) // per tensor of the layer
//		}
//		rt.StepLayer(ctx, l)
//		rt.EndLayer(l)
//	}
//	rt.Step(ctx)
func (r *Runtime) BeginLayerMicroBatches(ctx context.Context, l, k int) error {
	if err := r.closedErr("begin layer "+strconv.Itoa(l), param.ErrClosed); err != nil {
		return err
	}
	if k < 1 {
		return fmt.Errorf("zinf: begin layer %d: %d micro-batches (allowed: 1 or more)", l, k)
	}
	if err := r.BeginLayer(ctx, l); err != nil {
		return err
	}
	if r.visit.layer == l {
		r.visit.k = k
	}
	if k > 1 && !r.inference {
		if r.held == nil {
			r.held = map[int]*heldLayer{}
		}
		r.held[l] = &heldLayer{layer: l, k: k, count: make(map[string]int, len(r.model.Layers[l]))}
	}
	return nil
}

// EndLayer releases layer l's parameters (no write-back: parameters are
// read-only between steps).
func (r *Runtime) EndLayer(l int) {
	if l < 0 || l >= len(r.model.Layers) {
		return
	}
	r.trace.layerEnded(l)
	r.endVisit(l)
	r.endHeld(l)
	delete(r.begun, l)
	if r.gatherOn {
		r.endGathered(l)
		return
	}
	r.sched.End(l)
}

// ReadParam writes this rank's partition of a parameter, widened to fp32,
// into dst[lo:hi] (see Partition); dst is the full tensor's length, so the
// loop of every rank in one process can share it. The parameter's layer
// must be begun. With Options.GatherLayers it writes the full tensor,
// gathered from every rank, into dst.
func (r *Runtime) ReadParam(ctx context.Context, name string, dst []float32) (err error) {
	if err := r.closedErr("read "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return err
	}
	defer r.checkRead(ctx, &err)
	lo, hi, err := r.fullRange("read", name, len(dst))
	if err != nil {
		return err
	}
	if r.gatherOn {
		return r.readGathered(name, 0, nil, dst)
	}
	return r.Params.ReadFloat32(ctx, name, dst[lo:hi])
}

// ReadParamBytes writes this rank's partition of a parameter, encoded in
// dtype (little-endian), into dst[lo*size:hi*size]: the stored bytes as
// they are when dtype is the param dtype, converted element by element
// otherwise (no Go heap buffer either way, so a framework can swap a
// parameter straight into its own tensor). dst holds the full tensor in
// dtype. With Options.GatherLayers it writes the full tensor.
func (r *Runtime) ReadParamBytes(ctx context.Context, name string, dtype tensor.DType, dst []byte) (err error) {
	if err := r.closedErr("read "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return err
	}
	defer r.checkRead(ctx, &err)
	if !dtype.Valid() {
		return fmt.Errorf("zinf: read %q: unknown dtype %d", name, dtype)
	}
	sz := dtype.Size()
	if len(dst)%sz != 0 {
		return fmt.Errorf("zinf: read %q: %d bytes is not a whole number of %s elements", name, len(dst), dtype)
	}
	lo, hi, err := r.fullRange("read", name, len(dst)/sz)
	if err != nil {
		return err
	}
	if r.gatherOn {
		return r.readGathered(name, dtype, dst, nil)
	}
	return r.Params.ReadAs(ctx, name, dtype, dst[lo*sz:hi*sz])
}

// fullRange checks that n is the named tensor's full length and returns
// this rank's range.
func (r *Runtime) fullRange(op, name string, n int) (lo, hi int, err error) {
	numel, ok := r.model.Numel[name]
	if !ok {
		return 0, 0, fmt.Errorf("zinf: %s %q: not a tensor of the model", op, name)
	}
	if int64(n) != numel {
		return 0, 0, fmt.Errorf("zinf: %s %q: buffer of %d elements for a tensor of %d (pass the full tensor; this rank uses its partition)", op, name, n, numel)
	}
	lo, hi = partition(int(numel), r.Rank, r.World)
	return lo, hi, nil
}
