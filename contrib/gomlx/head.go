package zgomlx

import (
	"context"
	"fmt"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/swapper"
)

// headExec is the per-layer executors' head: one block's forward and
// backward, and the Go buffers the blocks pass through.
type headExec struct {
	hd    *BlockedHead
	table *Var
	fwd   *graph.Exec // (h, e) -> logits of the block
	bwd   *graph.Exec // (h, e, dl) -> dh, de
	// Reused buffers: one block of the table, one block of the logits'
	// gradient.
	block, dl *slot
	pool      *slotPool
	parts     []*tensors.Tensor // the blocks' dh, summed last first
	grad32    []float32
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
		return graph.Gradient(graph.ReduceAllSum(graph.Mul(headLogits(h, e), dl)), h, e)
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
	he.block, he.dl = nil, nil
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

// forward computes the logits [..., vocab] of h block by block into a
// new tensor (the caller's).
func (lp *loop) headForward(ctx context.Context, h *tensors.Tensor) (*tensors.Tensor, error) {
	he := lp.ex.head
	vocab := he.table.Shape.Dimensions[0]
	dims := append(h.Shape().Dimensions[:h.Rank()-1:h.Rank()-1], vocab)
	out, err := tensors.FromShapeForBackend(lp.ex.backend, 0, shapes.Make(h.DType(), dims...))
	if err != nil {
		return nil, err
	}
	_, ob, err := layerexec.Shared(lp.ex.backend, out)
	if err != nil {
		layerexec.Finalize(out)
		return nil, err
	}
	es := h.DType().Size()
	lead := h.Shape().Size() / h.Shape().Dim(-1)
	err = he.blocks(ctx, lp.src, func(row, rows int) error {
		l, err := lp.call1(he.fwd, h, he.block.t)
		if err != nil {
			return fmt.Errorf("zgomlx: head block at row %d: %w", row, err)
		}
		defer layerexec.Finalize(l[0])
		_, lb, err := layerexec.Shared(lp.ex.backend, l[0])
		if err != nil {
			return err
		}
		for t := range lead {
			copy(ob[(t*vocab+row)*es:(t*vocab+row+rows)*es], lb[t*he.hd.Rows*es:(t*he.hd.Rows+rows)*es])
		}
		return nil
	})
	if err != nil {
		layerexec.Finalize(out)
		return nil, err
	}
	return out, nil
}

// headBackward hands over the table's gradient block by block and
// returns h's gradient (the caller's), the blocks' parts added last
// block first.
func (lp *loop) headBackward(ctx context.Context, h, dlogits *tensors.Tensor) (*tensors.Tensor, error) {
	he := lp.ex.head
	v := he.table
	vocab, d := v.Shape.Dimensions[0], v.Shape.Dimensions[1]
	B := he.hd.Rows
	if h.DType() != dtypes.Float32 || dlogits.DType() != dtypes.Float32 {
		return nil, fmt.Errorf("zgomlx: Net.Head: the last layer's output is %s, its gradient %s (allowed: Float32, whose blocks' gradients the head adds in Go as GoMLX does)", h.DType(), dlogits.DType())
	}
	lead := h.Shape().Size() / h.Shape().Dim(-1)
	dims := append(h.Shape().Dimensions[:h.Rank()-1:h.Rank()-1], B)
	dlb, err := he.buffer(&he.dl, shapes.Make(dlogits.DType(), dims...))
	if err != nil {
		return nil, err
	}
	_, db, err := layerexec.Shared(lp.ex.backend, dlogits)
	if err != nil {
		return nil, err
	}
	es := dlogits.DType().Size()
	defer func() {
		finalizeAll(he.parts)
		he.parts = he.parts[:0]
	}()
	err = he.blocks(ctx, lp.src, func(row, rows int) error {
		clear(dlb.bytes)
		for t := range lead {
			copy(dlb.bytes[t*B*es:(t*B+rows)*es], db[(t*vocab+row)*es:(t*vocab+row+rows)*es])
		}
		outs, err := lp.call1(he.bwd, h, he.block.t, dlb.t)
		if err != nil {
			return fmt.Errorf("zgomlx: backward of the head block at row %d: %w", row, err)
		}
		he.parts = append(he.parts, outs[0])
		defer layerexec.Finalize(outs[1])
		_, gb, err := layerexec.Shared(lp.ex.backend, outs[1])
		if err != nil {
			return err
		}
		n := rows * d
		var g []float32
		if v.dtype == swapper.Float32 {
			g = buffers.Float32Bytes(gb)[:n]
		} else {
			if cap(he.grad32) < n {
				he.grad32 = make([]float32, n)
			}
			g = he.grad32[:n]
			swapper.Decode(v.dtype, g, gb[:n*v.dtype.Size()])
		}
		if err := lp.src.gradRange(ctx, v, row*d, g); err != nil {
			return fmt.Errorf("zgomlx: gradient of %q rows [%d, %d): %w", v.Name, row, row+rows, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// h's gradient: the last block's part, then the others added in
	// reverse block order, as GoMLX's autodiff sums the reference's.
	nb := len(he.parts)
	dh := he.parts[nb-1]
	he.parts = he.parts[:nb-1]
	_, hb, err := layerexec.Shared(lp.ex.backend, dh)
	if err != nil {
		layerexec.Finalize(dh)
		return nil, err
	}
	acc := buffers.Float32Bytes(hb)
	for i := len(he.parts) - 1; i >= 0; i-- {
		_, pb, err := layerexec.Shared(lp.ex.backend, he.parts[i])
		if err != nil {
			layerexec.Finalize(dh)
			return nil, err
		}
		p := buffers.Float32Bytes(pb)[:len(acc)]
		for j := range acc {
			acc[j] = acc[j] + p[j]
		}
	}
	return dh, nil
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
