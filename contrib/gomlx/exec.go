package zgomlx

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
)

// LayerFn computes one layer from its input x. Its variables live under
// scope (created with scope.VariableWithShape, layers.Dense(scope, ...),
// and so on). It must be a pure function of x and its variables: no
// dropout, no batch statistics updated in the graph, since the backward
// pass recomputes it.
type LayerFn func(scope *model.Scope, x *graph.Node) *graph.Node

// LossFn maps the last layer's output y and the labels to a scalar loss.
// It has no variables of its own (put a head's weights in the last layer).
type LossFn func(y, labels *graph.Node) *graph.Node

// Layer is one unit of offload: the variables under Scope, used by Fn.
type Layer struct {
	// Scope is the absolute scope path of the layer's variables, e.g.
	// "/block_0"; Fn gets the Store's scope at that path.
	Scope string
	Fn    LayerFn
}

// Net is a model as a chain of layers and a loss: y = Layers[L-1](...
// Layers[0](x)), loss = Loss(y, labels).
type Net struct {
	Layers []Layer
	Loss   LossFn
}

// Scopes returns the layers' scopes, for Options.Layers.
func (n Net) Scopes() []string {
	out := make([]string, len(n.Layers))
	for i, l := range n.Layers {
		out[i] = l.Scope
	}
	return out
}

func (n Net) check() error {
	var errs []error
	if len(n.Layers) == 0 {
		errs = append(errs, errors.New("zgomlx: Net has no layers"))
	}
	if n.Loss == nil {
		errs = append(errs, errors.New("zgomlx: Net.Loss is nil"))
	}
	for i, l := range n.Layers {
		if l.Fn == nil {
			errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q) has no Fn", i, l.Scope))
		}
		if l.Scope == "" || cleanScope(l.Scope) == "/" {
			errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d]: scope %q (allowed: a non-root scope path such as \"/block_%d\")", i, l.Scope, i))
		}
	}
	return errors.Join(errs...)
}

// binding says what feeds one side parameter (a variable) of a compiled
// graph: a registered variable's current buffer, or a Store value.
type binding struct {
	handle int
	v      *Var
	frozen *model.Variable
}

// layerExec is one layer's forward and backward executors. Forward is
// y = Fn(x); backward recomputes y and returns the vector-Jacobian product
// with autodiff: the gradients of sum(y*dy) for x (when x is a float
// tensor) and for the layer's registered variables, in zinf order.
type layerExec struct {
	ex    *executors
	index int
	layer Layer
	vars  []*Var
	fwd   *graph.Exec
	bwd   *graph.Exec

	mu    sync.Mutex
	binds map[*graph.Graph][]binding
}

// executors are a Net's per-layer executors plus the loss's, over one
// backend and Store; registered variables are fed from their Var.cur
// buffers, the others from the Store.
type executors struct {
	backend compute.Backend
	store   *model.Store
	net     Net
	layers  []*layerExec
	loss    *graph.Exec
	byName  map[string]*Var
}

func newExecutors(backend compute.Backend, store *model.Store, net Net, layerVars [][]*Var, byName map[string]*Var) (*executors, error) {
	if err := checkTrainer(backend, nil); err != nil {
		return nil, err
	}
	if err := net.check(); err != nil {
		return nil, err
	}
	if len(layerVars) != len(net.Layers) {
		return nil, fmt.Errorf("zgomlx: %d layers registered, the Net has %d (register with Options.Layers = net.Scopes())", len(layerVars), len(net.Layers))
	}
	ex := &executors{backend: backend, store: store, net: net, byName: byName}
	for i, l := range net.Layers {
		le := &layerExec{ex: ex, index: i, layer: Layer{Scope: cleanScope(l.Scope), Fn: l.Fn}, vars: layerVars[i], binds: map[*graph.Graph][]binding{}}
		var err error
		le.fwd, err = graph.NewExec(backend, le.forwardGraph)
		if err != nil {
			return nil, err
		}
		le.fwd.WithName(fmt.Sprintf("zgomlx.forward%d", i)).SetSideParamsHook(le.hook)
		le.bwd, err = graph.NewExec(backend, le.backwardGraph)
		if err != nil {
			return nil, err
		}
		le.bwd.WithName(fmt.Sprintf("zgomlx.backward%d", i)).SetSideParamsHook(le.hook)
		ex.layers = append(ex.layers, le)
	}
	var err error
	ex.loss, err = graph.NewExec(backend, func(y, labels *graph.Node) []*graph.Node {
		loss := net.Loss(y, labels)
		if !loss.Shape().IsScalar() {
			panic(fmt.Errorf("zgomlx: Net.Loss returned shape %s (a scalar is needed)", loss.Shape()))
		}
		return []*graph.Node{loss, graph.Gradient(loss, y)[0]}
	})
	if err != nil {
		return nil, err
	}
	ex.loss.WithName("zgomlx.loss")
	return ex, nil
}

// scope is the layer's scope in a fresh Scope object (sub-scopes are not
// yet visited in it).
func (le *layerExec) scope() *model.Scope { return le.ex.store.Scope(le.layer.Scope) }

func (le *layerExec) forwardGraph(x *graph.Node) *graph.Node {
	g := x.Graph()
	model.SetStore(g, le.ex.store)
	le.ex.store.SetTraining(g, true)
	y := le.layer.Fn(le.scope(), x)
	le.checkPure(g)
	return y
}

func (le *layerExec) backwardGraph(x, dy *graph.Node) []*graph.Node {
	g := x.Graph()
	model.SetStore(g, le.ex.store)
	le.ex.store.SetTraining(g, true)
	y := le.layer.Fn(le.scope(), x)
	le.checkPure(g)
	if !y.Shape().Equal(dy.Shape()) {
		panic(fmt.Errorf("zgomlx: layer %q: output %s, its gradient %s", le.layer.Scope, y.Shape(), dy.Shape()))
	}
	var wrt []*graph.Node
	if x.DType().IsFloat() {
		wrt = append(wrt, x)
	}
	for _, v := range le.vars {
		wrt = append(wrt, v.v.NodeValue(g))
	}
	if len(wrt) == 0 {
		panic(fmt.Errorf("zgomlx: layer %q has neither a float input nor registered variables: nothing to differentiate", le.layer.Scope))
	}
	return graph.Gradient(graph.ReduceAllSum(graph.Mul(y, dy)), wrt...)
}

// needsBackward reports whether the layer's backward pass has anything
// to compute for an input of dtype float (or not).
func (le *layerExec) needsBackward(floatInput bool) bool { return floatInput || len(le.vars) > 0 }

// checkPure refuses a layer whose graph changes a variable: the backward
// pass recomputes the layer, which must give the forward's values.
func (le *layerExec) checkPure(g *graph.Graph) {
	for v := range le.ex.store.IterVariables() {
		if v.IsValid() && v.InUseByGraph(g) && v.ChangedInGraph(g) {
			panic(fmt.Errorf("zgomlx: layer %q updates variable %q in its graph (dropout, batch statistics, a counter): per-layer recomputation needs layers that are pure functions of their input and variables", le.layer.Scope, v.Path()))
		}
	}
}

// hook feeds the graph's variables: it runs on the calling goroutine
// before each execution. The bindings of a graph are computed once.
func (le *layerExec) hook(g *graph.Graph, in []compute.Buffer, _ []bool) error {
	le.mu.Lock()
	bs, ok := le.binds[g]
	le.mu.Unlock()
	if !ok {
		var err error
		if bs, err = le.bind(g, in); err != nil {
			return err
		}
		le.mu.Lock()
		le.binds[g] = bs
		le.mu.Unlock()
	}
	for _, b := range bs {
		if b.v != nil {
			if b.v.cur == nil {
				return fmt.Errorf("zgomlx: layer %q: variable %q was not swapped in", le.layer.Scope, b.v.Name)
			}
			in[b.handle] = b.v.cur
			continue
		}
		t, err := b.frozen.Value()
		if err != nil {
			return fmt.Errorf("zgomlx: layer %q reads variable %q, which zinf does not hold: %w", le.layer.Scope, b.frozen.Path(), err)
		}
		if in[b.handle], err = t.Buffer(le.ex.backend, 0); err != nil {
			return err
		}
	}
	return nil
}

// bind maps a graph's side parameters (the ones not set yet) to
// variables by name (a variable's parameter node is named by its path).
func (le *layerExec) bind(g *graph.Graph, in []compute.Buffer) ([]binding, error) {
	var bs []binding
	for h := range g.NumParameters() {
		if in[h] != nil {
			continue // an argument of the call
		}
		name := g.GetParameterByHandle(graph.ParameterHandle(h)).GetParameterName()
		if v := le.ex.byName[name]; v != nil {
			if v.Layer != le.index {
				return nil, fmt.Errorf("zgomlx: layer %q uses variable %q of layer %q: a variable belongs to one layer (share weights within a layer)", le.layer.Scope, name, le.ex.net.Layers[v.Layer].Scope)
			}
			bs = append(bs, binding{handle: h, v: v})
			continue
		}
		fv := le.ex.store.GetVariable(name)
		if fv == nil {
			return nil, fmt.Errorf("zgomlx: layer %q: graph parameter %q is not a variable of the Store", le.layer.Scope, name)
		}
		bs = append(bs, binding{handle: h, frozen: fv})
	}
	return bs, nil
}

// finalize releases a tensor's memory now (nil is fine).
func finalize(t *tensors.Tensor) {
	if t != nil {
		_ = t.FinalizeAll()
	}
}

// close frees the compiled graphs.
func (ex *executors) close() {
	for _, le := range ex.layers {
		le.fwd.Finalize()
		le.bwd.Finalize()
	}
	ex.loss.Finalize()
}

// DefaultBackend is the GoMLX backend configuration zgomlx is tested
// with: the pure-Go backend running one op at a time (each op still uses
// every core). compute v0.1.2's Go backend can deadlock when it runs
// several large matrix products at once on few cores (each waits in its
// worker pool for workers the others hold), which backward passes of
// attention layers do; "ops_sequential" avoids that.
const DefaultBackend = "go:ops_sequential"
