package zgomlx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/swapper"
)

// ErrStepAborted is returned (wrapped with the cause) when a micro-step
// fails before its commit: the step is given up (with the gradients of
// its earlier micro-steps) and the model is as the last commit left it;
// run the step again from its first micro-step.
var ErrStepAborted = errors.New("zgomlx: step given up; run it again from its first micro-step")

// paramSource is where a loop's registered variables come from and where
// their gradients go: zinf (Trainer) or Go memory (reference.MemoryTrainer). Both
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
	// step's last micro-step, so v's gradient is final; rows says it is
	// the gradient of v's lookup (Layer.Lookups) in its own layer, zero
	// outside the rows the batch's ids name.
	grad(ctx context.Context, v *Var, g []float32, last, rows bool) error
	// layerDone: every gradient of layer l is final (last micro-step).
	layerDone(ctx context.Context, l int) error
	// readBlocks reads v in blocks of whole rows, in order, into dst,
	// calling fn with each block's first row and rows (Net.Head).
	readBlocks(ctx context.Context, v *Var, dst []byte, fn func(row, rows int) error) error
	// wantsRows reports whether v's lookup gradient goes to gradRowSums
	// (else to grad, whole, with rows false).
	wantsRows(v *Var) bool
	// gradRowSums hands over v's lookup gradient of this micro-step as
	// the sums of the rows the batch's ids name: rows sorted and unique,
	// sums row after row (see loop.lookupGrad).
	gradRowSums(ctx context.Context, v *Var, rows []int, sums []float32) error
	// gradRange hands over v's gradient for elements [lo, lo+len(g))
	// of this micro-step (zero elsewhere), as grad with last false.
	gradRange(ctx context.Context, v *Var, lo int, g []float32) error
	// readAhead is called as a backward pass starts and as each layer's
	// backward computes; last says it is the step's last micro-step. A
	// source may start reads the step's updates will need
	// (Options.ReadAheadTables).
	readAhead(ctx context.Context, last bool)
	// fail is called when a micro-step fails before its commit, with the
	// error; it reports whether the step was given up (the model is as
	// before). An error saying the last step's update failed after its
	// commit returned (zinf.ErrUpdateFailed) gives nothing up: that step
	// is retried by Commit, this one run again.
	fail(err error) bool
}

// loop runs micro-steps of a Net over a paramSource with per-layer
// executors: forward layer by layer (keeping each layer's inputs), the
// loss and its gradients, then backward from the last layer, each layer
// recomputed and differentiated (its variables' gradients handed over
// as they are produced).
//
// The executors run on a worker goroutine, one at a time in the order
// above; the loop's goroutine, the only one that talks to the
// paramSource (and so to zinf), meanwhile binds the next layer (its
// swap-in) and hands over the previous layer's gradients. Compute and
// those waits overlap; results are the same bits as running them in turn.
type loop struct {
	ex      *executors
	src     paramSource
	acts    [][]*tensors.Tensor
	scratch []float32 // widens bf16/fp16 gradients
	// ids, rows, sums and dense are lookupGrad's: a lookup's ids, the
	// rows they name, their gradients' sums, and the whole gradient for a
	// source that takes it whole.
	ids     []int
	rows    []int
	sums    []float32
	dense   []float32
	jobs    chan job
	results chan result
	outF    []int // float outputs per layer
	// outs are the last layer's outputs of a modeForward run.
	outs []*tensors.Tensor
	// compute sums the executors' run time (forward, loss, backward), as
	// the worker measured each call; layerCompute is the part of it spent
	// in each layer's forward and backward calls (index: Net.Layers).
	compute      time.Duration
	layerCompute []time.Duration
	// lmCompute is the part of compute in a layer-major step's forward
	// pass (its loss included) and backward pass; layerMajor says that
	// such a step runs, backward which pass (runLayerMajor sets both).
	lmCompute  [2]time.Duration
	layerMajor bool
	backward   bool
	// serial (Options.OneLayerResident): a layer is bound after the one
	// before it computed, and a layer's gradients are handed over before
	// the next backward runs, so one layer's weights and one layer's
	// gradients are in Go memory at a time.
	serial bool
}

// took counts an executor call's run time in compute and, for a layer's
// call (l >= 0; the loss and a blocked head pass -1), in the layer's.
func (lp *loop) took(l int, d time.Duration) {
	lp.compute += d
	switch {
	case lp.layerMajor && lp.backward:
		lp.lmCompute[1] += d
	case lp.layerMajor:
		lp.lmCompute[0] += d
	}
	if l < 0 {
		return
	}
	if l >= len(lp.layerCompute) {
		lp.layerCompute = append(lp.layerCompute, make([]time.Duration, l+1-len(lp.layerCompute))...)
	}
	lp.layerCompute[l] += d
}

// job is one executor call for the worker.
type job struct {
	exec *graph.Exec
	args []any
}

type result struct {
	outs []*tensors.Tensor
	err  error
	took time.Duration // the call's run time
}

// work runs jobs until the channel closes.
func work(jobs <-chan job, results chan<- result) {
	for j := range jobs {
		var r result
		t0 := time.Now()
		end := zinf.BeginCompute() // zinf's background work gives way to the backend's workers
		r.outs, r.err = j.exec.Call(j.args...)
		end()
		r.took = time.Since(t0)
		results <- r
	}
}

// pending is a layer's backward outputs whose gradients are not yet
// handed over.
type pending struct {
	layer int
	outs  []*tensors.Tensor
	k     int // the first gradient in outs (after the dxs)
}

// listOf is a tensor as a list (nil as a list with nil, refused by run).
func listOf(t *tensors.Tensor) []*tensors.Tensor { return []*tensors.Tensor{t} }

// floats counts the float tensors of ts.
func floats(ts []*tensors.Tensor) int {
	n := 0
	for _, t := range ts {
		if t.DType().IsFloat() {
			n++
		}
	}
	return n
}

// mode is what a run computes.
type mode int

const (
	modeTrain   mode = iota // forward, loss, backward
	modeLoss                // forward and loss
	modeForward             // forward only: the last layer's outputs
)

// run is one micro-step (modeTrain); it returns the loss. modeLoss stops
// after the loss, modeForward after the last layer (its outputs are left
// in lp.outs, the caller's to free).
func (lp *loop) run(ctx context.Context, xs, labels []*tensors.Tensor, last bool, md mode) (loss float32, err error) {
	if len(xs) == 0 || (md != modeForward && len(labels) == 0) {
		return 0, fmt.Errorf("zgomlx: no inputs or no labels")
	}
	for _, t := range append(append([]*tensors.Tensor(nil), xs...), labels...) {
		if t == nil {
			return 0, fmt.Errorf("zgomlx: nil input or labels")
		}
	}
	if lp.jobs == nil {
		lp.jobs, lp.results = make(chan job), make(chan result)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		work(lp.jobs, lp.results)
	}()
	layers := lp.ex.layers
	L := len(layers)
	acts := append(lp.acts[:0], xs)
	var dy []*tensors.Tensor
	var pend pending
	lp.outs = nil
	lp.ex.inputs = xs
	defer func() {
		lp.ex.inputs = nil
		close(lp.jobs) // every job started was waited for
		<-done
		lp.jobs = nil
		// acts[0] is the caller's; the others are ours.
		for i := 1; i < len(acts); i++ {
			if i == len(acts)-1 && i >= L && md == modeForward && err == nil {
				continue // handed over in lp.outs
			}
			finalizeAll(acts[i])
			acts[i] = nil
		}
		finalizeAll(dy)
		lp.drop(&pend)
		lp.acts = acts[:0]
		if err != nil && md == modeTrain {
			// A layer that cannot be recomputed fails every retry: the
			// step is given up, but the error says why, not "retry".
			if lp.src.fail(err) && !errors.Is(err, ErrNotPure) && !strings.Contains(err.Error(), ErrNotPure.Error()) {
				err = fmt.Errorf("%w: %w", ErrStepAborted, err)
			}
		}
	}()
	call := func(e *graph.Exec, args ...[]*tensors.Tensor) {
		var a []any
		for _, ts := range args {
			for _, t := range ts {
				a = append(a, t)
			}
		}
		lp.jobs <- job{exec: e, args: a}
	}
	wait := func(l int) ([]*tensors.Tensor, error) {
		r := <-lp.results
		lp.took(l, r.took)
		return r.outs, r.err
	}

	lp.src.startPass(true)
	if err := lp.src.bind(ctx, 0); err != nil {
		return 0, err
	}
	for l, le := range layers {
		if lp.serial && l > 0 {
			if err := lp.src.bind(ctx, l); err != nil {
				return 0, err
			}
		}
		le.nIn = len(acts[l])
		call(le.fwd, acts[l])
		var berr error
		ahead := !lp.serial && l+1 < L
		if ahead {
			berr = lp.src.bind(ctx, l+1) // the next layer's swap-in, while this one computes
		}
		out, err := wait(l)
		lp.src.unbind(l)
		if err != nil || berr != nil {
			if berr == nil && ahead {
				lp.src.unbind(l + 1)
			}
			finalizeAll(out)
			if err != nil {
				return 0, fmt.Errorf("zgomlx: forward of layer %q: %w", le.layer.Scope, err)
			}
			return 0, berr
		}
		acts = append(acts, out)
	}
	top := L // the predictions: the last layer's outputs, or Net.Head's logits
	if lp.ex.head != nil {
		if len(acts[L]) != 1 {
			return 0, fmt.Errorf("zgomlx: Net.Head needs one output of the last layer %q, it has %d", layers[L-1].layer.Scope, len(acts[L]))
		}
		logits, err := lp.headForward(ctx, acts[L][0])
		if err != nil {
			return 0, err
		}
		acts = append(acts, []*tensors.Tensor{logits})
		top = L + 1
	}
	if md == modeForward {
		lp.outs = acts[top]
		return 0, nil
	}
	lp.ex.nOut = len(acts[top])
	call(lp.ex.loss, acts[top], labels)
	lo, err := wait(-1)
	if err != nil {
		return 0, fmt.Errorf("zgomlx: loss: %w", err)
	}
	loss, err = lp.scalar(lo[0])
	layerexec.Finalize(lo[0])
	dy = lo[1:]
	if err != nil || md == modeLoss {
		return loss, err
	}
	// A layer runs backward when it has float outputs (gradients come
	// back) and float inputs or variables (gradients go out).
	if cap(lp.outF) < L {
		lp.outF = make([]int, L)
	}
	outF := lp.outF[:L]
	for l := range L {
		outF[l] = floats(acts[l+1])
	}
	if top > L {
		finalizeAll(acts[top])
		acts[top] = nil
	}

	lp.src.startPass(false)
	lp.src.readAhead(ctx, last)
	needs := func(l int) bool { return outF[l] > 0 && layers[l].needsBackward(floats(acts[l])) }
	if needs(L - 1) {
		if err := lp.src.bind(ctx, L-1); err != nil {
			return 0, err
		}
	}
	if top > L {
		// The head's backward: the table's gradient handed over block by
		// block, h's gradient the last layer's output gradient.
		dh, err := lp.headBackward(ctx, acts[L][0], dy[0])
		finalizeAll(dy)
		dy = nil
		if err != nil {
			if needs(L - 1) {
				lp.src.unbind(L - 1)
			}
			return 0, err
		}
		dy = []*tensors.Tensor{dh}
	}
	finalizeAll(acts[L])
	acts[L] = nil
	for l := L - 1; l >= 0; l-- {
		le := layers[l]
		in := acts[l]
		nf := floats(in) // before in is freed
		if !needs(l) {
			finalizeAll(dy)
			dy = nil
			continue
		}
		if lp.serial && l < L-1 {
			// The previous layer's gradients handed over (their buffers
			// freed), then this layer's swap-in, before it computes.
			if err := lp.handOver(ctx, &pend, last); err != nil {
				return 0, err
			}
			if err := lp.src.bind(ctx, l); err != nil {
				return 0, err
			}
		}
		le.nIn = len(in)
		call(le.bwd, in, dy)
		lp.src.readAhead(ctx, last) // while it computes
		// While it computes: the next layer's swap-in, and the previous
		// layer's gradients handed over (its update started).
		next := l - 1
		var berr, gerr error
		if !lp.serial && next >= 0 && needs(next) {
			berr = lp.src.bind(ctx, next)
		} else {
			next = -1
		}
		if !lp.serial {
			gerr = lp.handOver(ctx, &pend, last)
		}
		outs, err := wait(l)
		lp.src.unbind(l)
		finalizeAll(dy)
		dy = nil
		if l > 0 {
			finalizeAll(in)
			acts[l] = nil
		}
		if err == nil {
			pend = pending{layer: l, outs: outs, k: nf}
			dy = outs[:nf]
		}
		if err != nil || berr != nil || gerr != nil {
			if berr == nil && next >= 0 {
				lp.src.unbind(next)
			}
			switch {
			case err != nil:
				return 0, fmt.Errorf("zgomlx: backward of layer %q: %w", le.layer.Scope, err)
			case gerr != nil:
				return 0, gerr
			}
			return 0, berr
		}
	}
	if err := lp.handOver(ctx, &pend, last); err != nil {
		return 0, err
	}
	return loss, nil
}

// handOver hands a layer's gradients to the paramSource (and, on the
// last micro-step, starts its update), then frees them. A borrowed
// variable's gradient is never final here: its own layer's comes later
// in the backward pass.
func (lp *loop) handOver(ctx context.Context, p *pending, last bool) error {
	if p.outs == nil {
		return nil
	}
	defer lp.drop(p)
	le := lp.ex.layers[p.layer]
	for i, v := range le.vars {
		if err := lp.grad(ctx, v, p.outs[p.k+i], last && i < le.own, i < le.own && v.lookup >= 0); err != nil {
			return err
		}
	}
	if last {
		return lp.src.layerDone(ctx, p.layer)
	}
	return nil
}

// drop frees a pending layer's gradients (its dxs, if any, are the
// loop's dy by then and freed with it).
func (lp *loop) drop(p *pending) {
	for i := p.k; i < len(p.outs); i++ {
		layerexec.Finalize(p.outs[i])
	}
	*p = pending{}
}

// grad hands a gradient tensor over as fp32: a view of its buffer when it
// is fp32, widened into the loop's scratch otherwise; nothing is
// allocated in steady state.
func (lp *loop) grad(ctx context.Context, v *Var, t *tensors.Tensor, last, rows bool) error {
	if rows && lp.ex.layers[v.Layer].gatheredRows(v) { // only rowGrad variables are gathered by rows
		return lp.lookupGrad(ctx, v, t, last)
	}
	b, err := lp.gradBytes(v, t)
	if err != nil {
		return err
	}
	if v.dtype == swapper.Float32 {
		return lp.src.grad(ctx, v, buffers.Float32Bytes(b), last, rows)
	}
	if cap(lp.scratch) < v.numel {
		lp.scratch = make([]float32, v.numel)
	}
	g := lp.scratch[:v.numel]
	buffers.Decode(v.dtype, g, b)
	return lp.src.grad(ctx, v, g, last, rows)
}

// gradBytes is the bytes of v's gradient t, checked against v's size.
func (lp *loop) gradBytes(v *Var, t *tensors.Tensor) ([]byte, error) {
	_, b, err := layerexec.Shared(lp.ex.backend, t)
	if err != nil {
		return nil, fmt.Errorf("zgomlx: gradient of %q: %w", v.Name, err)
	}
	if len(b) != v.numel*v.dtype.Size() {
		return nil, fmt.Errorf("zgomlx: gradient of %q has %d bytes, the variable %d", v.Name, len(b), v.numel*v.dtype.Size())
	}
	return b, nil
}

// gradPair hands over a float32 variable's gradients of two consecutive
// micro-batches of a layer-major step, a then b, in one pass over its sum
// (zinfSource.gradPair).
func (lp *loop) gradPair(ctx context.Context, src *zinfSource, v *Var, a, b *tensors.Tensor) error {
	if v.dtype != swapper.Float32 {
		return fmt.Errorf("zgomlx: gradients of %q handed over as a pair: %s, not float32", v.Name, v.dtype)
	}
	ab, err := lp.gradBytes(v, a)
	if err != nil {
		return err
	}
	bb, err := lp.gradBytes(v, b)
	if err != nil {
		return err
	}
	return src.gradPair(ctx, v, buffers.Float32Bytes(ab), buffers.Float32Bytes(bb))
}

// lookupGrad hands over the gradient of lookup v from t, the gradient of
// its Gather's output (executors.rowGrad, layerExec.gatheredRows): one row of the table's length
// per id of the batch's input v.lookup, in the ids' order. Each row's sum
// starts at zero and adds the ids' rows in that order, in float32: what
// the graph's ScatterSum into a zero table computes, bit for bit. A source
// that reads the table by rows gets the sums of the rows used; another the
// whole gradient, zero elsewhere.
func (lp *loop) lookupGrad(ctx context.Context, v *Var, t *tensors.Tensor, last bool) error {
	if v.lookup >= len(lp.ex.inputs) {
		return fmt.Errorf("zgomlx: lookup %q reads its rows from input %d; the batch has %d inputs", v.Name, v.lookup, len(lp.ex.inputs))
	}
	ids, err := idsOf(lp.ex.backend, lp.ex.inputs[v.lookup], lp.ids[:0])
	lp.ids = ids[:0]
	if err != nil {
		return fmt.Errorf("zgomlx: lookup %q: input %d: %w", v.Name, v.lookup, err)
	}
	_, b, err := layerexec.Shared(lp.ex.backend, t)
	if err != nil {
		return fmt.Errorf("zgomlx: gradient of %q: %w", v.Name, err)
	}
	width := v.Shape.Dimensions[1]
	rowsOf := v.Shape.Dimensions[0]
	d := buffers.Float32Bytes(b)
	if len(d) != len(ids)*width {
		return fmt.Errorf("zgomlx: gradient of lookup %q has %d values for %d ids of %d", v.Name, len(d), len(ids), width)
	}
	for _, r := range ids {
		if r < 0 || r >= rowsOf {
			return fmt.Errorf("zgomlx: lookup %q: id %d outside the table's %d rows", v.Name, r, rowsOf)
		}
	}
	rows := append(lp.rows[:0], ids...)
	lp.rows = rows[:0]
	slices.Sort(rows)
	rows = slices.Compact(rows)
	need := len(rows) * width
	if cap(lp.sums) < need {
		lp.sums = make([]float32, need)
	}
	sums := lp.sums[:need]
	clear(sums)
	for p, id := range ids {
		i, _ := slices.BinarySearch(rows, id)
		acc, g := sums[i*width:(i+1)*width], d[p*width:(p+1)*width]
		for j := range acc {
			acc[j] = acc[j] + g[j]
		}
	}
	if lp.src.wantsRows(v) {
		return lp.src.gradRowSums(ctx, v, rows, sums)
	}
	if cap(lp.dense) < v.numel {
		lp.dense = make([]float32, v.numel)
	}
	dense := lp.dense[:v.numel]
	clear(dense)
	for i, r := range rows {
		copy(dense[r*width:(r+1)*width], sums[i*width:(i+1)*width])
	}
	return lp.src.grad(ctx, v, dense, last, false)
}

// idsOf appends the row ids of t (Int32 or Int64, any shape), in its
// element order, to ids.
func idsOf(backend compute.Backend, t *tensors.Tensor, ids []int) ([]int, error) {
	_, b, err := layerexec.Shared(backend, t)
	if err != nil {
		return ids, err
	}
	switch t.DType() {
	case dtypes.Int32:
		for i := 0; i+4 <= len(b); i += 4 {
			ids = append(ids, int(int32(binary.LittleEndian.Uint32(b[i:]))))
		}
	case dtypes.Int64:
		for i := 0; i+8 <= len(b); i += 8 {
			ids = append(ids, int(int64(binary.LittleEndian.Uint64(b[i:]))))
		}
	default:
		return ids, fmt.Errorf("the ids are %s (allowed: Int32, Int64)", t.DType())
	}
	return ids, nil
}

// finalizeAll frees tensors now (nil entries are fine).
func finalizeAll(ts []*tensors.Tensor) {
	for _, t := range ts {
		layerexec.Finalize(t)
	}
}

// scalar reads a scalar float tensor without copying it to Go.
func (lp *loop) scalar(t *tensors.Tensor) (float32, error) {
	return layerexec.Scalar(lp.ex.backend, t)
}
