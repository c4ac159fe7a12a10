package zgomlx

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
)

// Initialize creates net's variables in store for an input of shape x
// (building each layer's graph once, without running it, which also gives
// the next layer's input shape) and gives every variable without a value
// its initial value (store.InitializeVariables, with the initializers the
// layers chose and the Store's seed, model.ParamInitialSeed). It returns
// the shape of the last layer's output. Variables that already have
// values keep them.
func Initialize(backend compute.Backend, store *model.Store, net Net, x shapes.Shape) (shapes.Shape, error) {
	if err := net.check(); err != nil {
		return shapes.Shape{}, err
	}
	ys, err := InitializeN(backend, store, net, []shapes.Shape{x})
	if err != nil {
		return shapes.Shape{}, err
	}
	return ys[0], nil
}

// InitializeN is Initialize for a Net whose first layer takes several
// inputs; it returns the shapes of the last layer's outputs.
func InitializeN(backend compute.Backend, store *model.Store, net Net, xs []shapes.Shape) ([]shapes.Shape, error) {
	if err := net.check(); err != nil {
		return nil, err
	}
	for _, l := range net.Layers {
		var err error
		xs, err = trace(backend, store, l, xs, false)
		if err != nil {
			return nil, err
		}
	}
	if err := store.InitializeVariables(backend, nil); err != nil {
		return nil, fmt.Errorf("zgomlx: initializing the variables: %w", err)
	}
	return xs, nil
}

// trace builds one layer's graph for inputs of shapes xs and returns its
// outputs' shapes. strict refuses a layer the per-layer executors cannot
// run as the whole graph would (checkPure).
func trace(backend compute.Backend, store *model.Store, l Layer, xs []shapes.Shape, strict bool) (ys []shapes.Shape, err error) {
	g := graph.NewGraph(backend, "zgomlx.trace")
	defer g.Finalize()
	err = layerexec.Catch(func() error {
		model.SetStore(g, store)
		store.SetTraining(g, true)
		in := make([]*graph.Node, len(xs))
		for i, x := range xs {
			in[i] = graph.Parameter(g, fmt.Sprintf("x%d", i), x)
		}
		for _, y := range l.fn()(store.Scope(cleanScope(l.Scope)), in) {
			ys = append(ys, y.Shape())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("zgomlx: layer %q on inputs %v: %w", l.Scope, xs, err)
	}
	if strict {
		if err := checkPure(store, g, cleanScope(l.Scope)); err != nil {
			return nil, err
		}
	}
	return ys, nil
}
