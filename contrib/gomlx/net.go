package zgomlx

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/tensor"
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

// cleanScope normalizes a scope path: a leading "/", no trailing one.
func cleanScope(s string) string {
	s = "/" + strings.Trim(s, "/")
	return s
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

// Var is one variable of a model.Store that zinf holds: its path (the
// zinf tensor name), its shape and dtype as in the Store, and its layer.
type Var struct {
	// Name is the variable's absolute path in the Store ("/block_0/attn/...").
	Name string
	// Shape is the variable's shape, dtype included.
	Shape shapes.Shape
	// Layer is the index of the layer holding it, in forward order.
	Layer int

	v     *model.Variable
	dtype tensor.DType // Shape.DType in zinf's vocabulary
	numel int
	class int // slot class: variables of one class share swap-in buffers
	// shared: a later layer borrows it (Layer.Borrow); it has a slot class
	// of its own, so its values stay in their buffer through a pass.
	shared   bool
	ownClass bool
	idx      int // position in the trainer's variables
	// lookup is the first layer's input whose ids are the rows the layer
	// reads (Layer.Lookups), -1 when it reads the whole variable.
	lookup int

	// Per-loop state, owned by the one loop goroutine.
	slot *slot   // the swap-in buffer holding (or last holding) its values
	cur  compBuf // the buffer an executor feeds for it now
}

// Bytes is the variable's size in its dtype.
// (From its Shape, so a Var that Offload.Vars returns has it too.)
func (v *Var) Bytes() int64 { return int64(v.Shape.ByteSize()) }

// DefaultFilter selects what zinf holds when Options.Filter is nil: every
// trainable variable whose dtype zinf stores (float32, bfloat16, float16).
func DefaultFilter(v *model.Variable) bool {
	_, ok := layerexec.DType(v.DType())
	return v.Trainable && ok
}

// inScope reports whether path lies under scope (or is scope).
func inScope(path, scope string) bool {
	if scope == "/" {
		return true
	}
	return path == scope || strings.HasPrefix(path, scope+"/")
}

// firstScope is the first element of a variable path, as a scope.
func firstScope(path string) string {
	p := strings.TrimPrefix(path, "/")
	if i := strings.IndexByte(p, '/'); i >= 0 {
		return "/" + p[:i]
	}
	return "/" // a variable in the root scope
}

// collectVars selects the Store's variables, assigns each a layer (by the
// given scopes, or by first-level scope in creation order) and a slot
// class. Every problem is reported at once.
func collectVars(store *model.Store, filter func(*model.Variable) bool, scopes []string, also [][]string) ([]*Var, []string, error) {
	if store == nil {
		return nil, nil, errors.New("zgomlx: nil model.Store")
	}
	if filter == nil {
		filter = DefaultFilter
	}
	var errs []error
	var picked []*model.Variable
	for v := range store.IterVariables() {
		if !v.IsValid() || !filter(v) {
			continue
		}
		if _, ok := layerexec.DType(v.DType()); !ok {
			errs = append(errs, fmt.Errorf("zgomlx: variable %q: dtype %s (allowed: Float32, BFloat16, Float16; leave it out with Options.Filter)", v.Path(), v.DType()))
			continue
		}
		picked = append(picked, v)
	}
	if len(picked) == 0 && len(errs) == 0 {
		return nil, nil, errors.New("zgomlx: the Store has no variable to offload (none passed Options.Filter; create the model's variables first, e.g. with zgomlx.Initialize)")
	}
	if len(scopes) == 0 {
		for _, v := range picked {
			if s := firstScope(v.Path()); !slices.Contains(scopes, s) {
				scopes = append(scopes, s)
			}
		}
	} else {
		clean := make([]string, len(scopes))
		for i, s := range scopes {
			clean[i] = cleanScope(s)
			if slices.Contains(clean[:i], clean[i]) {
				errs = append(errs, fmt.Errorf("zgomlx: Options.Layers: scope %q is listed twice", clean[i]))
			}
		}
		scopes = clean
	}
	var vars []*Var
	classes := map[string]int{}
	for _, v := range picked {
		layer := -1
		for l, s := range scopes {
			if inScope(v.Path(), s) {
				layer = l
				break
			}
			if l < len(also) && slices.ContainsFunc(also[l], func(a string) bool { return inScope(v.Path(), cleanScope(a)) }) {
				layer = l
				break
			}
		}
		if layer < 0 {
			errs = append(errs, fmt.Errorf("zgomlx: variable %q is under none of the layer scopes %v (add its scope to Options.Layers or leave it out with Options.Filter)", v.Path(), scopes))
			continue
		}
		dt, _ := layerexec.DType(v.DType())
		key := v.Shape().String()
		c, ok := classes[key]
		if !ok {
			c = len(classes)
			classes[key] = c
		}
		vars = append(vars, &Var{Name: v.Path(), Shape: v.Shape(), Layer: layer, v: v, dtype: dt, numel: v.Shape().Size(), class: c, lookup: -1})
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	// Layers in forward order, each layer's variables in creation order.
	slices.SortStableFunc(vars, func(a, b *Var) int { return a.Layer - b.Layer })
	for i, v := range vars {
		v.idx = i
	}
	return vars, scopes, nil
}

// groupLayers lists each layer's variables.
func groupLayers(vars []*Var, layers int) [][]*Var {
	out := make([][]*Var, layers)
	for _, v := range vars {
		out[v.Layer] = append(out[v.Layer], v)
	}
	return out
}

type compBuf = compute.Buffer

// slot is a swap-in buffer: a GoMLX tensor over a backend shared buffer,
// so bytes written into it are what an executor reads, with no copy and no
// allocation. A slot is bound to one variable while its layer runs; between
// layers it keeps the values it was given and the version they are of, so
// a layer whose variables are all still there (the last layer of the
// forward pass, first of the backward one) is not read again.
type slot struct {
	t       *tensors.Tensor
	buf     compute.Buffer
	bytes   []byte
	mem     *layerexec.Buffer // what free gives back
	owner   *Var              // whose values it holds, nil when none
	version uint64            // the parameter version of those values
	busy    bool              // bound for the layer running now
	keep    bool              // its values are promised to a layer later in the pass
	// rows are the rows of owner a row read (readRows) put in it, of
	// parameter version rowsVersion (0: none), sorted and unique.
	rows        []int
	rowsVersion uint64
}

// slotPool hands out slots by class (shape and dtype). It grows only
// while the largest layer of a class has not been seen, so a steady-state
// swap-in allocates nothing. Only the loop goroutine uses it.
type slotPool struct {
	backend compute.Backend
	classes [][]*slot
	bytes   int64 // held by every slot, for metrics
	// spare are buffers made ahead (Offload.spare) that newSlot hands out
	// for their shape before it allocates.
	spare []*slot
}

func newSlotPool(backend compute.Backend, classes int) *slotPool {
	return &slotPool{backend: backend, classes: make([][]*slot, classes)}
}

// holds reports whether v's last slot still has v's values of version.
func (v *Var) holds(version uint64) bool {
	s := v.slot
	return s != nil && s.owner == v && s.version == version
}

// acquire binds a slot to v and reports whether it already holds v's
// values of version (nothing to read). A new owner's slot is chosen among
// the free ones: holding nothing first, then stale values, then values
// nobody was promised; only when none is free is a slot allocated.
func (p *slotPool) acquire(v *Var, version uint64) (*slot, bool, error) {
	if s := v.slot; s != nil && !s.busy && s.owner == v {
		s.busy = true
		return s, s.version == version, nil
	}
	var pick *slot
	rank := 3
	for _, s := range p.classes[v.class] {
		if s.busy || s.keep {
			continue
		}
		r := 2
		switch {
		case s.owner == nil:
			r = 0
		case s.version != version || s.owner.slot != s:
			r = 1
		}
		if r < rank {
			pick, rank = s, r
			if r == 0 {
				break
			}
		}
	}
	if pick == nil {
		s, err := p.newSlot(v.Shape)
		if err != nil {
			return nil, false, fmt.Errorf("zgomlx: a swap-in buffer for %q (%s): %w", v.Name, v.Shape, err)
		}
		p.classes[v.class] = append(p.classes[v.class], s)
		pick = s
	}
	if o := pick.owner; o != nil && o.slot == pick {
		o.slot = nil
	}
	pick.owner, pick.version, pick.busy, pick.rowsVersion = v, 0, true, 0
	v.slot = pick
	return pick, false, nil
}

// mappedSlotBytes is the size from which a swap-in buffer is mapped
// outside the Go heap (layerexec.NewMappedBuffer) rather than allocated in
// it. The buffers live as long as the Trainer and hold a layer's weights
// or a head's block (bench-llm-big at d=1024: 48 MiB of a block's
// weights, 32 MiB of a head block): in the Go heap they count as live
// heap, and the collector lets as much garbage again build up before it
// runs (GOGC), resident memory on top of the buffers themselves. Smaller
// buffers (norms, biases) stay in the heap: a mapping each would cost more
// than it saves.
const mappedSlotBytes = 1 << 20

// newSlot allocates a shared-buffer tensor of shape and keeps its buffer
// and its bytes: mapped outside the Go heap from mappedSlotBytes on.
func (p *slotPool) newSlot(shape shapes.Shape) (*slot, error) {
	for i, s := range p.spare {
		if s.t.Shape().Equal(shape) {
			p.spare = append(p.spare[:i], p.spare[i+1:]...)
			p.bytes += int64(len(s.bytes))
			return s, nil
		}
	}
	if shape.ByteSize() >= mappedSlotBytes {
		return p.newMappedSlot(shape)
	}
	b, err := layerexec.NewBuffer(p.backend, shape)
	if err != nil {
		return nil, err
	}
	s := &slot{t: b.T, buf: b.Buf, bytes: b.Bytes, mem: b}
	p.bytes += int64(len(s.bytes))
	return s, nil
}

// newMappedSlot is newSlot with the buffer's bytes outside the Go heap
// (layerexec.NewMappedBuffer), whatever its size. It does not look among
// the spare slots.
func (p *slotPool) newMappedSlot(shape shapes.Shape) (*slot, error) {
	b, err := layerexec.NewMappedBuffer(p.backend, shape)
	if err != nil {
		return nil, err
	}
	s := &slot{t: b.T, buf: b.Buf, bytes: b.Bytes, mem: b}
	p.bytes += int64(len(s.bytes))
	return s, nil
}

// free releases the slot's memory now (an unmapped buffer's included).
func (s *slot) free() {
	if s.mem != nil {
		s.mem.Free()
		return
	}
	layerexec.Finalize(s.t)
}

// release ends the binding of vars' slots (they keep their values).
func (p *slotPool) release(vars []*Var) {
	for _, v := range vars {
		if v.slot != nil {
			v.slot.busy = false
		}
		v.cur = nil
	}
}

// forget marks a slot's values as invalid (a read into it failed).
func (s *slot) forget() {
	s.owner = nil
	s.version = 0
	s.rowsVersion = 0
}

// unkeepAll clears every promise (a pass ended or was abandoned).
func (p *slotPool) unkeepAll() {
	for _, c := range p.classes {
		for _, s := range c {
			s.keep = false
		}
	}
}

// close frees every slot.
func (p *slotPool) close() {
	for _, c := range p.classes {
		for _, s := range c {
			if s.owner != nil && s.owner.slot == s {
				s.owner.slot = nil
			}
			s.free()
		}
	}
	p.classes = nil
	p.bytes = 0
	freeSlots(p.spare)
	p.spare = nil
}

// freeSlots frees slots that belong to no pool class.
func freeSlots(ss []*slot) {
	for _, s := range ss {
		s.free()
	}
}
