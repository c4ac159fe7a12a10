package zgomlx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/internal/gccredit"
	"github.com/zinfio/zinf/tensor"
)

// Offload is a model.Store's variables registered with a zinf.Runtime:
// zinf owns their values (on NVMe or in pinned memory, as the config and
// the plan say), their fp32 master copies and Adam states. Its methods
// are for one goroutine (the training loop's).
type Offload struct {
	rt        *zinf.Runtime
	log       *slog.Logger // Options.Runtime.Logger, else slog.Default()
	store     *model.Store
	vars      []*Var
	byName    map[string]*Var
	scopes    []string
	layerVars [][]*Var
	classes   int
	released  bool
	// version counts the parameter values: it moves at every committed
	// step and checkpoint load, so swap-in buffers know when they are
	// stale. It starts at 1 (a fresh buffer holds version 0).
	version uint64
	// credit is the heap credit held (Options.HeapCredit), creditStatus
	// what became of the request.
	credit       int64
	creditStatus string
	// oneLayer is Options.OneLayerResident.
	oneLayer bool
	// readAhead is Options.ReadAheadTables.
	readAhead bool
	// spare are swap-in buffers Create made before initializing the
	// layers (spareRowTables); newTrainer gives them to its slot pool.
	spare []*slot
}

// Register hands a Store's variables to zinf: it describes them (the
// path is the tensor name, the shape and layer kept) to zinf.Open, gives
// each its value from the Store with Runtime.Init, and then, unless
// Options.KeepValues, releases the values from the Store. Every variable
// selected must have a value. Register is all or nothing: on error the
// runtime is closed and the Store is as it was.
func Register(ctx context.Context, cfg *config.Config, store *model.Store, opts Options) (*Offload, error) {
	vars, scopes, err := collectVars(store, opts.Filter, opts.Layers, opts.also)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, v := range vars {
		if !v.v.HasValue() {
			errs = append(errs, fmt.Errorf("zgomlx: variable %q has no value (initialize the Store first, e.g. with zgomlx.Initialize or store.InitializeVariables, or let zgomlx.Create initialize it layer by layer)", v.Name))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	o, err := openOffload(cfg, store, vars, scopes, opts)
	if err != nil {
		return nil, err
	}
	for _, v := range vars {
		if err := o.initFrom(ctx, v, v.v); err != nil {
			o.rt.Close()
			return nil, err
		}
	}
	if !opts.KeepValues {
		if err := o.release(vars); err != nil {
			o.rt.Close()
			return nil, err
		}
	}
	o.applyHeapCredit(opts.HeapCredit)
	return o, nil
}

// openOffload describes vars to zinf.Open.
func openOffload(cfg *config.Config, store *model.Store, vars []*Var, scopes []string, opts Options) (*Offload, error) {
	if err := checkHeapCredit(opts.HeapCredit); err != nil {
		return nil, err
	}
	o := &Offload{store: store, vars: vars, byName: map[string]*Var{}, scopes: scopes, version: 1, log: opts.Runtime.Logger,
		oneLayer: opts.OneLayerResident, readAhead: opts.ReadAheadTables}
	if o.log == nil {
		o.log = slog.Default()
	}
	o.layerVars = groupLayers(vars, len(scopes))
	descs := make([][]tensor.Desc, len(scopes))
	for _, v := range vars {
		o.byName[v.Name] = v
		o.classes = max(o.classes, v.class+1)
		descs[v.Layer] = append(descs[v.Layer], tensor.Desc{Name: v.Name, Shape: v.Shape.Dimensions})
	}
	rt, err := zinf.Open(cfg, zinf.LayeredModel(descs...), opts.Runtime)
	if err != nil {
		return nil, err
	}
	o.rt = rt
	return o, nil
}

// initFrom gives v its initial values in zinf from src's value (v's own
// variable, or its twin in a scratch Store).
func (o *Offload) initFrom(ctx context.Context, v *Var, src *model.Variable) error {
	val, err := src.Value()
	if err != nil {
		return fmt.Errorf("zgomlx: variable %q: %w", v.Name, err)
	}
	if !val.Shape().Equal(v.Shape) {
		return fmt.Errorf("zgomlx: variable %q: value of shape %s, registered %s", v.Name, val.Shape(), v.Shape)
	}
	err = val.ConstBytes(func(b []byte) {
		if v.dtype == tensor.Float32 {
			err = o.rt.Init(ctx, v.Name, buffers.Float32Bytes(b))
			return
		}
		wide := make([]float32, v.numel)
		buffers.Decode(v.dtype, wide, b)
		err = o.rt.Init(ctx, v.Name, wide)
	})
	if err != nil {
		return fmt.Errorf("zgomlx: register %q: %w", v.Name, err)
	}
	return nil
}

// release drops the values of vars from the Store (it keeps the shapes).
// Until Restore or Close, GoMLX's default initializer refuses to run for
// the Store (offloadedStores): a model.Exec over it would otherwise give
// the released variables fresh random values and run on them.
func (o *Offload) release(vars []*Var) error {
	for _, v := range vars {
		if err := v.v.Reset(); err != nil {
			return fmt.Errorf("zgomlx: releasing %q from the Store: %w", v.Name, err)
		}
	}
	o.released = true
	offloadedStores.Store(o.store, o)
	return nil
}

// ErrOffloaded is the error (a panic in graph building, which model.Exec
// returns as its error) of a GoMLX executor that would initialize a
// variable of a Store whose values zinf holds.
var ErrOffloaded = errors.New("zgomlx: the Store's variable values are in zinf, not in the Store (use Trainer.Forward or Trainer.EvalLoss, which stream them from zinf, or Offload.Restore to bring every value back into memory)")

// offloadedStores are the Stores whose registered variables' values zinf
// holds (released), each with its Offload.
var offloadedStores sync.Map

// init wraps GoMLX's default variable initializer (the one every Scope
// takes unless given another) so that it refuses to initialize a
// variable of a Store in offloadedStores, naming a released variable: a
// model.Exec over an offloaded Store initializes the variables it finds
// without a value, which would run the model on random weights. Stores
// not offloaded initialize as before.
func init() {
	prev := model.DefaultInitializer
	model.DefaultInitializer = func(store *model.Store) model.VariableInitializer {
		base := prev(store)
		return func(g *graph.Graph, shape shapes.Shape) *graph.Node {
			if o, ok := offloadedStores.Load(store); ok {
				off := o.(*Offload)
				name := ""
				for _, v := range off.vars {
					if !v.v.HasValue() {
						name = v.Name
						break
					}
				}
				panic(fmt.Errorf("a GoMLX executor is initializing a variable of shape %s of a Store whose variables zinf holds (%q among them): %w", shape, name, ErrOffloaded))
			}
			return base(g, shape)
		}
	}
}

// Runtime returns the zinf runtime (metrics, plan, reservations, the
// layer below).
func (o *Offload) Runtime() *zinf.Runtime { return o.rt }

// Store returns the model.Store the variables came from.
func (o *Offload) Store() *model.Store { return o.store }

// Vars returns the registered variables in zinf order (by layer, then
// creation order).
func (o *Offload) Vars() []Var {
	out := make([]Var, len(o.vars))
	for i, v := range o.vars {
		out[i] = Var{Name: v.Name, Shape: v.Shape, Layer: v.Layer}
	}
	return out
}

// Layers returns the number of layers.
func (o *Offload) Layers() int { return len(o.scopes) }

// LayerScope returns layer l's scope path.
func (o *Offload) LayerScope(l int) string { return o.scopes[l] }

// StateBytes is what zinf holds for the registered variables: the
// parameters in the param dtype, the fp32 master weights, both Adam
// moments and the fp32 gradients.
func (o *Offload) StateBytes() int64 {
	var n int64
	ps := int64(o.rt.DType.Size())
	for _, v := range o.vars {
		n += int64(v.numel) * (ps + 4*4)
	}
	return n
}

// ReadVariable returns a registered variable's current value as a new
// tensor of its Store dtype and shape. Call it between steps.
func (o *Offload) ReadVariable(ctx context.Context, name string) (*tensors.Tensor, error) {
	v := o.byName[name]
	if v == nil {
		return nil, fmt.Errorf("zgomlx: read %q: not a registered variable", name)
	}
	t := tensors.FromShape(v.Shape)
	var err error
	t.MutableBytes(func(b []byte) { err = o.readInto(ctx, v, b) })
	if err != nil {
		t.FinalizeAll()
		return nil, err
	}
	return t, nil
}

// readInto swaps v's layer in, copies v's values into dst (its Store
// dtype), and ends the layer, outside any pass.
func (o *Offload) readInto(ctx context.Context, v *Var, dst []byte) error {
	o.rt.Pass([]int{v.Layer})
	if err := o.rt.BeginLayer(ctx, v.Layer); err != nil {
		return fmt.Errorf("zgomlx: read %q: %w", v.Name, err)
	}
	defer o.rt.EndLayer(v.Layer)
	if err := o.rt.ReadParamBytes(ctx, v.Name, v.dtype, dst); err != nil {
		return fmt.Errorf("zgomlx: read %q: %w", v.Name, err)
	}
	return nil
}

// Restore gives every registered variable its current value in the Store
// again (for GoMLX's own checkpoints, inference or evaluation with a
// model.Exec). It needs memory for all of them at once.
func (o *Offload) Restore(ctx context.Context) error {
	for _, v := range o.vars {
		t, err := o.ReadVariable(ctx, v.Name)
		if err != nil {
			return err
		}
		if err := v.v.SetValue(t); err != nil {
			return fmt.Errorf("zgomlx: restore %q: %w", v.Name, err)
		}
	}
	o.released = false
	offloadedStores.Delete(o.store)
	return nil
}

// Close closes the runtime (its swap files are removed). The Store keeps
// what it has: call Restore first to keep the trained values.
func (o *Offload) Close() error {
	if o == nil || o.rt == nil {
		return nil
	}
	o.releaseHeapCredit()
	offloadedStores.CompareAndDelete(o.store, o)
	return o.rt.Close()
}

// applyHeapCredit takes the credit Options.HeapCredit n asks for
// (checked by checkHeapCredit; see internal/gccredit).
func (o *Offload) applyHeapCredit(n int64) {
	switch n {
	case NoHeapCredit:
		o.credit, o.creditStatus = 0, "none (Options.HeapCredit NoHeapCredit)"
		return
	case 0, AutoHeapCredit:
		n = o.InMemoryBytes()
		if mem := gccredit.PhysicalMemory(); mem > 0 && n > mem/4 {
			n = mem / 4
		}
	}
	o.credit, o.creditStatus = gccredit.Take(n)
}

// releaseHeapCredit gives the Offload's credit back; the last one
// restores GOGC.
func (o *Offload) releaseHeapCredit() {
	gccredit.Release(o.credit)
	o.credit = 0
}

// InMemoryBytes is what training the registered variables in memory
// keeps live: the optimizer's fp32 master weights and rule states (Adam:
// 12 bytes per element) and, unless the parameters are fp32 (then they
// are the masters), the parameters in their dtype.
func (o *Offload) InMemoryBytes() int64 {
	n := o.rt.Optimizer.Stats().StateBytes
	if ps := int64(o.rt.DType.Size()); ps != 4 {
		for _, v := range o.vars {
			n += int64(v.numel) * ps
		}
	}
	return n
}

// HeapCredit returns the bytes of heap credit the Offload holds
// (Options.HeapCredit) and a line saying what became of the request.
func (o *Offload) HeapCredit() (int64, string) {
	return o.credit, o.creditStatus
}
