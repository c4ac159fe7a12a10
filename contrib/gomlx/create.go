package zgomlx

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
)

// Create is Open for a model whose variables do not exist yet, or would
// not fit in memory all at once. It builds each layer's graph for an
// input of shape x (without running it) to create the variables in store
// with their shapes only, registers them with zinf, then initializes one
// layer at a time: in a scratch Store holding only that layer, with the
// initializers the layer chose, each value goes to zinf and is dropped.
// So at most one layer's values are ever in memory, and the Store keeps
// the shapes (Offload.Restore gives it the values).
//
// Each layer draws from its own seed, derived from the Store's
// model.ParamInitialSeed (when set) and the layer's scope, so the values
// differ from Initialize's, which draws every variable from one stream;
// variables that already have values keep them. Variables a layer uses
// that zinf does not hold (Options.Filter) get their values in the Store.
func Create(ctx context.Context, backend compute.Backend, cfg *config.Config, store *model.Store, net Net, x shapes.Shape, opts Options) (*Trainer, error) {
	if err := net.check(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("zgomlx: nil model.Store")
	}
	if err := checkTrainer(backend, cfg); err != nil {
		return nil, err
	}
	ins := make([]shapes.Shape, len(net.Layers))
	for i, l := range net.Layers {
		ins[i] = x
		var err error
		if x, err = trace(backend, store, l, x); err != nil {
			return nil, err
		}
	}
	opts.Layers = net.Scopes()
	vars, scopes, err := collectVars(store, opts.Filter, opts.Layers)
	if err != nil {
		return nil, err
	}
	o, err := openOffload(cfg, store, vars, scopes, opts)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Trainer, error) {
		o.releaseHeapCredit()
		o.rt.Close()
		return nil, err
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
	t, err := NewTrainer(backend, o, net)
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
	return t, nil
}

// initLayer gives layer l's registered variables their initial values in
// zinf, from the Store where they have one, else from a scratch Store
// initialized for this layer alone.
func (o *Offload) initLayer(ctx context.Context, backend compute.Backend, l int, layer Layer, x shapes.Shape, had *[]*Var) error {
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
		if seed, ok := o.store.GetParam(model.ParamInitialSeed); ok {
			if s, ok := seed.(int64); ok && s != 0 {
				tmp.SetParam(model.ParamInitialSeed, layerSeed(s, scope))
			}
		}
		defer tmp.Finalize()
		if _, err := trace(backend, tmp, layer, x); err != nil {
			return err
		}
		if err := tmp.InitializeVariables(backend, nil); err != nil {
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

// layerSeed derives a layer's initialization seed from the Store's and
// the layer's scope (never 0, which GoMLX reads as "random").
func layerSeed(seed int64, scope string) int64 {
	h := fnv.New64a()
	h.Write([]byte(scope))
	s := seed ^ int64(h.Sum64()&(1<<62-1))
	if s == 0 {
		s = 1
	}
	return s
}
