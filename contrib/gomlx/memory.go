package zgomlx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/internal/backendinfo"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
	zopt "github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// MemoryTrainer trains a Net the way Trainer does — the same per-layer
// executors in the same order, zinf's Adam (optimizer.Adam) on fp32
// master weights, parameters stored in the config's param dtype — with
// every variable and state in Go memory. It is the reference offloaded
// training is compared with (bit for bit) and timed against. Its
// variables are the Store's own values, updated in place, so the Store is
// current after every step. Its methods are for one goroutine; an error
// in the middle of a step (a broken layer function) leaves it mid-step.
type MemoryTrainer struct {
	ex    *executors
	lp    loop
	store *model.Store
	vars  []*Var
	hyper zopt.Hyper
	// storage is the dtype zinf would store parameters in; when a
	// variable's dtype differs, its values are rounded through it.
	storage tensor.DType
	state   []memState
	steps   int
	// Gradients mode (collect instead of stepping).
	collect map[string][]float32
}

type memState struct {
	buf     compute.Buffer
	bytes   []byte    // the variable's value, in its dtype
	master  []float32 // aliases bytes when the variable and its storage are fp32
	aliased bool
	m, v    []float32
	acc     []float32 // gradients of earlier micro-steps
	has     bool
	enc     []byte // the master encoded in the storage dtype, when rounding through it
}

// NewMemoryTrainer builds net's executors over store's variables, which
// must have values; cfg gives the optimizer's hyperparameters
// (plan.Hyper) and the param dtype (bf16.enabled / fp16.enabled), as
// zinf.Open would take them. opts.Filter and opts.Layers select and group
// the variables as for Register (Layers defaults to net.Scopes()).
func NewMemoryTrainer(backend compute.Backend, store *model.Store, net Net, cfg *config.Config, opts Options) (*MemoryTrainer, error) {
	if net.Head != nil {
		return nil, fmt.Errorf("zgomlx: Net.Head (a head in blocks of %q): MemoryTrainer does not run it; its in-memory reference is WholeGraph", net.Head.Table)
	}
	if err := net.check(); err != nil {
		return nil, err
	}
	if err := mirrorable(cfg); err != nil {
		return nil, err
	}
	backendinfo.WarnPortable(opts.Runtime.Logger, backend)
	if len(opts.Layers) == 0 {
		opts.Layers, opts.also = net.Scopes(), net.also()
	}
	vars, scopes, err := collectVars(store, opts.Filter, opts.Layers, opts.also)
	if err != nil {
		return nil, err
	}
	byName := map[string]*Var{}
	for _, v := range vars {
		byName[v.Name] = v
	}
	ex, err := newExecutors(backend, store, net, groupLayers(vars, len(scopes)), byName)
	if err != nil {
		return nil, err
	}
	mt := &MemoryTrainer{ex: ex, store: store, vars: vars, hyper: plan.Hyper(cfg), storage: plan.ParamDType(cfg), state: make([]memState, len(vars))}
	mt.hyper.EnsureDefaults()
	for i, v := range vars {
		val, err := v.v.Value()
		if err != nil {
			return nil, fmt.Errorf("zgomlx: variable %q: %w", v.Name, err)
		}
		st := &mt.state[i]
		if st.buf, st.bytes, err = bufferOf(backend, val); err != nil {
			return nil, fmt.Errorf("zgomlx: variable %q: %w", v.Name, err)
		}
		// As zinf's Init: the master is the value in fp32, the parameter
		// the master in the storage dtype.
		if v.dtype == tensor.Float32 && mt.storage == tensor.Float32 {
			st.master, st.aliased = buffers.Float32Bytes(st.bytes), true
		} else {
			st.master = make([]float32, v.numel)
			swapper.Decode(v.dtype, st.master, st.bytes)
			if v.dtype != mt.storage {
				st.enc = make([]byte, v.numel*mt.storage.Size())
			}
			mt.writeParam(v, st)
		}
		st.m, st.v = make([]float32, v.numel), make([]float32, v.numel)
		v.cur = st.buf
	}
	mt.lp = loop{ex: ex, src: (*memSource)(mt)}
	return mt, nil
}

// mirrorable refuses a config whose step the in-memory reference does not
// reproduce: it runs zinf's Adam (or AdamW) with a constant learning rate,
// nothing else of the optimizer step.
func mirrorable(cfg *config.Config) error {
	if cfg == nil {
		return errors.New("zgomlx: nil config")
	}
	var errs []error
	if t := cfg.Optimizer.Type; t != config.OptimizerAdam && t != config.OptimizerAdamW {
		errs = append(errs, fmt.Errorf("zgomlx: MemoryTrainer: optimizer.type %q (allowed: Adam, AdamW; zinf's Trainer runs the others)", t))
	}
	if cfg.Scheduler.Type != config.SchedulerNone {
		errs = append(errs, fmt.Errorf("zgomlx: MemoryTrainer: scheduler.type %q (allowed: none: the reference keeps optimizer.params.lr)", cfg.Scheduler.Type))
	}
	if cfg.GradientClipping != 0 {
		errs = append(errs, fmt.Errorf("zgomlx: MemoryTrainer: gradient_clipping %v (allowed: 0)", cfg.GradientClipping))
	}
	if cfg.FP16 {
		errs = append(errs, errors.New("zgomlx: MemoryTrainer: fp16.enabled true (allowed: false; use bf16)"))
	}
	return errors.Join(errs...)
}

// writeParam stores the master into the variable's value, through the
// storage dtype.
func (mt *MemoryTrainer) writeParam(v *Var, st *memState) {
	if st.aliased {
		return
	}
	if st.enc == nil {
		swapper.Encode(v.dtype, st.bytes, st.master)
		return
	}
	swapper.Encode(mt.storage, st.enc, st.master)
	swapper.Transcode(mt.storage, st.enc, v.dtype, st.bytes)
}

// Step is one training step on a batch (the last micro-step after
// Accumulate calls); it returns the loss.
func (mt *MemoryTrainer) Step(ctx context.Context, x, labels *tensors.Tensor) (float32, error) {
	loss, err := mt.lp.run(ctx, one(x), one(labels), true, modeTrain)
	if err != nil {
		return loss, err
	}
	mt.steps++
	return loss, nil
}

// Accumulate is a micro-step that is not the step's last.
func (mt *MemoryTrainer) Accumulate(ctx context.Context, x, labels *tensors.Tensor) (float32, error) {
	return mt.lp.run(ctx, one(x), one(labels), false, modeTrain)
}

// Gradients runs forward and backward on a batch with the per-layer
// executors and returns the loss and every registered variable's
// gradient (fp32), without stepping.
func (mt *MemoryTrainer) Gradients(ctx context.Context, x, labels *tensors.Tensor) (float32, map[string][]float32, error) {
	mt.collect = map[string][]float32{}
	defer func() { mt.collect = nil }()
	loss, err := mt.lp.run(ctx, one(x), one(labels), false, modeTrain)
	return loss, mt.collect, err
}

// State returns a variable's fp32 master weights and Adam moments (the
// Trainer's are zinf.Runtime.ReadOptimizerState).
func (mt *MemoryTrainer) State(name string) (master, expAvg, expAvgSq []float32, err error) {
	for i, v := range mt.vars {
		if v.Name == name {
			st := &mt.state[i]
			return st.master, st.m, st.v, nil
		}
	}
	return nil, nil, nil, fmt.Errorf("zgomlx: %q is not a trained variable", name)
}

// Steps returns the number of steps taken.
func (mt *MemoryTrainer) Steps() int { return mt.steps }

// Timings returns the executors' compute so far (Compute and
// LayerCompute, as Trainer.Timings counts them); the fields that time
// zinf's calls are zero, as the MemoryTrainer makes none. With the wall
// time of a step it says what the step spent besides compute (the
// optimizer's updates in Go memory).
func (mt *MemoryTrainer) Timings() Timings {
	tm := Timings{Compute: mt.lp.compute, LayerCompute: make([]time.Duration, len(mt.ex.layers))}
	copy(tm.LayerCompute, mt.lp.layerCompute)
	return tm
}

// Close frees the executors (the Store keeps its values).
func (mt *MemoryTrainer) Close() { mt.ex.close() }

// memSource is the MemoryTrainer as the loop's paramSource.
type memSource MemoryTrainer

func (s *memSource) startPass(bool) {}

func (s *memSource) bind(context.Context, int) error { return nil }

func (s *memSource) unbind(int) {}

func (s *memSource) grad(_ context.Context, v *Var, g []float32, last, _ bool) error {
	if s.collect != nil {
		if acc, ok := s.collect[v.Name]; ok {
			accumulate(acc, g) // a tied variable's other use
		} else {
			s.collect[v.Name] = append([]float32(nil), g...)
		}
		return nil
	}
	st := &s.state[v.idx]
	if !last {
		if !st.has {
			if st.acc == nil {
				st.acc = make([]float32, v.numel)
			}
			copy(st.acc, g)
			st.has = true
			return nil
		}
		accumulate(st.acc, g)
		return nil
	}
	if st.has {
		accumulate(st.acc, g)
		g = st.acc
		st.has = false
	}
	zopt.Adam(st.master, g, st.m, st.v, s.steps+1, s.hyper)
	(*MemoryTrainer)(s).writeParam(v, st)
	return nil
}

// accumulate is zinf's gradient accumulation: acc[i] + g[i] in float32.
func accumulate(acc, g []float32) {
	g = g[:len(acc)]
	for i := range acc {
		acc[i] = acc[i] + g[i]
	}
}

func (s *memSource) layerDone(context.Context, int) error { return nil }

func (s *memSource) fail(error) bool { return false }

func (s *memSource) readBlocks(context.Context, *Var, []byte, func(int, int) error) error {
	return errors.New("zgomlx: MemoryTrainer does not run Net.Head (its reference is WholeGraph)")
}

// wantsRows: the in-memory reference takes every gradient whole.
func (s *memSource) wantsRows(*Var) bool { return false }

func (s *memSource) gradRowSums(context.Context, *Var, []int, []float32) error {
	return errors.New("zgomlx: MemoryTrainer takes lookups' gradients whole")
}

func (s *memSource) gradRange(context.Context, *Var, int, []float32) error {
	return errors.New("zgomlx: MemoryTrainer does not run Net.Head (its reference is WholeGraph)")
}
