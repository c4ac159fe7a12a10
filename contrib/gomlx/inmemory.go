package zgomlx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf/contrib/gomlx/internal/inmemory"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
)

// The per-layer executors over variables kept in the Store, for package
// reference (see internal/inmemory): its MemoryTrainer runs this loop,
// with these executors, on Go memory.
func init() {
	inmemory.Open = openInMemory
	inmemory.Check = func(net any) error { return net.(Net).check() }
	inmemory.Graph = func(store *model.Store, net any, xs, labels []*graph.Node) *graph.Node {
		return chain(store, net.(Net), xs, labels)
	}
	inmemory.Loss = func(fn train.LossFn, ys, labels []*graph.Node) *graph.Node {
		return Net{TrainLoss: fn}.loss(ys, labels)
	}
}

// chain builds the whole Net in one graph: each layer in its scope, then
// the loss.
func chain(store *model.Store, net Net, xs, labels []*graph.Node) *graph.Node {
	g := xs[0].Graph()
	store.SetTraining(g, true)
	ys := xs
	for _, l := range net.Layers {
		ys = l.fn()(store.Scope(cleanScope(l.Scope)), ys)
	}
	if net.Head != nil {
		if len(ys) != 1 {
			panic(fmt.Errorf("zgomlx: Net.Head needs one output of the last layer, it has %d", len(ys)))
		}
		ys = []*graph.Node{net.Head.graph(store, ys[0])}
	}
	return net.loss(ys, labels)
}

// openInMemory is inmemory.Open: net's executors over store's variables,
// each fed from its own value's buffer, gradients to grad.
func openInMemory(backend compute.Backend, store *model.Store, anyNet any, filter func(*model.Variable) bool, layers []string, grad inmemory.Grad) (inmemory.Run, []inmemory.Var, error) {
	net := anyNet.(Net)
	var also [][]string
	if len(layers) == 0 {
		layers, also = net.Scopes(), net.also()
	}
	vars, scopes, err := collectVars(store, filter, layers, also)
	if err != nil {
		return nil, nil, err
	}
	byName := map[string]*Var{}
	for _, v := range vars {
		byName[v.Name] = v
	}
	ex, err := newExecutors(backend, store, net, groupLayers(vars, len(scopes)), byName)
	if err != nil {
		return nil, nil, err
	}
	out := make([]inmemory.Var, len(vars))
	for i, v := range vars {
		val, err := v.v.Value()
		if err != nil {
			ex.close()
			return nil, nil, fmt.Errorf("zgomlx: variable %q: %w", v.Name, err)
		}
		buf, bytes, err := layerexec.Shared(backend, val)
		if err != nil {
			ex.close()
			return nil, nil, fmt.Errorf("zgomlx: variable %q: %w", v.Name, err)
		}
		v.cur = buf
		out[i] = inmemory.Var{Name: v.Name, DType: v.dtype, Bytes: bytes}
	}
	r := &memRun{ex: ex}
	r.lp = loop{ex: ex, src: &memSource{out: grad}}
	return r, out, nil
}

// memRun is inmemory.Run.
type memRun struct {
	ex *executors
	lp loop
}

func (r *memRun) Step(ctx context.Context, xs, labels []*tensors.Tensor, last bool) (float32, error) {
	return r.lp.run(ctx, xs, labels, last, modeTrain)
}

func (r *memRun) Compute() (time.Duration, []time.Duration) {
	per := make([]time.Duration, len(r.ex.layers))
	copy(per, r.lp.layerCompute)
	return r.lp.compute, per
}

func (r *memRun) Close() { r.ex.close() }

// memSource is the loop's paramSource over the Store's values: nothing to
// swap in, every gradient whole to a function.
type memSource struct {
	out inmemory.Grad
}

func (s *memSource) startPass(bool) {}

func (s *memSource) bind(context.Context, int) error { return nil }

func (s *memSource) unbind(int) {}

func (s *memSource) grad(_ context.Context, v *Var, g []float32, last, _ bool) error {
	return s.out(v.idx, g, last)
}

func (s *memSource) layerDone(context.Context, int) error { return nil }

func (s *memSource) readAhead(context.Context, bool) {}

func (s *memSource) fail(error) bool { return false }

func (s *memSource) readBlocks(context.Context, *Var, []byte, func(int, int) error) error {
	return errors.New("zgomlx: MemoryTrainer does not run Net.Head (its reference is WholeGraph)")
}

// wantsRows: the in-memory reference takes every gradient whole.
func (s *memSource) wantsRows(*Var) bool { return false }

func (s *memSource) gradRowSums(context.Context, *Var, []int, []float32) error {
	return errors.New("zgomlx: MemoryTrainer takes lookups' gradients whole")
}

func (s *memSource) gradRange(context.Context, *Var, int, []float32) error {
	return errors.New("zgomlx: MemoryTrainer does not run Net.Head (its reference is WholeGraph)")
}
