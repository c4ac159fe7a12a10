package zgomlx

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"
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

// DefaultBackend is the GoMLX backend configuration zgomlx is tested
// with: the pure-Go backend running one op at a time (each op still uses
// every core). compute v0.1.2's Go backend can deadlock when it runs
// several large matrix products at once on few cores (each waits in its
// worker pool for workers the others hold), which backward passes of
// attention layers do; "ops_sequential" avoids that.
const DefaultBackend = "go:ops_sequential"

// BlockedHead is an output head computed in blocks of a table's rows
// (Net.Head): logits = h · Tableᵀ, where h is the last layer's output
// [..., d] and Table [vocab, d] a variable of an earlier layer (a tied
// embedding table). The Trainer never holds the table whole in Go
// memory: the forward pass reads it Rows rows at a time
// (zinf.Runtime.ReadParamBlocks) and writes each block's logits into the
// logits [..., vocab]; the loss (Net.Loss or TrainLoss of the logits)
// and its gradient are computed over the whole logits; the backward pass
// reads the blocks again, hands each block's table gradient to zinf as
// it comes (AccumulateGradRange) and sums the blocks' gradients of h last
// block first.
//
// Its reference is the head written blockwise in one graph (what
// reference.WholeGraph and WholeGraphGradients build for a Net with a Head): the
// table cut into blocks of Rows rows, the last one padded with zero
// rows, one matrix product per block, the logits concatenated and the
// padding's columns dropped. Per-layer training equals it bit for bit;
// it is not bit for bit one product over the whole table (the sum over
// the vocabulary in h's gradient is added in another order), see
// examples/headblocks. The logits [..., vocab] are whole: they are
// activations, small for the few tokens of a step that streams its
// weights.
type BlockedHead struct {
	// Table is the table's variable path ("/token_embed/embeddings"):
	// a variable of an earlier layer that zinf holds, [vocab, d].
	Table string
	// Rows is the rows of a block (> 0). Training is bit for bit the
	// reference of the same Rows; the Go memory the head needs is about
	// Rows x d table values and their gradient.
	Rows int
}

// headLogits is one block's logits: h [..., d] times e [rows, d]
// transposed.
func headLogits(h, e *graph.Node) *graph.Node {
	lead := "ijklmnopq"[:h.Rank()-1]
	return graph.Einsum(lead+"d,vd->"+lead+"v", h, e)
}

// graph is the reference: the head written blockwise in one graph.
func (hd *BlockedHead) graph(store *model.Store, h *graph.Node) *graph.Node {
	v := store.GetVariable(hd.Table)
	if v == nil {
		panic(fmt.Errorf("zgomlx: Net.Head.Table %q is not a variable of the Store (its layer creates it)", hd.Table))
	}
	table := v.NodeValue(h.Graph())
	vocab, d := table.Shape().Dimensions[0], table.Shape().Dimensions[1]
	var ls []*graph.Node
	for v0 := 0; v0 < vocab; v0 += hd.Rows {
		v1 := min(v0+hd.Rows, vocab)
		e := graph.Slice(table, graph.AxisRange(v0, v1))
		if n := v1 - v0; n < hd.Rows {
			e = graph.Concatenate([]*graph.Node{e, graph.Zeros(h.Graph(), shapes.Make(table.DType(), hd.Rows-n, d))}, 0)
		}
		ls = append(ls, headLogits(h, e))
	}
	logits := ls[0]
	if len(ls) > 1 {
		logits = graph.Concatenate(ls, -1)
	}
	if logits.Shape().Dim(-1) != vocab {
		logits = graph.Slice(logits, graph.AxisRange().Spacer(), graph.AxisRange(0, vocab))
	}
	return logits
}

// checkHead checks a Net's Head against its table's shape.
func (hd *BlockedHead) check(shape shapes.Shape) error {
	if shape.Rank() != 2 {
		return fmt.Errorf("zgomlx: Net.Head.Table %q is %s (allowed: a matrix [vocab, d])", hd.Table, shape)
	}
	return nil
}
