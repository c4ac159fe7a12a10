package zgomlx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/internal/backendinfo"
	"github.com/zinfio/zinf/contrib/gomlx/internal/gccredit"
)

// ErrCommitPending is returned (wrapped in the step's error) when a
// step's gradients are complete but its optimizer commit failed: nothing
// changed, the gradients are kept, and Commit runs the commit again (or
// Abort drops the step).
var ErrCommitPending = errors.New("zgomlx: the optimizer commit failed; call Commit again (or Abort)")

// Trainer trains a Net whose variables zinf holds: each layer's
// variables are swapped in straight into GoMLX tensors (reused buffers,
// no Go heap allocation in steady state) just before its executor runs,
// each gradient is handed to zinf as it is produced, each layer's Adam
// update starts while the backward pass goes on, and Step commits. Its
// methods are for one goroutine.
type Trainer struct {
	off   *Offload
	ex    *executors
	lp    loop
	pool  *slotPool
	owned bool // Close closes the Offload (Create made it)

	order   []int // the layers a pass reads from zinf
	pending bool  // a commit failed
	// headOrderSaid: StepMicroBatches logged that a Net.Head runs
	// micro-batch-major against the plan's layer-major pick.
	headOrderSaid bool
	reads         int64
	times         Timings

	// Row reads of lookups (lookup.go), reused.
	rows      []int
	rowBytes  []byte
	rowGrad   []float32
	bytesRead int64

	// Layer-major steps (layermajor.go): the step's state, the activation
	// tier (opened at the first) and how each entry was saved.
	lm        lmState
	acts      *zinf.Activations
	actMeta   map[[2]int]actMeta
	lmScratch []float32 // a kept gradient, widened or loaded
}

// lmState is what a layer-major step tells the paramSource: the step's
// micro-batches, whether a layer begun in bind stays begun (its
// gradients summed in pinned memory until its visit ends), and the layers
// begun and not ended (two at most: the backward pass begins the next
// layer while the last micro-batch of one computes).
type lmState struct {
	k    int
	hold bool
	open []int // the layers begun and held
}

// actMeta is how a layer's inputs of a micro-batch were saved: their
// shapes, in order.
type actMeta struct {
	shapes []shapes.Shape
}

// Timings are the time a Trainer's loop spent in zinf, summed over
// steps. Swap-ins and gradient hand-overs run while the worker goroutine
// computes the neighbouring layer, so they are hidden as long as they
// are shorter; the commit is not.
type Timings struct {
	// SwapIn is the time in swap-ins: waiting for a layer's parameters
	// (zinf.Runtime.BeginLayer) and copying them into the GoMLX buffers.
	SwapIn time.Duration
	// Grads is the time handing gradients over (AccumulateGrad copies
	// them into pinned memory; it waits when write-behind is behind).
	Grads time.Duration
	// StepLayer is the time starting each layer's update.
	StepLayer time.Duration
	// Commit is the time in the optimizer commit (zinf.Runtime.Step):
	// waiting for the updates still running, writing the last ones.
	Commit time.Duration
	// Compute is not zinf's: the time the layers' executors ran
	// (forward, loss, backward, each call timed where it runs), summed
	// over steps, evaluations and forward passes. Wall time minus Compute
	// is what the step waited for besides compute.
	Compute time.Duration
	// LayerCompute is the part of Compute spent in each layer's forward
	// and backward calls, indexed like Net.Layers (the loss and a
	// BlockedHead are in Compute only): with the bytes a layer moves, it
	// says whether a layer's compute can hide its I/O.
	LayerCompute []time.Duration
	// ForwardCompute and BackwardCompute are the parts of Compute in
	// the layer-major steps' forward passes (their losses included) and
	// backward passes, a blocked head's calls with their pass: what
	// zgomlx.Loop under gradient_accumulation_steps "auto" takes k from
	// (zinf.Runtime.MicroBatchesToHideIOPasses).
	ForwardCompute, BackwardCompute time.Duration
}

// Timings returns the time spent in zinf so far, and the executors'
// compute time.
func (t *Trainer) Timings() Timings {
	tm := t.times
	tm.Compute = t.lp.compute
	tm.LayerCompute = make([]time.Duration, len(t.ex.layers)) // a layer not run yet: 0
	copy(tm.LayerCompute, t.lp.layerCompute)
	tm.ForwardCompute, tm.BackwardCompute = t.lp.lmCompute[0], t.lp.lmCompute[1]
	return tm
}

// newTrainer builds net's per-layer executors over off's variables on
// backend, which must share its buffers with Go (the pure-Go backend).
// off must have been registered with one layer per Net layer, in order
// (Options.Layers = net.Scopes(), as Create registers it).
func newTrainer(backend compute.Backend, off *Offload, net Net) (*Trainer, error) {
	if off == nil {
		return nil, errors.New("zgomlx: nil Offload")
	}
	for i, l := range net.Layers {
		if i < len(off.scopes) && cleanScope(l.Scope) != off.scopes[i] {
			return nil, fmt.Errorf("zgomlx: Net.Layers[%d] has scope %q, the Offload's layer %d %q (register with Options.Layers = net.Scopes())", i, l.Scope, i, off.scopes[i])
		}
	}
	if err := checkTrainer(backend, off.rt.Config); err != nil {
		return nil, err
	}
	ex, err := newExecutors(backend, off.store, net, off.layerVars, off.byName)
	if err != nil {
		return nil, err
	}
	if h := net.Head; h != nil && !off.rt.Streamed(h.Table) {
		ex.close()
		return nil, fmt.Errorf("zgomlx: Net.Head.Table %q is not streamed by zinf (a tensor larger than zinf.Options.PieceBytes is): a table that small needs no blocks (borrow it whole: Layer.Borrow)", h.Table)
	}
	for _, v := range off.vars {
		if v.shared && !v.ownClass {
			v.class, v.ownClass = off.classes, true
			off.classes++
		}
	}
	t := &Trainer{off: off, ex: ex, pool: newSlotPool(backend, off.classes)}
	t.pool.spare, off.spare = off.spare, nil
	t.lp = loop{ex: ex, src: (*zinfSource)(t), serial: off.oneLayer}
	return t, nil
}

// open is Create for a Store whose variables have values: Register,
// one layer per Net layer, and a Trainer for net; Close closes both. On
// error the Store keeps its values.
func open(ctx context.Context, backend compute.Backend, cfg *config.Config, store *model.Store, net Net, opts Options) (*Trainer, error) {
	if err := net.check(); err != nil {
		return nil, err
	}
	if err := checkTrainer(backend, cfg); err != nil {
		return nil, err
	}
	backendinfo.WarnPortable(opts.Runtime.Logger, backend)
	opts.Layers, opts.also = net.Scopes(), net.also()
	off, err := Register(ctx, cfg, store, opts)
	if err != nil {
		return nil, err
	}
	t, err := newTrainer(backend, off, net)
	if err != nil {
		if !opts.KeepValues {
			if rerr := off.Restore(ctx); rerr != nil {
				err = errors.Join(err, fmt.Errorf("zgomlx: giving the Store its values back: %w", rerr))
			}
		}
		off.Close()
		return nil, err
	}
	t.owned = true
	return t, nil
}

// Offload returns the registered variables and their runtime.
func (t *Trainer) Offload() *Offload { return t.off }

// Step runs one training step on a batch: forward, loss, backward
// (gradients to zinf as they come, each layer's update started), and the
// optimizer commit. It returns the batch's loss. After Accumulate calls it
// is the step's last micro-step.
//
// It is all or nothing: on an error before the commit (a swap-in that
// fails, a full disk under a gradient write) the step is given up
// (gradients of earlier micro-steps too, see zinf.Runtime.AbortStep) and
// the model is as before, so the step may be run again from its first
// micro-step; an error of the commit itself wraps ErrCommitPending:
// nothing changed, the gradients are kept, and Commit retries it, with
// the fault-free result.
func (t *Trainer) Step(ctx context.Context, x, labels *tensors.Tensor) (float32, error) {
	if t.pending {
		return 0, ErrCommitPending
	}
	loss, err := t.lp.run(ctx, listOf(x), listOf(labels), true, modeTrain)
	if err != nil {
		return loss, t.updateFailed(err)
	}
	return loss, t.Commit(ctx)
}

// updateFailed turns the error of a micro-step, a forward pass or an
// evaluation that ran into the last step's update failing after its
// commit returned (zinf.overlap_update: the update runs on under the next
// forward pass; zinf.ErrUpdateFailed) into ErrCommitPending: nothing of
// that step was committed, its gradients are kept, Commit runs it again,
// and then the call that failed is made again (a Step from its first
// micro-step). Other errors are returned as they are.
func (t *Trainer) updateFailed(err error) error {
	if !errors.Is(err, zinf.ErrUpdateFailed) {
		return err
	}
	t.pending = true
	t.off.version++ // what the failed call read was the failed step's
	t.pool.unkeepAll()
	return fmt.Errorf("%w: %w", ErrCommitPending, err)
}

// Forward runs the model's forward pass on inputs xs (the first layer's),
// streaming each layer's weights from zinf as training does, and returns
// the last layer's outputs (the caller's to finalize). It computes no
// gradient and changes nothing; it needs no Restore, so it works for a
// model larger than memory. Call it between steps.
func (t *Trainer) Forward(ctx context.Context, xs ...*tensors.Tensor) ([]*tensors.Tensor, error) {
	if t.pending {
		return nil, ErrCommitPending
	}
	if _, err := t.lp.run(ctx, xs, nil, false, modeForward); err != nil {
		return nil, t.updateFailed(err)
	}
	outs := t.lp.outs
	t.lp.outs = nil
	return outs, nil
}

// EvalLoss is the loss of a batch, the weights streamed from zinf as by
// Forward: evaluation on held-out data, with no gradient and no change.
func (t *Trainer) EvalLoss(ctx context.Context, x, labels *tensors.Tensor) (float32, error) {
	if t.pending {
		return 0, ErrCommitPending
	}
	loss, err := t.lp.run(ctx, listOf(x), listOf(labels), false, modeLoss)
	return loss, t.updateFailed(err)
}

// Accumulate runs a micro-step that is not the step's last: its
// gradients are added to zinf's, and no update starts.
func (t *Trainer) Accumulate(ctx context.Context, x, labels *tensors.Tensor) (float32, error) {
	if t.pending {
		return 0, ErrCommitPending
	}
	loss, err := t.lp.run(ctx, listOf(x), listOf(labels), false, modeTrain)
	return loss, t.updateFailed(err)
}

// Commit runs (or, after ErrCommitPending, runs again) the optimizer
// commit of the step whose last micro-step Step ran.
func (t *Trainer) Commit(ctx context.Context) error {
	t0 := time.Now()
	err := t.off.rt.Step(ctx)
	t.times.Commit += time.Since(t0)
	if err != nil {
		t.pending = true
		return fmt.Errorf("%w: %w", ErrCommitPending, err)
	}
	t.pending = false
	t.off.version++
	gccredit.Adjust()
	return nil
}

// Abort gives up the step in progress (after ErrCommitPending, say):
// its gradients are dropped and the model stays as the last commit left
// it.
func (t *Trainer) Abort() {
	t.off.rt.AbortStep()
	t.pending = false
	t.pool.unkeepAll()
}

// SwapBufferBytes is the Go memory the swap-in buffers hold (about the
// largest layer's variables, by shape), a Net.Head's block buffers
// included.
func (t *Trainer) SwapBufferBytes() int64 {
	n := t.pool.bytes
	if t.ex.head != nil {
		n += t.ex.head.pool.bytes
	}
	return n
}

// ParamBytesRead counts the bytes copied from zinf into swap-in buffers:
// a lookup (Layer.Lookups) that zinf streams counts only the rows its
// batches used.
func (t *Trainer) ParamBytesRead() int64 { return t.bytesRead }

// ParamReads counts the variables copied from zinf into swap-in buffers
// (a layer whose values are still in its buffers is not read).
func (t *Trainer) ParamReads() int64 { return t.reads }

// Close frees the executors and buffers, and the Offload when Create made
// it.
func (t *Trainer) Close() error {
	if t.acts != nil {
		_ = t.acts.Close() // before the runtime; it holds nothing between steps
		t.acts = nil
	}
	t.ex.close()
	t.pool.close()
	if t.owned {
		return t.off.Close()
	}
	return nil
}

// zinfSource is the Trainer as the loop's paramSource.
type zinfSource Trainer

func (s *zinfSource) startPass(forward bool) {
	o := s.off
	L := len(o.scopes)
	s.pool.unkeepAll()
	s.order = s.order[:0]
	for i := range L {
		l := i
		if !forward {
			l = L - 1 - i
		}
		vars := o.layerVars[l]
		hit := true
		for _, v := range vars {
			if !v.holds(o.version) {
				hit = false
				break
			}
		}
		if hit {
			for _, v := range vars {
				v.slot.keep = true
			}
			continue
		}
		s.order = append(s.order, l)
	}
	o.rt.Pass(s.order)
}

func (s *zinfSource) bind(ctx context.Context, l int) error {
	o := s.off
	vars := o.layerVars[l]
	all := s.ex.layers[l].vars // own, then borrowed
	read := false
	var whole []*Var // borrowed lookups their own layer read by rows
	for i, v := range all {
		sl, ok, err := s.pool.acquire(v, o.version)
		if err != nil {
			s.pool.release(all)
			return err
		}
		if i >= len(vars) && !ok && s.byRows(v) && sl.owner == v {
			whole = append(whole, v)
		} else if i >= len(vars) && !ok {
			// A borrowed variable is swapped in with its own, earlier,
			// layer and stays in its buffer (a slot class of its own).
			sl.forget()
			s.pool.release(all)
			return fmt.Errorf("zgomlx: layer %q borrows %q, which is not in its swap-in buffer (its layer %q runs first in every pass)", o.scopes[l], v.Name, o.scopes[v.Layer])
		}
		sl.keep = false
		v.cur = sl.buf
		read = read || !ok
	}
	if !read && !(s.lm.hold && s.lm.k > 1) {
		return nil
	}
	// A layer-major backward pass of k > 1 micro-batches begins its layer
	// even when its weights are still in their buffers (the last layer,
	// right after its forward): the begun layer is what holds its
	// micro-batches' gradient sums in pinned memory, else each
	// micro-batch's gradient would be written and read back (k-1 more of
	// each a step). Beginning it reads its weights once more, as the
	// plan counts (a read per layer and pass).
	t0 := time.Now()
	defer func() { s.times.SwapIn += time.Since(t0) }()
	if s.lm.hold {
		// A layer-major backward pass: the layer stays begun until its
		// micro-batches' gradients are handed over (summed in pinned
		// memory); runLayerMajor ends it.
		if err := o.rt.BeginLayerMicroBatches(ctx, l, s.lm.k); err != nil {
			s.pool.release(all)
			return fmt.Errorf("zgomlx: swap-in of layer %q: %w", o.scopes[l], err)
		}
		s.lm.open = append(s.lm.open, l)
	} else {
		if err := o.rt.BeginLayer(ctx, l); err != nil {
			s.pool.release(all)
			return fmt.Errorf("zgomlx: swap-in of layer %q: %w", o.scopes[l], err)
		}
		defer o.rt.EndLayer(l) // the values are in GoMLX buffers: zinf's can go
	}
	for _, v := range whole {
		if err := s.readWhole(ctx, v); err != nil {
			v.slot.forget()
			s.pool.release(all)
			return fmt.Errorf("zgomlx: swap-in of %q (borrowed by %q): %w", v.Name, o.scopes[l], err)
		}
		s.reads++
	}
	for _, v := range vars {
		if v.slot.version == o.version {
			continue
		}
		if s.byRows(v) {
			read, err := s.readRows(ctx, v)
			if err != nil {
				v.slot.forget()
				s.pool.release(all)
				return fmt.Errorf("zgomlx: swap-in of the rows of %q: %w", v.Name, err)
			}
			if read {
				s.reads++
			}
			continue
		}
		if err := o.rt.ReadParamBytes(ctx, v.Name, v.dtype, v.slot.bytes); err != nil {
			v.slot.forget()
			s.pool.release(all)
			return fmt.Errorf("zgomlx: swap-in of %q: %w", v.Name, err)
		}
		v.slot.version = o.version
		s.reads++
		s.bytesRead += int64(len(v.slot.bytes))
	}
	return nil
}

func (s *zinfSource) unbind(l int) { s.pool.release(s.ex.layers[l].vars) }

func (s *zinfSource) grad(ctx context.Context, v *Var, g []float32, _, rows bool) error {
	t0 := time.Now()
	var err error
	if rows && s.byRows(v) {
		err = s.gradRows(ctx, v, g)
	} else {
		err = s.off.rt.AccumulateGrad(ctx, v.Name, g)
	}
	s.times.Grads += time.Since(t0)
	if err != nil {
		return fmt.Errorf("zgomlx: gradient of %q: %w", v.Name, err)
	}
	return nil
}

// gradPair is grad of a, then of b (two micro-batches of a layer-major
// step), in one pass over the sum (zinf.Runtime.AccumulateGradPair).
func (s *zinfSource) gradPair(ctx context.Context, v *Var, a, b []float32) error {
	t0 := time.Now()
	err := s.off.rt.AccumulateGradPair(ctx, v.Name, a, b)
	s.times.Grads += time.Since(t0)
	if err != nil {
		return fmt.Errorf("zgomlx: gradients of %q: %w", v.Name, err)
	}
	return nil
}

func (s *zinfSource) layerDone(ctx context.Context, l int) error {
	t0 := time.Now()
	err := s.off.rt.StepLayer(ctx, l)
	s.times.StepLayer += time.Since(t0)
	return err
}

func (s *zinfSource) readBlocks(ctx context.Context, v *Var, dst []byte, fn func(row, rows int) error) error {
	t0 := time.Now()
	var inFn time.Duration
	err := s.off.rt.ReadParamBlocks(ctx, v.Name, v.dtype, dst, func(row, rows int) error {
		s.bytesRead += int64(rows * s.off.rt.RowLen(v.Name) * v.dtype.Size())
		t1 := time.Now()
		defer func() { inFn += time.Since(t1) }()
		return fn(row, rows)
	})
	s.times.SwapIn += time.Since(t0) - inFn
	return err
}

func (s *zinfSource) gradRange(ctx context.Context, v *Var, lo int, g []float32) error {
	t0 := time.Now()
	err := s.off.rt.AccumulateGradRange(ctx, v.Name, lo, g)
	s.times.Grads += time.Since(t0)
	return err
}

func (s *zinfSource) readAhead(ctx context.Context, last bool) { readAheadTables(ctx, s, last) }

func (s *zinfSource) fail(err error) bool {
	s.pool.unkeepAll()
	if errors.Is(err, zinf.ErrUpdateFailed) {
		return false // the last step's: Commit retries it (see Trainer.updateFailed)
	}
	s.off.rt.AbortStep()
	return true
}

// checkTrainer refuses what a Trainer cannot run, before anything is
// registered.
func checkTrainer(backend compute.Backend, cfg *config.Config) error {
	if err := checkBackend(backend); err != nil {
		return err
	}
	if cfg != nil && cfg.FP16 {
		// fp16 training scales the loss (zinf.Runtime.LossScale) so its
		// gradients do not underflow; this loop does not.
		return errors.New("zgomlx: fp16.enabled true: the Trainer does not apply fp16 loss scaling (allowed: fp32 or bf16 params; an Offload of fp16 variables can still be registered and read)")
	}
	return nil
}
