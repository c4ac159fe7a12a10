package zgomlx

import (
	"context"
	"fmt"
	"runtime"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/internal/backendinfo"
)

// Create registers store's variables with zinf and builds a Trainer for
// net; Close closes both. It is the one way to make a Trainer:
//
//   - With xs, the shapes of the first layer's inputs (one for a Layer.Fn,
//     several for a Layer.FnN), it suits a model whose variables do not
//     exist yet, or would not fit in memory all at once. It builds each
//     layer's graph for those inputs (without running it) to create the
//     variables in store with their shapes only, registers them with
//     zinf, then initializes one layer at a time: in a scratch Store
//     holding only that layer, with the initializers the layer chose,
//     each value goes to zinf and is dropped. So at most one layer's
//     values are ever in memory, and the Store keeps the shapes
//     (Offload.Restore gives it the values). The layers draw from the
//     Store's random state in turn, each where the one before left it
//     (seeded by model.ParamInitialSeed when set), so the values are the
//     ones Initialize (store.InitializeVariables, one stream in creation
//     order) gives the model in memory; variables that already have
//     values keep them. Variables a layer uses that zinf does not hold
//     (Options.Filter) get their values in the Store. A layer that the
//     per-layer executors cannot run as the whole graph would is refused
//     here, naming it: one that updates a variable in its graph (dropout
//     advancing the random state, batch statistics) or adds a
//     regularization or other loss term.
//   - Without xs, every variable selected must already have a value
//     (Initialize, a GoMLX checkpoint): Create registers them as they are
//     (Register, one layer per Net layer) and builds nothing to trace, so
//     such a layer is found at the first Step instead (ErrNotPure).
//
// On error the Store keeps its values.
func Create(ctx context.Context, backend compute.Backend, cfg *config.Config, store *model.Store, net Net, opts Options, xs ...shapes.Shape) (*Trainer, error) {
	if len(xs) == 0 {
		return open(ctx, backend, cfg, store, net, opts)
	}
	if err := net.check(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("zgomlx: nil model.Store")
	}
	if err := checkTrainer(backend, cfg); err != nil {
		return nil, err
	}
	backendinfo.WarnPortable(opts.Runtime.Logger, backend)
	ins := make([][]shapes.Shape, len(net.Layers))
	for i, l := range net.Layers {
		ins[i] = xs
		var err error
		if xs, err = trace(backend, store, l, xs, true); err != nil {
			return nil, err
		}
	}
	opts.Layers, opts.also = net.Scopes(), net.also()
	vars, scopes, err := collectVars(store, opts.Filter, opts.Layers, opts.also)
	if err != nil {
		return nil, err
	}
	o, err := openOffload(cfg, store, vars, scopes, opts)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Trainer, error) {
		freeSlots(o.spare)
		o.spare = nil
		o.releaseHeapCredit()
		o.rt.Close()
		return nil, err
	}
	if err := o.spareRowTables(backend, net); err != nil {
		return fail(err)
	}
	var had []*Var // registered variables that came with values
	for l, layer := range net.Layers {
		if err := o.initLayer(ctx, backend, l, layer, ins[l], &had); err != nil {
			return fail(fmt.Errorf("zgomlx: initializing layer %q: %w", layer.Scope, err))
		}
	}
	if !opts.KeepValues {
		if err := o.release(had); err != nil {
			return fail(err)
		}
	}
	o.applyHeapCredit(opts.HeapCredit)
	t, err := newTrainer(backend, o, net)
	if err != nil {
		// Give back what the Store had (the rest it never held).
		for _, v := range had {
			if !opts.KeepValues {
				if tv, rerr := o.ReadVariable(ctx, v.Name); rerr == nil {
					_ = v.v.SetValue(tv)
				}
			}
		}
		return fail(err)
	}
	t.owned = true
	// The initial values passed through GoMLX's Go backend, which keeps
	// freed buffers in sync.Pools; a pooled buffer survives one collection
	// (the pools' victim cache) and counts as live heap in it, so the
	// first collection of training would set its goal at twice them
	// (bench-llm-big, 4 blocks: 1.1 GB live at the end of Create, the
	// heap grown to 2.2 GB in the first step). Two collections here drop
	// them; creating took seconds, these take milliseconds.
	runtime.GC()
	runtime.GC()
	return t, nil
}

// initLayer gives layer l's registered variables their initial values in
// zinf, from the Store where they have one, else from a scratch Store
// initialized for this layer alone.
func (o *Offload) initLayer(ctx context.Context, backend compute.Backend, l int, layer Layer, x []shapes.Shape, had *[]*Var) error {
	missing := false
	for _, v := range o.layerVars[l] {
		if !v.v.HasValue() {
			missing = true
		}
	}
	scope := cleanScope(layer.Scope)
	for v := range o.store.IterVariables() {
		if v.IsValid() && inScope(v.Path(), scope) && o.byName[v.Path()] == nil && !v.HasValue() {
			missing = true // a variable zinf does not hold needs its value too
		}
	}
	var tmp *model.Store
	if missing {
		tmp = model.NewStore()
		for k, val := range o.store.IterParams() {
			tmp.SetParam(k, val)
		}
		defer tmp.Finalize()
		// A borrowed variable (a tied head's table) is an earlier layer's,
		// initialized there: the scratch Store has it with a value (zeros,
		// whose untouched pages cost no memory) so that the layer's graph
		// finds it and InitializeVariables draws nothing for it.
		for _, name := range layer.Borrow {
			sv := o.store.GetVariable(name)
			if sv == nil {
				return fmt.Errorf("borrowed variable %q is not in the Store (its layer creates it first)", name)
			}
			dir, base := model.SplitPath(name)
			if _, err := tmp.Scope(dir).CreateVariable(base, tensors.FromShape(sv.Shape())); err != nil {
				return fmt.Errorf("borrowed variable %q: %w", name, err)
			}
		}
		if _, err := trace(backend, tmp, layer, x, false); err != nil {
			return err
		}
		// The layer draws from the Store's random state where the one
		// before it left it, as store.InitializeVariables would draw for
		// every variable in creation order: the values are the ones
		// GoMLX gives the model in memory.
		if err := carryRNG(o.store, tmp); err != nil {
			return err
		}
		if err := tmp.InitializeVariables(backend, nil); err != nil {
			return err
		}
		if err := carryRNG(tmp, o.store); err != nil {
			return err
		}
		// Variables zinf does not hold live in the Store.
		for tv := range tmp.IterVariables() {
			sv := o.store.GetVariable(tv.Path())
			if !inScope(tv.Path(), scope) || o.byName[tv.Path()] != nil || sv == nil || sv.HasValue() {
				continue
			}
			val, err := tv.Value()
			if err != nil {
				return err
			}
			c, err := val.LocalClone()
			if err != nil {
				return err
			}
			if err := sv.SetValue(c); err != nil {
				return err
			}
		}
	}
	for _, v := range o.layerVars[l] {
		src := v.v
		if src.HasValue() {
			*had = append(*had, v)
		} else if src = tmp.GetVariable(v.Name); src == nil {
			return fmt.Errorf("variable %q was not created again for the layer alone", v.Name)
		}
		if err := o.initFrom(ctx, v, src); err != nil {
			return err
		}
	}
	return nil
}

// rngPath is the path of a Store's random state variable.
var rngPath = model.JoinPath("/", model.RNGStateVariableName)

// carryRNG gives dst's random state src's (seeding src's from its
// model.ParamInitialSeed, or at random, when it has none yet).
func carryRNG(src, dst *model.Store) error {
	sv := src.GetVariable(rngPath)
	if sv == nil || !sv.HasValue() {
		if err := src.ResetRNGState(); err != nil {
			return fmt.Errorf("seeding the random state: %w", err)
		}
		sv = src.GetVariable(rngPath)
	}
	val, err := sv.Value()
	if err != nil {
		return err
	}
	c, err := val.LocalClone()
	if err != nil {
		return err
	}
	dv := dst.GetVariable(rngPath)
	if dv == nil {
		if err := dst.ResetRNGState(); err != nil {
			return err
		}
		dv = dst.GetVariable(rngPath)
	}
	return dv.SetValue(c)
}

// spareRowTables makes the swap-in buffers of the tables net's layers
// read by rows (Layer.Lookups of variables zinf streams) before Create
// initializes the layers. A buffer made after the layers' initial values
// have passed through the Go heap reuses their memory, which Go zeroes
// page by page: the table's whole size would be resident for a moment
// (bench-llm-big: 783 MiB on top of the rest, the peak of the run), where
// only the batch's rows are resident afterwards (dropPages). Made first
// and its pages dropped, it costs nothing resident until rows are read
// into it. Its bytes are mapped outside the Go heap where the backend
// allows it (layerexec.NewMappedBuffer): a table-sized Go allocation
// counts as live heap, and the collector then lets as much garbage again
// build up before it runs (bench-llm-big: 700-875 MB live, the heap
// target 1.4-1.8 GB), resident memory the table's rows never needed. Close
// unmaps it.
func (o *Offload) spareRowTables(backend compute.Backend, net Net) error {
	p := &slotPool{backend: backend}
	for _, l := range net.Layers {
		for _, lk := range l.Lookups {
			v := o.byName[lk.Var]
			if v == nil || !o.rt.Streamed(v.Name) {
				continue
			}
			s, err := p.newMappedSlot(v.Shape)
			if err != nil {
				freeSlots(o.spare)
				o.spare = nil
				return fmt.Errorf("zgomlx: a swap-in buffer for %q (%s): %w", v.Name, v.Shape, err)
			}
			dropPages(s.bytes) // a buffer the backend reused may be resident
			o.spare = append(o.spare, s)
		}
	}
	return nil
}
