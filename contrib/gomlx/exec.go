package zgomlx

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/swapper"
)

// LayerFn computes one layer from its input x. Its variables live under
// scope (created with scope.VariableWithShape, layers.Dense(scope, ...),
// and so on). It must be a pure function of x and its variables: no
// dropout, no batch statistics updated in the graph, since the backward
// pass recomputes it.
type LayerFn func(scope *model.Scope, x *graph.Node) *graph.Node

// LayerFnN is a LayerFn with any number of inputs and outputs: the
// previous layer's outputs (the batch's inputs for the first layer) in,
// this layer's out. Outputs of an integer dtype (token ids, positions)
// pass along without gradients.
type LayerFnN func(scope *model.Scope, xs []*graph.Node) []*graph.Node

// LossFn maps the last layer's output y and the labels to a scalar loss.
// It has no variables of its own (put a head's weights in the last layer).
type LossFn func(y, labels *graph.Node) *graph.Node

// Layer is one unit of offload: the variables under Scope (and Also),
// used by Fn (or FnN).
type Layer struct {
	// Scope is the absolute scope path of the layer's variables, e.g.
	// "/block_0"; Fn gets the Store's scope at that path.
	Scope string
	Fn    LayerFn
	// FnN replaces Fn for a layer with several inputs or outputs (set
	// one of the two).
	FnN LayerFnN
	// Also are further scopes whose variables belong to this layer (a
	// model whose head reads "/final_norm" and "/output", say).
	Also []string
	// Borrow are variables of earlier layers this layer also reads, by
	// path: tied weights, such as an output head that reuses the token
	// embedding table. zinf holds one tensor; it is swapped in with its
	// own layer and kept in its buffer for the borrowers; its gradient is
	// the sum of every use's, handed to zinf in backward order (the
	// borrowers' first), and its update starts after its own layer's
	// backward.
	Borrow []string
	// Lookups are variables of this layer that its graph reads only at
	// the rows an integer input of the layer names: an embedding table
	// gathered at the tokens. For such a variable that zinf streams (one
	// larger than zinf.Options.PieceBytes), a pass reads only those rows
	// from NVMe (zinf.Runtime.ReadParamRows) and hands over only their
	// gradients (AccumulateGradRows; the rest of the table's gradient is
	// zero); results are the same bits. Only the first layer may have
	// Lookups (its inputs are the batch's, known before it runs). A
	// layer that reads other rows of such a variable computes with
	// stale values: list only variables the graph Gathers.
	Lookups []Lookup
}

// Lookup is a variable read by rows (see Layer.Lookups).
type Lookup struct {
	// Var is the variable's absolute path ("/token_embed/embeddings").
	Var string
	// Input is the index of the layer input holding the row ids (int32
	// or int64, any shape): the tokens.
	Input int
}

// fn is the layer as a LayerFnN.
func (l Layer) fn() LayerFnN {
	if l.FnN != nil {
		return l.FnN
	}
	f := l.Fn
	return func(scope *model.Scope, xs []*graph.Node) []*graph.Node {
		if len(xs) != 1 {
			panic(fmt.Errorf("zgomlx: layer %q has a one-input Fn and %d inputs (use FnN)", l.Scope, len(xs)))
		}
		return []*graph.Node{f(scope, xs[0])}
	}
}

// Net is a model as a chain of layers and a loss: y = Layers[L-1](...
// Layers[0](x)), loss = Loss(y, labels).
type Net struct {
	Layers []Layer
	Loss   LossFn
	// TrainLoss replaces Loss with GoMLX's train.LossFn signature
	// (labels, predictions: the last layer's outputs); a loss that is not
	// a scalar is averaged, as train.Trainer does.
	TrainLoss train.LossFn
	// Head, when set, computes the logits from the last layer's output
	// in blocks of an earlier layer's table (a tied output head that
	// never holds the table whole in Go memory, see BlockedHead); the
	// loss takes the logits. The last layer has one output then.
	Head *BlockedHead
}

// Scopes returns the layers' scopes, for Options.Layers.
func (n Net) Scopes() []string {
	out := make([]string, len(n.Layers))
	for i, l := range n.Layers {
		out[i] = l.Scope
	}
	return out
}

// also returns each layer's further scopes.
func (n Net) also() [][]string {
	out := make([][]string, len(n.Layers))
	for i, l := range n.Layers {
		out[i] = l.Also
	}
	return out
}

// loss builds the Net's loss of the last layer's outputs ys.
func (n Net) loss(ys, labels []*graph.Node) *graph.Node {
	var loss *graph.Node
	if n.TrainLoss != nil {
		loss = n.TrainLoss(labels, ys)
		if loss != nil && !loss.Shape().IsScalar() {
			loss = graph.ReduceAllMean(loss)
		}
	} else {
		if len(ys) != 1 || len(labels) != 1 {
			panic(fmt.Errorf("zgomlx: Net.Loss takes one output and one label tensor; got %d and %d (use Net.TrainLoss)", len(ys), len(labels)))
		}
		loss = n.Loss(ys[0], labels[0])
	}
	if loss == nil || !loss.Shape().IsScalar() {
		s := "nil"
		if loss != nil {
			s = loss.Shape().String()
		}
		panic(fmt.Errorf("zgomlx: Net.Loss returned shape %s (a scalar is needed)", s))
	}
	return loss
}

func (n Net) check() error {
	var errs []error
	if len(n.Layers) == 0 {
		errs = append(errs, errors.New("zgomlx: Net has no layers"))
	}
	switch {
	case n.Loss == nil && n.TrainLoss == nil:
		errs = append(errs, errors.New("zgomlx: Net.Loss is nil (set Loss or TrainLoss)"))
	case n.Loss != nil && n.TrainLoss != nil:
		errs = append(errs, errors.New("zgomlx: Net sets both Loss and TrainLoss (allowed: one)"))
	}
	for i, l := range n.Layers {
		switch {
		case l.Fn == nil && l.FnN == nil:
			errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q) has no Fn (set Fn or FnN)", i, l.Scope))
		case l.Fn != nil && l.FnN != nil:
			errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q) sets both Fn and FnN (allowed: one)", i, l.Scope))
		}
		if len(l.Lookups) > 0 && i > 0 {
			errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q) has Lookups (allowed: on the first layer only, whose inputs are the batch's)", i, l.Scope))
		}
		for _, lk := range l.Lookups {
			if lk.Input < 0 {
				errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q): Lookup %q: Input %d (allowed: >= 0, the index of an integer input)", i, l.Scope, lk.Var, lk.Input))
			}
		}
		for _, b := range l.Borrow {
			if b == "" || !strings.HasPrefix(b, "/") {
				errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q): Borrow %q (allowed: an absolute variable path such as \"/token_embed/embeddings\")", i, l.Scope, b))
			}
		}
		if i == len(n.Layers)-1 && n.Head != nil {
			for _, b := range l.Borrow {
				if b == n.Head.Table {
					errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q) borrows %q, the table Net.Head reads in blocks (allowed: one of the two)", i, l.Scope, b))
				}
			}
		}
		if l.Scope == "" || cleanScope(l.Scope) == "/" {
			errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d]: scope %q (allowed: a non-root scope path such as \"/block_%d\")", i, l.Scope, i))
		}
	}
	if h := n.Head; h != nil {
		if h.Rows <= 0 {
			errs = append(errs, fmt.Errorf("zgomlx: Net.Head.Rows %d (allowed: > 0 rows a block)", h.Rows))
		}
		if !strings.HasPrefix(h.Table, "/") {
			errs = append(errs, fmt.Errorf("zgomlx: Net.Head.Table %q (allowed: an absolute variable path such as \"/token_embed/embeddings\")", h.Table))
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
// ys = Fn(xs); backward recomputes ys and returns the vector-Jacobian
// product with autodiff: the gradients of sum(y*dy), over the float
// outputs, for the float inputs and for the layer's registered variables
// (its own in zinf order, then the borrowed ones).
type layerExec struct {
	ex    *executors
	index int
	layer Layer
	fn    LayerFnN
	vars  []*Var // own variables, then borrowed ones
	own   int    // len of the own ones
	fwd   *graph.Exec
	bwd   *graph.Exec
	// nIn is the number of inputs of the call being built (set by the
	// loop's goroutine before it hands the call to the worker).
	nIn int

	mu    sync.Mutex
	binds map[*graph.Graph][]binding
	// gathered says which lookups' gradients the backward pass gives by
	// rows (gatheredRows), as its graph was built.
	gathered map[*Var]bool
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
	head    *headExec // Net.Head's, or nil
	byName  map[string]*Var
	// nOut is the number of the last layer's outputs in the loss call
	// being built (the rest are labels).
	nOut int
	// inputs are the batch's inputs of the run in progress (for Lookups).
	inputs []*tensors.Tensor
	// batches are every micro-batch's inputs of a layer-major step: a
	// lookup's swap-in reads the rows any of them names.
	batches [][]*tensors.Tensor
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
	var errs []error
	for i, l := range net.Layers {
		le := &layerExec{ex: ex, index: i, layer: Layer{Scope: cleanScope(l.Scope), Fn: l.Fn, FnN: l.FnN, Borrow: l.Borrow, Lookups: l.Lookups}, fn: l.fn(), binds: map[*graph.Graph][]binding{}, gathered: map[*Var]bool{}}
		le.vars = append(le.vars, layerVars[i]...)
		for _, v := range layerVars[i] {
			v.lookup = -1
		}
		for _, lk := range l.Lookups {
			v := byName[lk.Var]
			if v == nil || v.Layer != i {
				errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q): Lookup %q is not a variable of this layer that zinf holds", i, l.Scope, lk.Var))
				continue
			}
			v.lookup = lk.Input
		}
		le.own = len(le.vars)
		for _, name := range l.Borrow {
			v := byName[name]
			switch {
			case v == nil:
				errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q) borrows %q, which is not a variable zinf holds", i, l.Scope, name))
			case v.Layer >= i:
				errs = append(errs, fmt.Errorf("zgomlx: Net.Layers[%d] (scope %q) borrows %q of layer %d (allowed: a variable of an earlier layer, which swaps it in)", i, l.Scope, name, v.Layer))
			default:
				v.shared = true
				le.vars = append(le.vars, v)
			}
		}
		ex.layers = append(ex.layers, le)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for i, le := range ex.layers {
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
	}
	if net.Head != nil {
		var err error
		if ex.head, err = newHeadExec(ex, net.Head); err != nil {
			return nil, err
		}
	}
	var err error
	ex.loss, err = graph.NewExec(backend, func(ins []*graph.Node) []*graph.Node {
		ys, labels := ins[:ex.nOut], ins[ex.nOut:]
		loss := net.loss(ys, labels)
		out := []*graph.Node{loss}
		var wrt []*graph.Node
		for _, y := range ys {
			if y.DType().IsFloat() {
				wrt = append(wrt, y)
			}
		}
		if len(wrt) > 0 {
			out = append(out, graph.Gradient(loss, wrt...)...)
		}
		return out
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

// run builds the layer's outputs in g's graph.
func (le *layerExec) run(xs []*graph.Node) []*graph.Node {
	g := xs[0].Graph()
	model.SetStore(g, le.ex.store)
	le.ex.store.SetTraining(g, true)
	ys := le.fn(le.scope(), xs)
	le.checkPure(g)
	if len(ys) == 0 {
		panic(fmt.Errorf("zgomlx: layer %q has no outputs", le.layer.Scope))
	}
	return ys
}

func (le *layerExec) forwardGraph(xs []*graph.Node) []*graph.Node { return le.run(xs) }

func (le *layerExec) backwardGraph(ins []*graph.Node) []*graph.Node {
	xs, dys := ins[:le.nIn], ins[le.nIn:]
	ys := le.run(xs)
	g := xs[0].Graph()
	var objective *graph.Node
	k := 0
	for _, y := range ys {
		if !y.DType().IsFloat() {
			continue
		}
		if k >= len(dys) {
			panic(fmt.Errorf("zgomlx: layer %q: %d output gradients for more float outputs", le.layer.Scope, len(dys)))
		}
		dy := dys[k]
		k++
		if !y.Shape().Equal(dy.Shape()) {
			panic(fmt.Errorf("zgomlx: layer %q: output %s, its gradient %s", le.layer.Scope, y.Shape(), dy.Shape()))
		}
		term := graph.ReduceAllSum(graph.Mul(y, dy))
		if objective == nil {
			objective = term
		} else {
			objective = graph.Add(objective, graph.ConvertDType(term, objective.DType()))
		}
	}
	var wrt []*graph.Node
	for _, x := range xs {
		if x.DType().IsFloat() {
			wrt = append(wrt, x)
		}
	}
	for i, v := range le.vars {
		if i < le.own && le.ex.rowGrad(v) {
			// The lookup's gradient by rows: the gradient of its Gather's
			// output, which the loop sums per row (lookupGrad) instead of
			// the graph scattering it into a zero table of the vocabulary's
			// size. A graph that reads the table otherwise too gives it
			// whole.
			gt := le.lookupGather(g, v, xs)
			le.mu.Lock()
			le.gathered[v] = gt != nil
			le.mu.Unlock()
			if gt != nil {
				wrt = append(wrt, gt)
				continue
			}
		}
		wrt = append(wrt, v.v.NodeValue(g))
	}
	if len(wrt) == 0 || objective == nil {
		panic(fmt.Errorf("zgomlx: layer %q has no float input, registered variable or float output: nothing to differentiate", le.layer.Scope))
	}
	return graph.Gradient(objective, wrt...)
}

// rowGrad reports whether the backward pass may give v's gradient by rows
// (the gradient of its lookup's Gather, [ids..., row length]) instead of
// whole: a float32 variable of Layer.Lookups. The loop sums it per row in
// the ids' order, as the graph's gradient of a Gather (a ScatterSum into
// zeros, one id after another) would, bit for bit, without a buffer of
// the table's size. It does so when the graph reads the table by one
// Gather at the lookup's ids and nothing else (gatheredRows).
func (ex *executors) rowGrad(v *Var) bool { return v.lookup >= 0 && v.dtype == swapper.Float32 }

// gatheredRows reports whether the layer's backward pass gives lookup v's
// gradient by rows (its graph was built so; see rowGrad).
func (le *layerExec) gatheredRows(v *Var) bool {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.gathered[v]
}

// lookupGather finds the one Gather that reads lookup v in g, at ids that
// are input v.lookup of the layer (reshaped or converted only): what
// Layer.Lookups describes. It returns nil when the graph reads the table
// otherwise (or also otherwise): its gradient is then taken whole.
func (le *layerExec) lookupGather(g *graph.Graph, v *Var, xs []*graph.Node) *graph.Node {
	table := v.v.NodeValue(g)
	var gathers []*graph.Node
	others := 0
	for _, n := range g.Nodes() {
		for k, in := range n.Inputs() {
			if in != table {
				continue
			}
			if n.Type() == graph.NodeTypeGather && k == 0 {
				gathers = append(gathers, n)
			} else {
				others++
			}
		}
	}
	if len(gathers) != 1 || others > 0 || v.lookup >= len(xs) {
		return nil
	}
	gt := gathers[0]
	ids := gt.Inputs()[1]
	ts, is, gs := table.Shape(), ids.Shape(), gt.Shape()
	if ts.Rank() != 2 || is.Rank() < 1 || is.Dimensions[is.Rank()-1] != 1 || gs.Rank() != is.Rank() || gs.Dimensions[gs.Rank()-1] != ts.Dimensions[1] {
		return nil // not whole rows at one id each
	}
	for ids != xs[v.lookup] {
		if t := ids.Type(); t != graph.NodeTypeReshape && t != graph.NodeTypeConvertDType {
			return nil // ids computed from the input, not the input's
		}
		ids = ids.Inputs()[0]
	}
	return gt
}

// needsBackward reports whether the layer's backward pass has anything
// to compute for inputs with floats float inputs.
func (le *layerExec) needsBackward(floats int) bool { return floats > 0 || len(le.vars) > 0 }

// checkPure refuses a layer whose graph changes a variable: the backward
// pass recomputes the layer, which must give the forward's values.
func (le *layerExec) checkPure(g *graph.Graph) {
	if err := checkPure(le.ex.store, g, le.layer.Scope); err != nil {
		panic(err)
	}
}

// ErrNotPure is wrapped by the error of a layer the per-layer executors
// cannot run as the whole graph would: one that updates a variable in its
// graph or adds a loss term. Create refuses such a layer; a Trainer from
// Open finds it at its first Step, which then fails with it (not with
// ErrStepAborted: running the step again cannot help).
var ErrNotPure = errors.New("zgomlx: a layer the per-layer executors cannot recompute")

// checkPure reports a graph that changes a variable (dropout advancing
// the random state, batch statistics, a counter) or adds a loss term
// (regularization) the per-layer executors would not see.
func checkPure(store *model.Store, g *graph.Graph, scope string) error {
	var errs []error
	for v := range store.IterVariables() {
		if v.IsValid() && v.InUseByGraph(g) && v.ChangedInGraph(g) {
			errs = append(errs, fmt.Errorf("%w: layer %q updates variable %q in its graph (dropout, batch statistics, a counter): per-layer recomputation needs layers that are pure functions of their input and variables", ErrNotPure, scope, v.Path()))
		}
	}
	if reg := train.GetRegularizationLoss(g); reg != nil {
		errs = append(errs, fmt.Errorf("%w: layer %q adds a regularization loss (train.AddRegularizationLoss; layers.Dense adds one when the scope sets regularizer hyperparameters such as %q or %q): the per-layer executors differentiate the layer's outputs only and would drop it; leave the regularizer out", ErrNotPure, scope, "l2_regularization", "l1_regularization"))
	}
	if m := train.GetMainLoss(g); m != nil {
		errs = append(errs, fmt.Errorf("%w: layer %q adds a loss term (train.AddMainLoss): the loss is Net.Loss/TrainLoss of the last layer's outputs", ErrNotPure, scope))
	}
	return errors.Join(errs...)
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
			if v.Layer != le.index && !slices.Contains(le.vars[le.own:], v) {
				return nil, fmt.Errorf("zgomlx: layer %q uses variable %q of layer %q: a variable belongs to one layer (share weights within a layer, or list it in Layer.Borrow of a later layer)", le.layer.Scope, name, le.ex.net.Layers[v.Layer].Scope)
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

// finalize releases a tensor's memory now (nil is fine; see
// layerexec.Finalize).
func finalize(t *tensors.Tensor) { layerexec.Finalize(t) }

// close frees the compiled graphs.
func (ex *executors) close() {
	for _, le := range ex.layers {
		le.fwd.Finalize()
		le.bwd.Finalize()
	}
	ex.loss.Finalize()
	if ex.head != nil {
		ex.head.close()
	}
}

// DefaultBackend is the GoMLX backend configuration zgomlx is tested
// with: the pure-Go backend running one op at a time (each op still uses
// every core). compute v0.1.2's Go backend can deadlock when it runs
// several large matrix products at once on few cores (each waits in its
// worker pool for workers the others hold), which backward passes of
// attention layers do; "ops_sequential" avoids that.
const DefaultBackend = "go:ops_sequential"
