package reference

import (
	"context"
	"errors"
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/internal/backendinfo"
	"github.com/zinfio/zinf/contrib/gomlx/internal/inmemory"
	"github.com/zinfio/zinf/plan"
	zopt "github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// MemoryTrainer trains a Net the way zgomlx.Trainer does — the same
// per-layer executors in the same order, zinf's Adam (optimizer.Adam) on
// fp32 master weights, parameters stored in the config's param dtype —
// with every variable and state in Go memory. It is the reference
// offloaded training is compared with (bit for bit) and timed against.
// Its variables are the Store's own values, updated in place, so the
// Store is current after every step. Its methods are for one goroutine;
// an error in the middle of a step (a broken layer function) leaves it
// mid-step.
type MemoryTrainer struct {
	run   inmemory.Run
	vars  []inmemory.Var
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
	master  []float32 // aliases the value's bytes when the variable and its storage are fp32
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
// the variables as for zgomlx.Register (Layers defaults to net.Scopes());
// opts.Runtime.Logger is where a portable build of a SIMD-capable machine
// is said. The rest of opts is the offloaded Trainer's.
func NewMemoryTrainer(backend compute.Backend, store *model.Store, net zgomlx.Net, cfg *config.Config, opts zgomlx.Options) (*MemoryTrainer, error) {
	if net.Head != nil {
		return nil, fmt.Errorf("zgomlx: Net.Head (a head in blocks of %q): MemoryTrainer does not run it; its in-memory reference is WholeGraph", net.Head.Table)
	}
	if err := inmemory.Check(net); err != nil {
		return nil, err
	}
	if err := mirrorable(cfg); err != nil {
		return nil, err
	}
	backendinfo.WarnPortable(opts.Runtime.Logger, backend)
	mt := &MemoryTrainer{hyper: plan.Hyper(cfg), storage: plan.ParamDType(cfg)}
	mt.hyper.EnsureDefaults()
	run, vars, err := inmemory.Open(backend, store, net, opts.Filter, opts.Layers, mt.grad)
	if err != nil {
		return nil, err
	}
	mt.run, mt.vars, mt.state = run, vars, make([]memState, len(vars))
	for i, v := range vars {
		st := &mt.state[i]
		n := len(v.Bytes) / v.DType.Size()
		// As zinf's Init: the master is the value in fp32, the parameter
		// the master in the storage dtype.
		if v.DType == tensor.Float32 && mt.storage == tensor.Float32 {
			st.master, st.aliased = buffers.Float32Bytes(v.Bytes), true
		} else {
			st.master = make([]float32, n)
			buffers.Decode(v.DType, st.master, v.Bytes)
			if v.DType != mt.storage {
				st.enc = make([]byte, n*mt.storage.Size())
			}
			mt.writeParam(i)
		}
		st.m, st.v = make([]float32, n), make([]float32, n)
	}
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

// writeParam stores variable i's master into its value, through the
// storage dtype.
func (mt *MemoryTrainer) writeParam(i int) {
	v, st := mt.vars[i], &mt.state[i]
	if st.aliased {
		return
	}
	if st.enc == nil {
		buffers.Encode(v.DType, v.Bytes, st.master)
		return
	}
	buffers.Encode(mt.storage, st.enc, st.master)
	buffers.Transcode(mt.storage, st.enc, v.DType, v.Bytes)
}

// Step is one training step on a batch (the last micro-step after
// Accumulate calls); it returns the loss.
func (mt *MemoryTrainer) Step(ctx context.Context, x, labels *tensors.Tensor) (float32, error) {
	loss, err := mt.run.Step(ctx, one(x), one(labels), true)
	if err != nil {
		return loss, err
	}
	mt.steps++
	return loss, nil
}

// Accumulate is a micro-step that is not the step's last.
func (mt *MemoryTrainer) Accumulate(ctx context.Context, x, labels *tensors.Tensor) (float32, error) {
	return mt.run.Step(ctx, one(x), one(labels), false)
}

// Gradients runs forward and backward on a batch with the per-layer
// executors and returns the loss and every registered variable's
// gradient (fp32), without stepping.
func (mt *MemoryTrainer) Gradients(ctx context.Context, x, labels *tensors.Tensor) (float32, map[string][]float32, error) {
	mt.collect = map[string][]float32{}
	defer func() { mt.collect = nil }()
	loss, err := mt.run.Step(ctx, one(x), one(labels), false)
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
// LayerCompute, as zgomlx.Trainer.Timings counts them); the fields that
// time zinf's calls are zero, as the MemoryTrainer makes none. With the
// wall time of a step it says what the step spent besides compute (the
// optimizer's updates in Go memory).
func (mt *MemoryTrainer) Timings() zgomlx.Timings {
	total, per := mt.run.Compute()
	return zgomlx.Timings{Compute: total, LayerCompute: per}
}

// Close frees the executors (the Store keeps its values).
func (mt *MemoryTrainer) Close() { mt.run.Close() }

// grad takes variable i's gradient of a micro-step: kept (Gradients),
// summed into the step's, or, on the step's last micro-step, the Adam
// update of the variable.
func (mt *MemoryTrainer) grad(i int, g []float32, last bool) error {
	v := mt.vars[i]
	if mt.collect != nil {
		if acc, ok := mt.collect[v.Name]; ok {
			accumulate(acc, g) // a tied variable's other use
		} else {
			mt.collect[v.Name] = append([]float32(nil), g...)
		}
		return nil
	}
	st := &mt.state[i]
	if !last {
		if !st.has {
			if st.acc == nil {
				st.acc = make([]float32, len(st.m))
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
	zopt.Adam(st.master, g, st.m, st.v, mt.steps+1, mt.hyper)
	mt.writeParam(i)
	return nil
}

// accumulate is zinf's gradient accumulation: acc[i] + g[i] in float32.
func accumulate(acc, g []float32) {
	g = g[:len(acc)]
	for i := range acc {
		acc[i] = acc[i] + g[i]
	}
}

// one is a tensor as a list.
func one(t *tensors.Tensor) []*tensors.Tensor { return []*tensors.Tensor{t} }
