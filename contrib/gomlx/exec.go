package zgomlx

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf/swapper"
)

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
	if err := checkBackend(backend); err != nil {
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
	grads := graph.Gradient(objective, wrt...)
	// A matrix used as a product's right-hand side (a dense layer's
	// weights, x W) gets its gradient from GoMLX's autodiff as a product
	// in the transposed layout, then a Transpose back to the matrix's:
	// an element-by-element permutation on one goroutine that took a
	// third of a small-batch training step's CPU. The graph computes the
	// product with its operands swapped instead, already in the matrix's
	// layout (swappedProduct): the variables' gradients, those the loop
	// hands to zinf.
	base := len(wrt) - len(le.vars)
	for i, g := range grads {
		if i >= base {
			if s := swappedProduct(g); s != nil {
				grads[i] = s
				continue
			}
		}
		grads[i] = skipIdentity(g)
	}
	return grads
}

// permutationRE finds a Transpose node's permutation in its description
// (graph.Node has no accessor for it).
var permutationRE = regexp.MustCompile(`Transpose\(x=\[#[0-9]+\], permutation=\[([0-9 ]*)\]\)`)

// swappedMatrix returns the input of n when n is an fp32 Transpose that
// moves the input's last axes, as a block, before its first ones
// (permutation [a, ..., r-1, 0, ..., a-1]): seen as a rows x cols
// matrix (rows the product of the first a axes, cols of the others), the
// input is the transpose of n. Else it returns nil. The permutation is
// read from the node's description and checked against the shapes; a
// description it cannot read (a GoMLX that writes it otherwise) leaves
// the graph as it is (TestTransposedWeightGradients says when that
// happens).
func swappedMatrix(n *graph.Node) (in *graph.Node, rows, cols int) {
	perm := transposePerm(n)
	if perm == nil || n.Shape().DType != dtypes.Float32 || n.Shape().Rank() < 2 {
		return nil, 0, 0
	}
	in = n.Inputs()[0]
	is, r := in.Shape(), len(perm)
	a := perm[0]
	if a == 0 {
		return nil, 0, 0
	}
	for i := range r {
		if perm[i] != (a+i)%r {
			return nil, 0, 0
		}
	}
	rows, cols = 1, 1
	for i, d := range is.Dimensions {
		if i < a {
			rows *= d
		} else {
			cols *= d
		}
	}
	return in, rows, cols
}

// dotGeneralRE reads a DotGeneral node's operands and axes from its
// description (graph.Node has no accessors for them).
var dotGeneralRE = regexp.MustCompile(`DotGeneral\(lhs=\[#([0-9]+)\], lhsContractingAxes=\[([0-9 ]*)\], lhsBatchAxes=\[([0-9 ]*)\], rhs=\[#([0-9]+)\], rhsContractingAxes=\[([0-9 ]*)\], rhsBatchAxes=\[([0-9 ]*)\], config=(\{[^{}]*\})\)`)

// defaultDotConfig is how a DotGeneral of the default configuration (no
// accumulator or output dtype of its own) describes it.
var defaultDotConfig = fmt.Sprintf("%+v", compute.DotGeneralConfig{})

// swappedProduct returns, when n is a Transpose that swappedMatrix
// recognizes and its input the product DotGeneral(a, ca, b, cb) (no batch
// axes, the default configuration), the product DotGeneral(b, cb, a, ca):
// the same sums with the operands swapped, whose result is n's layout
// (the product gives a's free axes, then b's; the swapped one b's, then
// a's, which is where n's permutation moves them). This is how GoMLX's
// autodiff gives the gradient of a product's right-hand side (x W: W's
// gradient as dy^T x, transposed back), and the backend's kernels sum
// each element over the same contraction in the same order either way
// round (TestSwappedProductKeepsBits, TestZooTransformerEqualsWholeGraph).
// Else it returns nil: n is kept, or put back by swappedMatrix.
func swappedProduct(n *graph.Node) *graph.Node {
	pre, _, _ := swappedMatrix(n)
	if pre == nil || pre.Type() != graph.NodeTypeDotGeneral || len(pre.Inputs()) != 2 {
		return nil
	}
	m := dotGeneralRE.FindStringSubmatch(pre.String())
	if m == nil || m[3] != "" || m[6] != "" || m[7] != defaultDotConfig {
		return nil
	}
	lhs, rhs := pre.Inputs()[0], pre.Inputs()[1]
	if strconv.Itoa(int(lhs.Id())) != m[1] || strconv.Itoa(int(rhs.Id())) != m[4] {
		return nil
	}
	lc, ok1 := axesOf(m[2], lhs.Rank())
	rc, ok2 := axesOf(m[5], rhs.Rank())
	if !ok1 || !ok2 || len(lc) != len(rc) || lhs.DType() != dtypes.Float32 || rhs.DType() != dtypes.Float32 {
		return nil
	}
	// n moves the product's first a axes (a's free ones) after the others.
	if perm := transposePerm(n); perm == nil || perm[0] != lhs.Rank()-len(lc) {
		return nil
	}
	s := graph.DotGeneral(rhs, rc, nil, lhs, lc, nil)
	if !s.Shape().Equal(n.Shape()) {
		return nil
	}
	swappedProducts.Add(1)
	return s
}

// swappedProducts counts the products swappedProduct built (tests read
// it: a GoMLX whose nodes it cannot read builds none).
var swappedProducts atomic.Int64

// axesOf reads a list of distinct axes below rank ("0 1").
func axesOf(f string, rank int) ([]int, bool) {
	var axes []int
	for _, x := range strings.Fields(f) {
		a, err := strconv.Atoi(x)
		if err != nil || a < 0 || a >= rank || slices.Contains(axes, a) {
			return nil, false
		}
		axes = append(axes, a)
	}
	return axes, len(axes) > 0
}

// transposePerm returns n's permutation when n is a Transpose whose
// description it can read (permutationRE) and whose shapes agree with it;
// else nil.
func transposePerm(n *graph.Node) []int {
	if n == nil || n.Type() != graph.NodeTypeTranspose || len(n.Inputs()) != 1 {
		return nil
	}
	s, is := n.Shape(), n.Inputs()[0].Shape()
	r := s.Rank()
	if is.Rank() != r || s.DType != is.DType {
		return nil
	}
	m := permutationRE.FindStringSubmatch(n.String())
	if m == nil {
		return nil
	}
	f := strings.Fields(m[1])
	if len(f) != r {
		return nil
	}
	perm := make([]int, r)
	for i, x := range f {
		p, err := strconv.Atoi(x)
		if err != nil || p < 0 || p >= r || s.Dimensions[i] != is.Dimensions[p] {
			return nil
		}
		perm[i] = p
	}
	return perm
}

// skipIdentity returns the input of n when n is a Transpose that leaves
// every axis in place, else n. GoMLX's autodiff ends the gradient of a
// product's operand with a Transpose to the operand's layout even when
// the product already gives that layout: the backend then copies the
// gradient element by element (a 32 MiB block of a tied head's table:
// about half of the head's backward call). The copy's values are its
// input's, so the input is the same gradient, bit for bit.
func skipIdentity(n *graph.Node) *graph.Node {
	perm := transposePerm(n)
	if perm == nil {
		return n
	}
	for i, p := range perm {
		if p != i {
			return n
		}
	}
	return n.Inputs()[0]
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
// to compute for inputs of which nf are float.
func (le *layerExec) needsBackward(nf int) bool { return nf > 0 || len(le.vars) > 0 }

// checkPure refuses a layer whose graph changes a variable: the backward
// pass recomputes the layer, which must give the forward's values.
func (le *layerExec) checkPure(g *graph.Graph) {
	if err := checkPure(le.ex.store, g, le.layer.Scope); err != nil {
		panic(err)
	}
}

// ErrNotPure is wrapped by the error of a layer the per-layer executors
// cannot run as the whole graph would: one that updates a variable in its
// graph or adds a loss term. Create given input shapes refuses such a
// layer; a Trainer created without them finds it at its first Step, which
// then fails with it (not with
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

// checkBackend refuses a backend the executors cannot feed: they read
// and write its buffers in place, so it must share them with Go.
func checkBackend(backend compute.Backend) error {
	if backend == nil {
		return errors.New("zgomlx: nil backend")
	}
	if !backend.HasSharedBuffers() {
		return fmt.Errorf("zgomlx: backend %q has no shared buffers (use the pure-Go backend: compute.NewWithConfig(zgomlx.DefaultBackend))", backend.Name())
	}
	return nil
}
