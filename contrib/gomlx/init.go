package zgomlx

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/support/exceptions"
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
	for _, l := range net.Layers {
		var err error
		x, err = trace(backend, store, l, x)
		if err != nil {
			return shapes.Shape{}, err
		}
	}
	if err := store.InitializeVariables(backend, nil); err != nil {
		return shapes.Shape{}, fmt.Errorf("zgomlx: initializing the variables: %w", err)
	}
	return x, nil
}

// trace builds one layer's graph for an input of shape x and returns its
// output shape.
func trace(backend compute.Backend, store *model.Store, l Layer, x shapes.Shape) (y shapes.Shape, err error) {
	g := graph.NewGraph(backend, "zgomlx.trace")
	defer g.Finalize()
	err = exceptions.TryCatch[error](func() {
		model.SetStore(g, store)
		store.SetTraining(g, true)
		out := l.Fn(store.Scope(cleanScope(l.Scope)), graph.Parameter(g, "x", x))
		y = out.Shape()
	})
	if err != nil {
		return shapes.Shape{}, fmt.Errorf("zgomlx: layer %q on input %s: %w", l.Scope, x, err)
	}
	return y, nil
}
