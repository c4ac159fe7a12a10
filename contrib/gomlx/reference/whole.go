package reference

import (
	"errors"
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"
	gopt "github.com/gomlx/gomlx/ml/train/optimizer"

	"github.com/zinfio/zinf/buffers"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/internal/inmemory"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/swapper"
)

// WholeGraph trains a Net the usual GoMLX way: the whole model and its
// optimizer update in one graph, run by a model.Exec, every variable in
// the Store in memory. With Adam (zinf's Adam as a GoMLX optimizer) it is
// the in-memory reference of offloaded training in GoMLX's own terms;
// with GoMLX's Adam it shows how far that one rounds from zinf's.
type WholeGraph struct {
	backend compute.Backend
	exec    *model.Exec
	nIn     int // inputs (the rest are labels) of the call being built
}

// NewWholeGraph builds the training step of net with opt over store
// (whose variables need values, or initializers).
func NewWholeGraph(backend compute.Backend, store *model.Store, net zgomlx.Net, opt gopt.Interface) (*WholeGraph, error) {
	if err := inmemory.Check(net); err != nil {
		return nil, err
	}
	if opt == nil {
		return nil, errors.New("zgomlx: nil optimizer")
	}
	w := &WholeGraph{backend: backend}
	e, err := model.NewExec(backend, store, func(scope *model.Scope, ins []*graph.Node) *graph.Node {
		loss := inmemory.Graph(store, net, ins[:w.nIn], ins[w.nIn:])
		opt.UpdateGraph(scope, ins[0].Graph(), loss)
		return loss
	})
	if err != nil {
		return nil, err
	}
	w.exec = e
	return w, nil
}

// NewWholeGraphModel builds the training step of a model written the
// plain GoMLX way, in one graph: predictions = modelFn(scope, inputs)
// (the root scope), loss = lossFn(labels, predictions), averaged when it
// is not a scalar (as train.Trainer does), and opt's update. For the zoo
// transformer, modelFn calls transformer.Model.Logits: the reference
// TransformerNet's per-layer training must equal.
func NewWholeGraphModel(backend compute.Backend, store *model.Store, modelFn func(scope *model.Scope, inputs []*graph.Node) []*graph.Node, lossFn train.LossFn, opt gopt.Interface) (*WholeGraph, error) {
	if modelFn == nil || lossFn == nil || opt == nil {
		return nil, errors.New("zgomlx: NewWholeGraphModel needs a model function, a loss and an optimizer")
	}
	w := &WholeGraph{backend: backend}
	e, err := model.NewExec(backend, store, func(scope *model.Scope, ins []*graph.Node) *graph.Node {
		g := ins[0].Graph()
		store.SetTraining(g, true)
		loss := inmemory.Loss(lossFn, modelFn(scope, ins[:w.nIn]), ins[w.nIn:])
		opt.UpdateGraph(scope, g, loss)
		return loss
	})
	if err != nil {
		return nil, err
	}
	w.exec = e
	return w, nil
}

// Step runs one training step on a batch and returns its loss.
func (w *WholeGraph) Step(x, labels *tensors.Tensor) (float32, error) {
	return w.StepN(one(x), one(labels))
}

// StepN is Step for a Net whose first layer takes several inputs, or
// whose loss several label tensors.
func (w *WholeGraph) StepN(xs, labels []*tensors.Tensor) (float32, error) {
	w.nIn = len(xs)
	var args []any
	for _, t := range append(append([]*tensors.Tensor(nil), xs...), labels...) {
		args = append(args, t)
	}
	out, err := w.exec.Call(args...)
	if err != nil {
		return 0, err
	}
	defer layerexec.Finalize(out[0])
	return layerexec.Scalar(w.backend, out[0])
}

// Close frees the compiled graphs.
func (w *WholeGraph) Close() { w.exec.Finalize() }

// WholeGraphGradients computes the loss of a batch and the gradients of
// the variables filter selects (nil: DefaultFilter) with the whole Net in
// one graph, as fp32 by variable path: what the per-layer executors'
// gradients (MemoryTrainer.Gradients) must equal.
func WholeGraphGradients(backend compute.Backend, store *model.Store, net zgomlx.Net, filter func(*model.Variable) bool, x, labels *tensors.Tensor) (float32, map[string][]float32, error) {
	if err := inmemory.Check(net); err != nil {
		return 0, nil, err
	}
	if filter == nil {
		filter = zgomlx.DefaultFilter
	}
	var names []string
	var dims []shapes.Shape
	e, err := model.NewExec(backend, store, func(_ *model.Scope, x, labels *graph.Node) []*graph.Node {
		loss := inmemory.Graph(store, net, []*graph.Node{x}, []*graph.Node{labels})
		g := x.Graph()
		var wrt []*graph.Node
		names, dims = nil, nil
		for v := range store.IterVariables() {
			if v.IsValid() && v.InUseByGraph(g) && filter(v) {
				names = append(names, v.Path())
				dims = append(dims, v.Shape())
				wrt = append(wrt, v.NodeValue(g))
			}
		}
		return append([]*graph.Node{loss}, graph.Gradient(loss, wrt...)...)
	})
	if err != nil {
		return 0, nil, err
	}
	defer e.Finalize()
	out, err := e.Call(x, labels)
	if err != nil {
		return 0, nil, err
	}
	defer func() {
		for _, t := range out {
			layerexec.Finalize(t)
		}
	}()
	loss, err := layerexec.Scalar(backend, out[0])
	if err != nil {
		return 0, nil, err
	}
	grads := make(map[string][]float32, len(names))
	for i, name := range names {
		_, b, err := layerexec.Shared(backend, out[1+i])
		if err != nil {
			return 0, nil, err
		}
		dt, ok := layerexec.DType(dims[i].DType)
		if !ok {
			return 0, nil, fmt.Errorf("zgomlx: gradient of %q is %s", name, dims[i].DType)
		}
		g := make([]float32, dims[i].Size())
		if dt == swapper.Float32 {
			copy(g, buffers.Float32Bytes(b))
		} else {
			buffers.Decode(dt, g, b)
		}
		grads[name] = g
	}
	return loss, grads, nil
}
