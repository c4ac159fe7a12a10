package zgomlx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/swapper"
)

// MicroBatch is one micro-batch of a step: the first layer's inputs and
// the loss's labels (see Trainer.StepMicroBatches). The tensors stay the
// caller's.
type MicroBatch struct {
	Inputs, Labels []*tensors.Tensor
}

// actChunkBytes is the largest entry the Trainer hands to zinf's
// activation tier: a layer's inputs of a micro-batch go in chunks of at
// most this, so the tier's NVMe staging (a few entries) is small and
// known before the first step, whatever the model's shapes.
const actChunkBytes = 1 << 20

// actStride separates the chunks of two micro-batches in the tier's
// keys: chunk c of micro-batch m is entry (layer, m*actStride+c), so the
// tier's backward order (a layer's micro-batches in order) is the order
// the Trainer loads them in.
const actStride = 1 << 24

// StepMicroBatches runs one training step of len(mbs) micro-batches: the
// gradients of every micro-batch are summed (in micro-batch order, as
// Accumulate calls and a Step would) and the optimizer commits once. It
// returns each micro-batch's loss. How many is the caller's: under
// gradient_accumulation_steps "auto", the k that hides the step's NVMe
// I/O is Offload().Runtime().MicroBatchesToHideIO(0).MicroBatches once a
// step or two have measured the compute (Loop does this: Loop.MicroBatches).
//
// The order is the plan's (zinf.Runtime.Schedule: zinf.schedule,
// "layer-major", "micro-batch-major" or "auto", the planner's pick for
// gradient_accumulation_steps): micro-batch-major runs each micro-batch
// forward and backward through every layer (Accumulate, ..., Step);
// layer-major runs every micro-batch of a layer while its weights are
// swapped in, so a step reads each layer's parameters from zinf once for
// the forward pass and once for the backward pass whatever the number of
// micro-batches, and each layer's gradients are summed over the
// micro-batches in pinned memory and written once. Between a layer's
// forward and its backward, the inputs of every layer but the first (the
// activations the backward pass recomputes the layer from) go to zinf's
// activation tier (zinf.activations: in memory within memory_bytes, else
// pinned memory, else NVMe, read back ahead of the backward pass). Both
// orders give the same bits, equal to in-memory training.
//
// A layer-major step keeps one layer boundary per micro-batch in Go
// memory. For a variable another layer borrows (Layer.Borrow: tied
// embeddings), the borrowers' gradients of every micro-batch go to the
// tier too until its own layer's backward pass, where they are handed
// over in the micro-batch-major order (the same bits).
//
// It is all or nothing, as Step: an error before the commit gives the
// step up (every micro-batch's gradients, the tier's entries) and leaves
// the model as before — run the step again; an error of the commit wraps
// ErrCommitPending (Commit retries it).
//
// A Net with a Head (a tied head computed in blocks of the table) runs
// layer-major too when its table is the first layer's lookup (as
// TransformerNet's is): each pass reads the table once, block by block,
// and every micro-batch's logits or gradients are computed from a block
// while it is in its buffer; no buffer of the table's size is made. The
// head's table gradient of the rows no lookup of the step names is summed
// over the micro-batches block by block and handed over during the head's
// backward; of the rows the lookups name (a few: the step's tokens) it is
// kept and added to the lookup's at the first layer, in the
// micro-batch-major order, so the bits are the same. Any other Head (its
// table read otherwise by its own layer) runs micro-batch-major: under
// zinf.schedule "auto" whatever the plan's pick (said once at Info level
// on the runtime's logger), and "layer-major" is refused.
func (t *Trainer) StepMicroBatches(ctx context.Context, mbs []MicroBatch) ([]float32, error) {
	if t.pending {
		return nil, ErrCommitPending
	}
	if len(mbs) == 0 {
		return nil, errors.New("zgomlx: StepMicroBatches: no micro-batches (allowed: 1 or more, gradient_accumulation_steps for the plan's sizing)")
	}
	for i, mb := range mbs {
		if err := checkBatch(mb.Inputs, mb.Labels); err != nil {
			return nil, fmt.Errorf("zgomlx: micro-batch %d: %w", i, err)
		}
	}
	layerMajor := t.off.rt.Schedule() == zinf.LayerMajor
	if layerMajor && t.ex.head != nil && !t.headLayerMajor() {
		// A blocked head (Net.Head) whose table its own layer reads
		// otherwise than by a lookup hands the table's gradient in an
		// order the layer-major loop does not keep.
		if t.off.rt.Config.Zinf.Schedule == config.ScheduleLayerMajor {
			return nil, fmt.Errorf(`zgomlx: StepMicroBatches: zinf.schedule "layer-major" with a Net.Head whose table %q is not a float32 lookup of the first layer (Layer.Lookups) that zinf streams, or is borrowed by a layer (allowed: "micro-batch-major" or "auto", which runs micro-batch-major for it; or such a table)`, t.ex.head.table.Name)
		}
		layerMajor = false
		if !t.headOrderSaid {
			t.headOrderSaid = true
			t.off.log.Info("zgomlx: zinf.schedule \"auto\" picked layer-major, but this Net.Head (its table not a streamed float32 lookup of the first layer) runs micro-batch-major: each micro-batch reads the parameters again",
				"micro_batches", len(mbs), "table", t.ex.head.table.Name)
		}
	}
	if !layerMajor {
		losses := make([]float32, len(mbs))
		for i, mb := range mbs {
			last := i == len(mbs)-1
			loss, err := t.lp.run(ctx, mb.Inputs, mb.Labels, last, modeTrain)
			if err != nil {
				// run gave the step up (zinf.Runtime.AbortStep drops every
				// micro-step's gradients) — unless it ran into the last
				// step's update failing (ErrCommitPending: Commit retries
				// that one, then this step runs again).
				return nil, fmt.Errorf("zgomlx: micro-batch %d of %d: %w", i, len(mbs), t.updateFailed(err))
			}
			losses[i] = loss
		}
		return losses, t.Commit(ctx)
	}
	losses, err := t.runLayerMajor(ctx, mbs)
	if err != nil {
		return nil, t.updateFailed(err)
	}
	return losses, t.Commit(ctx)
}

// checkBatch refuses a micro-batch without inputs or labels.
func checkBatch(xs, labels []*tensors.Tensor) error {
	if len(xs) == 0 || len(labels) == 0 {
		return errors.New("zgomlx: no inputs or no labels")
	}
	for _, t := range append(append([]*tensors.Tensor(nil), xs...), labels...) {
		if t == nil {
			return errors.New("zgomlx: nil input or labels")
		}
	}
	return nil
}

// headLayerMajor reports whether the Net.Head runs layer-major: its
// table is a float32 lookup of its own layer that zinf streams (read and
// differentiated by rows there, so the head's gradient of the other rows
// is final after the head's backward) and no layer borrows it.
func (t *Trainer) headLayerMajor() bool {
	v := t.ex.head.table
	return v.lookup >= 0 && t.ex.rowGrad(v) && (*zinfSource)(t).byRows(v) && !v.shared
}

// ActivationStats are the counters of the Trainer's activation tier (the
// layer inputs of layer-major steps): zero before the first such step.
func (t *Trainer) ActivationStats() zinf.ActivationStats {
	if t.acts == nil {
		return zinf.ActivationStats{}
	}
	return t.acts.Stats()
}

// activations opens the Trainer's activation tier at its first
// layer-major step.
func (t *Trainer) activations() (*zinf.Activations, error) {
	if t.acts != nil {
		return t.acts, nil
	}
	a, err := t.off.rt.OpenActivations(actChunkBytes)
	if err != nil {
		return nil, fmt.Errorf("zgomlx: activation tier: %w", err)
	}
	t.acts = a
	return a, nil
}

// saveInputs hands layer l's inputs of micro-batch m to the tier, in
// chunks.
func (t *Trainer) saveInputs(ctx context.Context, l, m int, in []*tensors.Tensor) error {
	meta := actMeta{shapes: make([]shapes.Shape, len(in))}
	c := 0
	for i, x := range in {
		meta.shapes[i] = x.Shape()
		_, b, err := layerexec.Shared(t.ex.backend, x)
		if err != nil {
			return fmt.Errorf("zgomlx: layer %q input %d: %w", t.off.scopes[l], i, err)
		}
		for len(b) > 0 {
			n := min(len(b), actChunkBytes)
			if err := t.acts.Save(ctx, l, m*actStride+c, b[:n]); err != nil {
				return fmt.Errorf("zgomlx: saving layer %q's inputs of micro-batch %d: %w", t.off.scopes[l], m, err)
			}
			b = b[n:]
			c++
		}
	}
	t.actMeta[[2]int{l, m}] = meta
	return nil
}

// loadInputs takes layer l's inputs of micro-batch m back from the tier
// into new tensors (the caller's to finalize).
func (t *Trainer) loadInputs(ctx context.Context, l, m int) ([]*tensors.Tensor, error) {
	key := [2]int{l, m}
	meta, ok := t.actMeta[key]
	if !ok {
		return nil, fmt.Errorf("zgomlx: layer %q's inputs of micro-batch %d were not saved", t.off.scopes[l], m)
	}
	delete(t.actMeta, key)
	out := make([]*tensors.Tensor, 0, len(meta.shapes))
	c := 0
	for i, sh := range meta.shapes {
		x, err := tensors.FromShapeForBackend(t.ex.backend, 0, sh)
		if err == nil {
			var b []byte
			if _, b, err = layerexec.Shared(t.ex.backend, x); err == nil {
				if int64(len(b)) != int64(sh.ByteSize()) {
					err = fmt.Errorf("%d bytes for shape %s", len(b), sh)
				}
				for len(b) > 0 && err == nil {
					var n int
					if n, err = t.acts.Load(ctx, l, m*actStride+c, b); err == nil {
						b = b[n:]
						c++
					}
					if n == 0 && err == nil {
						err = errors.New("an empty chunk")
					}
				}
			}
			if err != nil {
				layerexec.Finalize(x)
			}
		}
		if err != nil {
			finalizeAll(out)
			return nil, fmt.Errorf("zgomlx: loading layer %q's input %d of micro-batch %d: %w", t.off.scopes[l], i, m, err)
		}
		out = append(out, x)
	}
	return out, nil
}

// actGradBase is the first chunk index of the borrowed gradients kept
// for a variable's own layer under (that layer, micro-batch): after the
// layer's own inputs' chunks.
const actGradBase = actStride / 4

// defGrad is a borrowed variable's gradient of one micro-batch kept in
// the tier until its own layer's backward pass: chunks from first.
type defGrad struct {
	v             *Var
	first, chunks int
}

// saveGrad hands a borrower's gradient of v (micro-batch m) to the tier,
// as fp32, under v's own layer; it returns where it went.
func (t *Trainer) saveGrad(ctx context.Context, v *Var, m, first int, x *tensors.Tensor) (defGrad, error) {
	_, b, err := layerexec.Shared(t.ex.backend, x)
	if err != nil {
		return defGrad{}, fmt.Errorf("zgomlx: gradient of %q: %w", v.Name, err)
	}
	if len(b) != v.numel*v.dtype.Size() {
		return defGrad{}, fmt.Errorf("zgomlx: gradient of %q has %d bytes, the variable %d", v.Name, len(b), v.numel*v.dtype.Size())
	}
	if v.dtype != swapper.Float32 {
		g := t.gradScratch(v.numel)
		buffers.Decode(v.dtype, g, b)
		b = buffers.AsBytes(g)
	}
	d := defGrad{v: v, first: first}
	for len(b) > 0 {
		n := min(len(b), actChunkBytes)
		if err := t.acts.Save(ctx, v.Layer, m*actStride+first+d.chunks, b[:n]); err != nil {
			return defGrad{}, fmt.Errorf("zgomlx: keeping a gradient of %q (micro-batch %d) for its layer: %w", v.Name, m, err)
		}
		b = b[n:]
		d.chunks++
	}
	return d, nil
}

// loadGrad takes a kept gradient of micro-batch m back (fp32, in the
// Trainer's scratch: valid until the next call).
func (t *Trainer) loadGrad(ctx context.Context, d defGrad, m int) ([]float32, error) {
	g := t.gradScratch(d.v.numel)
	b := buffers.AsBytes(g)
	for c := range d.chunks {
		n, err := t.acts.Load(ctx, d.v.Layer, m*actStride+d.first+c, b)
		if err == nil && n == 0 {
			err = errors.New("an empty chunk")
		}
		if err != nil {
			return nil, fmt.Errorf("zgomlx: a kept gradient of %q (micro-batch %d): %w", d.v.Name, m, err)
		}
		b = b[n:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("zgomlx: a kept gradient of %q (micro-batch %d): %d bytes short", d.v.Name, m, len(b))
	}
	return g, nil
}

// gradScratch is n float32s of the Trainer's (reused).
func (t *Trainer) gradScratch(n int) []float32 {
	if cap(t.lmScratch) < n {
		t.lmScratch = make([]float32, n)
	}
	return t.lmScratch[:n]
}

// lmPending is a layer's backward outputs of one micro-batch whose
// gradients are not yet handed over.
type lmPending struct {
	layer, micro int
	outs         []*tensors.Tensor
	k            int // the first gradient in outs (after the dxs)
}

// runLayerMajor is a step's forward and backward passes, layer-major
// (see StepMicroBatches); it returns the micro-batches' losses. The
// executors run on a worker goroutine while this one swaps the next
// layer in, saves and loads activations and hands gradients over, as in
// loop.run.
func (t *Trainer) runLayerMajor(ctx context.Context, mbs []MicroBatch) (losses []float32, err error) {
	src := (*zinfSource)(t)
	lp := &t.lp
	ex := t.ex
	layers := ex.layers
	L, k := len(layers), len(mbs)
	acts, err := t.activations()
	if err != nil {
		return nil, err
	}
	if t.actMeta == nil {
		t.actMeta = map[[2]int]actMeta{}
	}
	jobs, results := make(chan job), make(chan result)
	done := make(chan struct{})
	go func() {
		defer close(done)
		work(jobs, results)
	}()
	// The head's passes (loop.call1) run their blocks on the same worker.
	lp.jobs, lp.results = jobs, results
	lp.layerMajor = true
	he := ex.head
	var hs []*tensors.Tensor // the head's inputs: the last layer's outputs
	busy := false            // a job is on the worker
	cur := make([][]*tensors.Tensor, k)
	owned := make([]bool, k) // cur[m] holds tensors of ours (not the caller's inputs)
	dys := make([][]*tensors.Tensor, k)
	// pend is a micro-batch's backward outputs whose gradients are not
	// handed over yet; pend2 the next micro-batch's of the same layer,
	// when the two go over as a pair (see pairs).
	var pend, pend2 lmPending
	var next []*tensors.Tensor // the next micro-batch's inputs, loaded ahead
	// deferred are the gradients of borrowed variables the tier keeps
	// until their own layer's backward pass, by (that layer, micro-batch),
	// in the borrowers' backward order; next0 is the next free chunk index.
	deferred := map[[2]int][]defGrad{}
	next0 := map[[2]int]int{}
	batches := make([][]*tensors.Tensor, k)
	for m, mb := range mbs {
		batches[m] = mb.Inputs
	}
	t.lm = lmState{k: k}
	ex.batches, ex.inputs = batches, mbs[0].Inputs
	drop := func(p *lmPending) {
		for i := p.k; i < len(p.outs); i++ {
			layerexec.Finalize(p.outs[i])
		}
		*p = lmPending{}
	}
	defer func() {
		if busy {
			r := <-results
			finalizeAll(r.outs)
		}
		close(jobs) // every job started was waited for
		<-done
		lp.jobs = nil
		lp.layerMajor = false
		ex.batches, ex.inputs = nil, nil
		finalizeAll(hs)
		if he != nil {
			he.hold = nil
		}
		for m, c := range cur {
			if owned[m] {
				finalizeAll(c)
			}
		}
		for _, d := range dys {
			finalizeAll(d)
		}
		finalizeAll(next)
		drop(&pend)
		drop(&pend2)
		clear(t.actMeta)
		acts.Reset()
		if err != nil {
			// Give the step up before the layer begun ends, so that its
			// held gradients are dropped, not written.
			if src.fail(err) && !errors.Is(err, ErrNotPure) && !strings.Contains(err.Error(), ErrNotPure.Error()) {
				err = fmt.Errorf("%w: %w", ErrStepAborted, err)
			}
		}
		t.endOpen()
		t.lm = lmState{}
	}()
	call := func(e *graph.Exec, args ...[]*tensors.Tensor) {
		var a []any
		for _, ts := range args {
			for _, x := range ts {
				a = append(a, x)
			}
		}
		jobs <- job{exec: e, args: a}
		busy = true
	}
	wait := func(l int) ([]*tensors.Tensor, error) {
		r := <-results
		busy = false
		lp.took(l, r.took)
		return r.outs, r.err
	}

	// Forward: every micro-batch through layer l, then layer l+1.
	lp.backward = false
	inF, outF := make([]int, L), make([]int, L)
	for m, mb := range mbs {
		cur[m] = mb.Inputs
	}
	src.startPass(true)
	if err := src.bind(ctx, 0); err != nil {
		return nil, err
	}
	for l, le := range layers {
		inF[l] = floats(cur[0])
		for m := range k {
			le.nIn = len(cur[m])
			call(le.fwd, cur[m])
			var serr, berr error
			if l > 0 {
				serr = t.saveInputs(ctx, l, m, cur[m]) // read while the worker reads it too
			}
			ahead := !lp.serial && m == k-1 && l+1 < L
			if ahead {
				berr = src.bind(ctx, l+1) // the next layer's swap-in, while this one computes
			}
			out, cerr := wait(l)
			if cerr != nil || serr != nil || berr != nil {
				finalizeAll(out)
				src.unbind(l)
				if berr == nil && ahead {
					src.unbind(l + 1)
				}
				switch {
				case cerr != nil:
					return nil, fmt.Errorf("zgomlx: forward of layer %q (micro-batch %d): %w", le.layer.Scope, m, cerr)
				case serr != nil:
					return nil, serr
				}
				return nil, berr
			}
			if owned[m] {
				finalizeAll(cur[m])
			}
			cur[m], owned[m] = out, true
		}
		outF[l] = floats(cur[0])
		src.unbind(l)
		if lp.serial && l+1 < L {
			if err := src.bind(ctx, l+1); err != nil {
				return nil, err
			}
		}
	}

	// A Net.Head: every micro-batch's logits from one read of the table;
	// the last layer's outputs are kept for the head's backward.
	if he != nil {
		hs = make([]*tensors.Tensor, k)
		for m := range k {
			if len(cur[m]) != 1 {
				return nil, fmt.Errorf("zgomlx: Net.Head needs one output of the last layer %q, it has %d", layers[L-1].layer.Scope, len(cur[m]))
			}
			hs[m] = cur[m][0]
			cur[m], owned[m] = nil, false
		}
		logits, err := lp.headForwardAll(ctx, hs)
		if err != nil {
			return nil, err
		}
		for m := range k {
			cur[m], owned[m] = []*tensors.Tensor{logits[m]}, true
		}
	}

	// The loss of every micro-batch, and its gradients.
	losses = make([]float32, k)
	ex.nOut = len(cur[0])
	for m := range k {
		call(ex.loss, cur[m], mbs[m].Labels)
		lo, err := wait(-1)
		finalizeAll(cur[m])
		cur[m], owned[m] = nil, false
		if err != nil {
			return nil, fmt.Errorf("zgomlx: loss (micro-batch %d): %w", m, err)
		}
		losses[m], err = lp.scalar(lo[0])
		layerexec.Finalize(lo[0])
		dys[m] = lo[1:]
		if err != nil {
			return nil, err
		}
	}

	// handOverVar hands micro-batch p.micro's gradient of variable i of
	// layer p.layer to zinf: a borrowed variable's is kept for its own
	// layer; a variable of the layer gets the borrowers' of that
	// micro-batch first, then its own (the micro-batch-major order).
	handOverVar := func(p *lmPending, i int) error {
		le := layers[p.layer]
		v := le.vars[i]
		ex.inputs = mbs[p.micro].Inputs // the rows of a lookup's gradient
		if i >= le.own {
			key := [2]int{v.Layer, p.micro}
			first, ok := next0[key]
			if !ok {
				first = actGradBase
			}
			d, err := t.saveGrad(ctx, v, p.micro, first, p.outs[p.k+i])
			if err != nil {
				return err
			}
			deferred[key] = append(deferred[key], d)
			next0[key] = first + d.chunks
			return nil
		}
		for _, d := range deferred[[2]int{p.layer, p.micro}] {
			if d.v != v {
				continue
			}
			g, err := t.loadGrad(ctx, d, p.micro)
			if err != nil {
				return err
			}
			if err := src.grad(ctx, v, g, false, false); err != nil {
				return err
			}
		}
		return lp.grad(ctx, v, p.outs[p.k+i], p.micro == k-1, v.lookup >= 0)
	}
	// handOver hands micro-batch p.micro's gradients of layer p.layer to
	// zinf, and with q (the next micro-batch's of the same layer) q's: a
	// variable whose two gradients need nothing else (its own, float32,
	// not a lookup's, no borrowers' kept for it) gets both in one pass
	// over its sum (zinf.Runtime.AccumulateGradPair), every other one p's
	// then q's. After the layer's last micro-batch its update starts.
	handOver := func(p, q *lmPending) error {
		if p.outs == nil {
			return nil
		}
		defer drop(p)
		if q != nil && q.outs == nil {
			q = nil
		}
		if q != nil {
			defer drop(q)
		}
		le := layers[p.layer]
		for i, v := range le.vars {
			if q != nil && i < le.own && v.lookup < 0 && v.dtype == swapper.Float32 &&
				!hasDeferred(deferred[[2]int{p.layer, p.micro}], v) && !hasDeferred(deferred[[2]int{q.layer, q.micro}], v) {
				if err := lp.gradPair(ctx, src, v, p.outs[p.k+i], q.outs[q.k+i]); err != nil {
					return err
				}
				continue
			}
			if err := handOverVar(p, i); err != nil {
				return err
			}
			if q != nil {
				if err := handOverVar(q, i); err != nil {
					return err
				}
			}
		}
		delete(deferred, [2]int{p.layer, p.micro})
		last := p.micro == k-1
		if q != nil {
			delete(deferred, [2]int{q.layer, q.micro})
			last = q.micro == k-1
		}
		if last {
			return src.layerDone(ctx, p.layer)
		}
		return nil
	}
	// pairs: a layer's micro-batches are handed over two at a time, each
	// pair while the worker computes the micro-batch after it: every
	// gradient sum is read and written once for two micro-batches instead
	// of once for each (the sums are the adapter's largest memory traffic
	// beside the backend's own), for one more micro-batch's gradients in
	// memory at a time. Not with one layer resident (lp.serial).
	pairs := !lp.serial
	// flush hands over what is pending, a pair or one.
	flush := func() error {
		if pend.outs == nil {
			return nil
		}
		err := handOver(&pend, &pend2)
		pend, pend2 = lmPending{}, lmPending{}
		return err
	}

	// Backward: every micro-batch through layer l (its weights swapped in
	// once, its gradients summed in pinned memory), then layer l-1.
	src.startPass(false)
	lp.backward = true
	readAheadTables(ctx, src, true)
	if he != nil {
		// The head's backward: the table read once more in blocks, the
		// gradient of the rows the lookups name held for the first layer
		// (headHold), each micro-batch's dh its last layer's dy.
		if err := he.holdLookupRows(ex.backend, batches); err != nil {
			return nil, err
		}
		dls := make([]*tensors.Tensor, k)
		for m := range k {
			dls[m] = dys[m][0]
		}
		dhs, err := lp.headBackwardAll(ctx, hs, dls)
		if err != nil {
			return nil, err
		}
		finalizeAll(hs)
		hs = nil
		for m := range k {
			finalizeAll(dys[m])
			dys[m] = []*tensors.Tensor{dhs[m]}
		}
	}
	needs := func(l int) bool { return outF[l] > 0 && layers[l].needsBackward(inF[l]) }
	t.lm.hold = true
	// Unless one layer at a time is resident (lp.serial), the next layer
	// of the pass is swapped in and begun while the last micro-batch of
	// this one computes (bound), as the forward pass does; this layer's
	// last gradients are then handed over, and the layer ended, while the
	// next one's first micro-batch computes (prev). Both layers are begun
	// meanwhile, each holding its own gradient sums.
	bound, prev := -1, -1
	// unbindAll releases the swap-in buffers of every layer still bound
	// (on an error: the deferred cleanup ends the layers begun).
	unbindAll := func(l int) {
		for _, b := range []int{l, bound, prev} {
			if b >= 0 {
				src.unbind(b)
			}
		}
		bound, prev = -1, -1
	}
	for l := L - 1; l >= 0; l-- {
		le := layers[l]
		if !needs(l) {
			for m := range dys {
				finalizeAll(dys[m])
				dys[m] = nil
			}
			continue
		}
		if bound != l {
			if err := src.bind(ctx, l); err != nil {
				unbindAll(-1)
				return nil, err
			}
		}
		bound = -1
		input := func(m int) ([]*tensors.Tensor, error) {
			if l == 0 {
				return mbs[m].Inputs, nil
			}
			return t.loadInputs(ctx, l, m)
		}
		in, err := input(0)
		if err != nil {
			unbindAll(l)
			return nil, err
		}
		for m := range k {
			nf := floats(in)
			var gerr error
			if lp.serial {
				// One layer's gradients at a time: the previous ones
				// handed over (their buffers freed) before this backward.
				if gerr = flush(); gerr != nil {
					if l > 0 {
						finalizeAll(in)
					}
					unbindAll(l)
					return nil, gerr
				}
			}
			le.nIn = len(in)
			call(le.bwd, in, dys[m])
			readAheadTables(ctx, src, true) // while it computes
			// While it computes: the previous micro-batch's gradients
			// handed over (the previous layer's last, which ends it), the
			// next layer swapped in at the last micro-batch, the next
			// micro-batch's inputs loaded.
			var berr, lerr error
			if !lp.serial && !(pairs && pend.outs != nil && pend2.outs == nil && pend.layer == l) {
				// (A micro-batch of this layer alone waits for the next
				// one: the two go over as a pair.)
				gerr = flush()
				if p := prev; p >= 0 && gerr == nil {
					// (On an error it stays begun: the step is given
					// up before it ends, its sums dropped.)
					prev = -1
					src.unbind(p)
					t.endOpenLayer(p) // its held gradient sums are written behind
				}
			}
			if !lp.serial && m == k-1 && l > 0 && needs(l-1) && gerr == nil {
				if berr = src.bind(ctx, l-1); berr == nil {
					bound = l - 1
				}
			}
			if m+1 < k && gerr == nil && berr == nil {
				next, lerr = input(m + 1)
			}
			outs, cerr := wait(l)
			finalizeAll(dys[m])
			dys[m] = nil
			if l > 0 {
				finalizeAll(in)
			}
			in, next = next, nil
			if cerr == nil {
				if pend.outs == nil {
					pend = lmPending{layer: l, micro: m, outs: outs, k: nf}
				} else {
					pend2 = lmPending{layer: l, micro: m, outs: outs, k: nf}
				}
				dys[m] = outs[:nf]
			}
			if cerr != nil || gerr != nil || lerr != nil || berr != nil {
				if l > 0 {
					finalizeAll(in)
				}
				unbindAll(l)
				switch {
				case cerr != nil:
					return nil, fmt.Errorf("zgomlx: backward of layer %q (micro-batch %d): %w", le.layer.Scope, m, cerr)
				case gerr != nil:
					return nil, gerr
				case berr != nil:
					return nil, berr
				}
				return nil, lerr
			}
		}
		if bound >= 0 {
			prev = l // handed over and ended under the next layer's compute
			continue
		}
		err = flush()
		src.unbind(l)
		if err != nil {
			return nil, err
		}
		t.endOpenLayer(l) // the layer's held gradient sums are written behind
	}
	if err := acts.Flush(ctx); err != nil {
		return nil, fmt.Errorf("zgomlx: activation tier: %w", err)
	}
	return losses, nil
}

// endOpen ends every layer a layer-major backward pass began and holds.
func (t *Trainer) endOpen() {
	for _, l := range t.lm.open {
		t.off.rt.EndLayer(l)
	}
	t.lm.open = t.lm.open[:0]
}

// endOpenLayer ends layer l if the backward pass began and holds it: its
// held gradient sums are written behind.
func (t *Trainer) endOpenLayer(l int) {
	if i := slices.Index(t.lm.open, l); i >= 0 {
		t.off.rt.EndLayer(l)
		t.lm.open = slices.Delete(t.lm.open, i, i+1)
	}
}

// hasDeferred reports whether ds holds a borrower's gradient of v.
func hasDeferred(ds []defGrad, v *Var) bool {
	for _, d := range ds {
		if d.v == v {
			return true
		}
	}
	return false
}
