package zgomlx

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/internal/base/vec"
	"github.com/zinfio/zinf/swapper"
)

// headExec is the per-layer executors' head: one block's forward and
// backward, and the Go buffers the blocks pass through.
type headExec struct {
	hd    *BlockedHead
	table *Var
	fwd   *graph.Exec // (h, e) -> logits of the block
	bwd   *graph.Exec // (h, e, dl) -> dh, de
	// Reused buffers: one block of the table, and two blocks of the
	// logits' gradient (the next micro-batch's is gathered while the
	// worker computes with the other).
	block  *slot
	dl     [2]*slot
	pool   *slotPool
	grad32 []float32 // a block's gradient widened to fp32
	// sum is a block's gradient summed over micro-batches, in sumMem:
	// mapped outside the Go heap where the backend allows it, for the
	// reason swap-in buffers are (mappedSlotBytes).
	sum    []float32
	sumMem *layerexec.Buffer
	// hold, during a layer-major step's backward pass, keeps the head's
	// gradient of the rows the step's lookups name (headHold).
	hold *headHold
}

func newHeadExec(ex *executors, hd *BlockedHead) (*headExec, error) {
	if hd.Rows <= 0 {
		return nil, fmt.Errorf("zgomlx: Net.Head.Rows %d (allowed: > 0)", hd.Rows)
	}
	v := ex.byName[hd.Table]
	if v == nil {
		return nil, fmt.Errorf("zgomlx: Net.Head.Table %q is not a variable zinf holds (allowed: a registered variable of an earlier layer, such as the embedding table)", hd.Table)
	}
	if err := hd.check(v.Shape); err != nil {
		return nil, err
	}
	he := &headExec{hd: hd, table: v, pool: newSlotPool(ex.backend, 1)}
	var err error
	if he.fwd, err = graph.NewExec(ex.backend, func(h, e *graph.Node) *graph.Node { return headLogits(h, e) }); err != nil {
		return nil, err
	}
	he.fwd.WithName("zgomlx.head_block")
	if he.bwd, err = graph.NewExec(ex.backend, func(h, e, dl *graph.Node) []*graph.Node {
		gs := graph.Gradient(graph.ReduceAllSum(graph.Mul(headLogits(h, e), dl)), h, e)
		for i, g := range gs {
			gs[i] = skipIdentity(g)
		}
		return gs
	}); err != nil {
		return nil, err
	}
	he.bwd.WithName("zgomlx.head_block_backward")
	return he, nil
}

func (he *headExec) close() {
	he.fwd.Finalize()
	he.bwd.Finalize()
	he.pool.close()
	he.block, he.dl = nil, [2]*slot{}
	he.sumMem.Free()
	he.sum, he.sumMem = nil, nil
}

// sumBuffer returns he.sum with room for n float32s, made (again) when it
// has less.
func (he *headExec) sumBuffer(backend compute.Backend, n int) ([]float32, error) {
	if len(he.sum) >= n {
		return he.sum[:n], nil
	}
	he.sumMem.Free()
	he.sum, he.sumMem = nil, nil
	b, err := layerexec.NewMappedBuffer(backend, shapes.Make(dtypes.Float32, n))
	if err != nil {
		return nil, fmt.Errorf("zgomlx: head gradient buffer of %d floats: %w", n, err)
	}
	he.sumMem, he.sum = b, buffers.Float32Bytes(b.Bytes)
	return he.sum[:n], nil
}

// buffer returns *s, (re)allocated for shape.
func (he *headExec) buffer(s **slot, shape shapes.Shape) (*slot, error) {
	if *s != nil && (*s).t.Shape().Equal(shape) {
		return *s, nil
	}
	if *s != nil {
		_ = (*s).t.FinalizeAll()
		he.pool.bytes -= int64(len((*s).bytes))
	}
	n, err := he.pool.newSlot(shape)
	if err != nil {
		return nil, fmt.Errorf("zgomlx: head buffer %s: %w", shape, err)
	}
	*s = n
	return n, nil
}

// blocks runs fn over the table's blocks in order, the block's rows in
// he.block (zero rows after a short last block).
func (he *headExec) blocks(ctx context.Context, src paramSource, fn func(row, rows int) error) error {
	v := he.table
	d := v.Shape.Dimensions[1]
	blk, err := he.buffer(&he.block, shapes.Make(v.Shape.DType, he.hd.Rows, d))
	if err != nil {
		return err
	}
	rb := d * v.dtype.Size()
	return src.readBlocks(ctx, v, blk.bytes, func(row, rows int) error {
		if rows < he.hd.Rows {
			clear(blk.bytes[rows*rb:])
		}
		return fn(row, rows)
	})
}

// headForward computes the logits [..., vocab] of h block by block into
// a new tensor (the caller's).
func (lp *loop) headForward(ctx context.Context, h *tensors.Tensor) (*tensors.Tensor, error) {
	outs, err := lp.headForwardAll(ctx, []*tensors.Tensor{h})
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}

// headForwardAll computes the logits of every micro-batch's h (a
// layer-major step's k) in one read of the table: each block, once in
// its buffer, serves every h in turn. Each block's logits are the same
// executor call on the same bytes as for one h alone, so the logits are
// the same bits.
func (lp *loop) headForwardAll(ctx context.Context, hs []*tensors.Tensor) ([]*tensors.Tensor, error) {
	he := lp.ex.head
	vocab := he.table.Shape.Dimensions[0]
	outs := make([]*tensors.Tensor, len(hs))
	obs := make([][]byte, len(hs))
	for m, h := range hs {
		dims := append(h.Shape().Dimensions[:h.Rank()-1:h.Rank()-1], vocab)
		out, err := tensors.FromShapeForBackend(lp.ex.backend, 0, shapes.Make(h.DType(), dims...))
		if err == nil {
			outs[m] = out
			_, obs[m], err = layerexec.Shared(lp.ex.backend, out)
		}
		if err != nil {
			finalizeAll(outs)
			return nil, err
		}
	}
	err := he.blocks(ctx, lp.src, func(row, rows int) error {
		// Each micro-batch's logits are copied out while the worker
		// computes the next one's.
		return lp.pipeline(len(hs), func(m int) ([]any, error) {
			return []any{hs[m], he.block.t}, nil
		}, func(m int, l []*tensors.Tensor, err error) error {
			if err != nil {
				finalizeAll(l)
				return fmt.Errorf("zgomlx: head block at row %d: %w", row, err)
			}
			defer finalizeAll(l)
			_, lb, err := layerexec.Shared(lp.ex.backend, l[0])
			if err != nil {
				return err
			}
			h := hs[m]
			es := h.DType().Size()
			lead := h.Shape().Size() / h.Shape().Dim(-1)
			ob := obs[m]
			for t := range lead {
				copy(ob[(t*vocab+row)*es:(t*vocab+row+rows)*es], lb[t*he.hd.Rows*es:(t*he.hd.Rows+rows)*es])
			}
			return nil
		}, he.fwd)
	})
	if err != nil {
		finalizeAll(outs)
		return nil, err
	}
	return outs, nil
}

// headBackward hands over the table's gradient block by block and
// returns h's gradient (the caller's), the blocks' parts added last
// block first.
func (lp *loop) headBackward(ctx context.Context, h, dlogits *tensors.Tensor) (*tensors.Tensor, error) {
	dhs, err := lp.headBackwardAll(ctx, []*tensors.Tensor{h}, []*tensors.Tensor{dlogits})
	if err != nil {
		return nil, err
	}
	return dhs[0], nil
}

// headBackwardAll is the head's backward pass for every micro-batch (h
// and its logits' gradient) in one read of the table; it returns each
// h's gradient (the caller's). Per block, the micro-batches' table
// gradients are added in micro-batch order (the first one copied) and
// handed over once: zinf adds that sum to its +0 start, which gives the
// bits of adding them one by one from +0, as the micro-batch-major order
// does — for the rows no lookup of the step names. The rows a lookup
// names (he.hold, a layer-major step) get other terms between the
// micro-batches' (the lookup's gradient of each micro-batch), so their
// head gradients are kept per micro-batch and handed over with the
// lookup's, in that order (mergeLookup); the block's hand-over gives them
// +0. Each micro-batch's dh sums its
// blocks' parts last block first, as GoMLX's autodiff sums the
// reference's.
func (lp *loop) headBackwardAll(ctx context.Context, hs, dls []*tensors.Tensor) ([]*tensors.Tensor, error) {
	he := lp.ex.head
	v := he.table
	vocab, d := v.Shape.Dimensions[0], v.Shape.Dimensions[1]
	B := he.hd.Rows
	for m, h := range hs {
		if h.DType() != dtypes.Float32 || dls[m].DType() != dtypes.Float32 {
			return nil, fmt.Errorf("zgomlx: Net.Head: the last layer's output is %s, its gradient %s (allowed: Float32, whose blocks' gradients the head adds in Go as GoMLX does)", h.DType(), dls[m].DType())
		}
	}
	dbs := make([][]byte, len(hs))
	for m, dl := range dls {
		var err error
		if _, dbs[m], err = layerexec.Shared(lp.ex.backend, dl); err != nil {
			return nil, err
		}
	}
	parts := make([][]*tensors.Tensor, len(hs))
	defer func() {
		for _, p := range parts {
			finalizeAll(p)
		}
	}()
	sumB, err := he.sumBuffer(lp.ex.backend, B*d)
	if err != nil {
		return nil, err
	}
	hold := he.hold
	err = he.blocks(ctx, lp.src, func(row, rows int) error {
		n := rows * d
		sum := sumB[:n]
		// The rows of the hold in this block: hold.rows[h0:h1].
		var h0, h1 int
		if hold != nil {
			h0, _ = slices.BinarySearch(hold.rows, row)
			h1, _ = slices.BinarySearch(hold.rows, row+rows)
		}
		// Each micro-batch's logits' gradient block is gathered, and the
		// one before's outputs taken, while the worker computes.
		err := lp.pipeline(len(hs), func(m int) ([]any, error) {
			h := hs[m]
			lead := h.Shape().Size() / h.Shape().Dim(-1)
			dims := append(h.Shape().Dimensions[:h.Rank()-1:h.Rank()-1], B)
			dlb, err := he.buffer(&he.dl[m%2], shapes.Make(dls[m].DType(), dims...))
			if err != nil {
				return nil, err
			}
			es := dls[m].DType().Size()
			db := dbs[m]
			clear(dlb.bytes)
			for t := range lead {
				copy(dlb.bytes[t*B*es:(t*B+rows)*es], db[(t*vocab+row)*es:(t*vocab+row+rows)*es])
			}
			return []any{h, he.block.t, dlb.t}, nil
		}, func(m int, outs []*tensors.Tensor, err error) error {
			if err != nil {
				finalizeAll(outs)
				return fmt.Errorf("zgomlx: backward of the head block at row %d: %w", row, err)
			}
			parts[m] = append(parts[m], outs[0])
			defer layerexec.Finalize(outs[1])
			_, gb, err := layerexec.Shared(lp.ex.backend, outs[1])
			if err != nil {
				return err
			}
			var g []float32
			if v.dtype == swapper.Float32 {
				g = buffers.Float32Bytes(gb)[:n]
			} else {
				if cap(he.grad32) < n {
					he.grad32 = make([]float32, n)
				}
				g = he.grad32[:n]
				buffers.Decode(v.dtype, g, gb[:n*v.dtype.Size()])
			}
			for i := h0; i < h1; i++ {
				r := hold.rows[i] - row
				copy(hold.parts[m][i*d:(i+1)*d], g[r*d:(r+1)*d])
			}
			if m == 0 {
				copy(sum, g)
			} else {
				vec.Add(sum, g)
			}
			return nil
		}, he.bwd)
		if err != nil {
			return err
		}
		// The block's sum in one hand-over, the held rows' zeroed: they
		// get +0 now (their sum so far in this step is +0 too, the
		// head's being their first term), their terms later
		// (mergeLookup). One hand-over writes each of the block's
		// pieces of the gradient once.
		for i := h0; i < h1; i++ {
			r := hold.rows[i] - row
			clear(sum[r*d : (r+1)*d])
		}
		if err := lp.src.gradRange(ctx, v, row*d, sum); err != nil {
			return fmt.Errorf("zgomlx: gradient of %q rows [%d, %d): %w", v.Name, row, row+rows, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Each h's gradient: the last block's part, then the others added in
	// reverse block order, as GoMLX's autodiff sums the reference's.
	dhs := make([]*tensors.Tensor, len(hs))
	for m, ps := range parts {
		nb := len(ps)
		dh := ps[nb-1]
		_, hb, err := layerexec.Shared(lp.ex.backend, dh)
		if err != nil {
			finalizeAll(dhs)
			return nil, err
		}
		parts[m] = ps[:nb-1]
		dhs[m] = dh
		acc := buffers.Float32Bytes(hb)
		for i := nb - 2; i >= 0; i-- {
			_, pb, err := layerexec.Shared(lp.ex.backend, ps[i])
			if err != nil {
				finalizeAll(dhs)
				return nil, err
			}
			vec.Add(acc, buffers.Float32Bytes(pb)[:len(acc)])
		}
	}
	return dhs, nil
}

// headHold is a layer-major step's hold on the rows of the head's table
// that the step's lookups name (the table is the first layer's lookup):
// the head's gradient of those rows, per micro-batch, kept until the
// table's own layer hands its lookup's gradients over, micro-batch by
// micro-batch. There both are added in the micro-batch-major order
// (head, lookup, next micro-batch's head, ...) into acc, which after the
// last micro-batch goes to zinf at once: the bits of handing them over
// one by one.
type headHold struct {
	rows  []int       // sorted, unique
	parts [][]float32 // per micro-batch: the head's gradient of rows, row after row
	acc   []float32
	next  int // the next micro-batch to merge
}

// holdLookupRows starts a hold on the rows every micro-batch's ids
// (input v.lookup of batches) name.
func (he *headExec) holdLookupRows(backend compute.Backend, batches [][]*tensors.Tensor) error {
	v := he.table
	var ids []int
	for _, in := range batches {
		if v.lookup >= len(in) {
			return fmt.Errorf("zgomlx: lookup %q reads its rows from input %d; the batch has %d inputs", v.Name, v.lookup, len(in))
		}
		var err error
		if ids, err = idsOf(backend, in[v.lookup], ids); err != nil {
			return fmt.Errorf("zgomlx: lookup %q: input %d: %w", v.Name, v.lookup, err)
		}
	}
	vocab, d := v.Shape.Dimensions[0], v.Shape.Dimensions[1]
	for _, r := range ids {
		if r < 0 || r >= vocab {
			return fmt.Errorf("zgomlx: lookup %q: id %d outside the table's %d rows", v.Name, r, vocab)
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	h := &headHold{rows: ids, parts: make([][]float32, len(batches)), acc: make([]float32, len(ids)*d)}
	for m := range h.parts {
		h.parts[m] = make([]float32, len(ids)*d)
	}
	he.hold = h
	return nil
}

// holds reports whether v's lookup gradient goes to mergeLookup: a hold
// on v's rows is on.
func (he *headExec) holds(v *Var) bool { return he != nil && he.hold != nil && he.table == v }

// mergeLookup adds the next micro-batch's head gradient of the held rows,
// then its lookup's row sums (rows sorted and unique, a subset of the
// held ones), into the hold's sum; after the last micro-batch it reports
// done: the sum (hold.rows, hold.acc) is then the step's gradient of
// those rows, to hand over once.
func (he *headExec) mergeLookup(rows []int, sums []float32) (done bool, err error) {
	h, v := he.hold, he.table
	d := v.Shape.Dimensions[1]
	if h.next >= len(h.parts) {
		return false, fmt.Errorf("zgomlx: gradient of %q: %d lookup gradients in a step of %d micro-batches", v.Name, h.next+1, len(h.parts))
	}
	if h.next == 0 {
		clear(h.acc) // the sum starts at +0, as zinf's does
	}
	vec.Add(h.acc, h.parts[h.next])
	for i, r := range rows {
		j, ok := slices.BinarySearch(h.rows, r)
		if !ok {
			return false, fmt.Errorf("zgomlx: gradient of %q: row %d is not among the step's lookup rows", v.Name, r)
		}
		vec.Add(h.acc[j*d:(j+1)*d], sums[i*d:(i+1)*d])
	}
	h.next++
	return h.next == len(h.parts), nil
}

// pipeline runs k calls of e on the worker, the arguments of call m from
// args(m), and hands each call's outputs (or its error) to done(m, ...)
// in order. args(m+1) and done(m) run while call m+1 computes: the Go
// work between two calls is off the worker's path. On an error it waits
// for the call in flight, finalizes its outputs, and returns the first
// error; done owns the outputs it is handed, error or not.
func (lp *loop) pipeline(k int, args func(m int) ([]any, error), done func(m int, outs []*tensors.Tensor, err error) error, e *graph.Exec) error {
	if k == 0 {
		return nil
	}
	a, err := args(0)
	if err != nil {
		return err
	}
	lp.jobs <- job{exec: e, args: a}
	for m := range k {
		var next []any
		var aerr error
		if m+1 < k {
			next, aerr = args(m + 1) // while call m computes
		}
		r := <-lp.results
		lp.took(-1, r.took)
		inFlight := false
		if next != nil && aerr == nil && r.err == nil {
			lp.jobs <- job{exec: e, args: next}
			inFlight = true
		}
		derr := done(m, r.outs, r.err) // while call m+1 computes
		if err := cmp.Or(aerr, derr); err != nil || r.err != nil {
			if inFlight {
				r := <-lp.results
				lp.took(-1, r.took)
				finalizeAll(r.outs)
			}
			return cmp.Or(derr, aerr, r.err)
		}
	}
	return nil
}

// call1 runs one executor call on the worker and waits for it.
func (lp *loop) call1(e *graph.Exec, args ...*tensors.Tensor) ([]*tensors.Tensor, error) {
	a := make([]any, len(args))
	for i, t := range args {
		a[i] = t
	}
	lp.jobs <- job{exec: e, args: a}
	r := <-lp.results
	lp.took(-1, r.took)
	return r.outs, r.err
}
