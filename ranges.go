package zinf

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// Row and range access: a loop that needs only part of a tensor (an
// embedding lookup reads the rows a batch uses; an output head computed in
// blocks) reads and accumulates that part only. Indices are those of the
// FULL tensor, flattened row-major; a row of a tensor of shape [d0, d1,
// ...] is d1 x ... elements (RowLen), one element for a vector or a
// scalar.

// RowLen returns the elements of one row of a tensor of the model: the
// product of its shape beyond the first dimension (1 for a vector or a
// scalar), or 0 for a name the model does not have.
func (r *Runtime) RowLen(name string) int {
	d, ok := r.desc(name)
	if !ok {
		return 0
	}
	n := 1
	if len(d.Shape) > 1 {
		for _, s := range d.Shape[1:] {
			n *= s
		}
	}
	return n
}

func (r *Runtime) desc(name string) (tensor.Desc, bool) {
	for _, d := range r.model.Descs {
		if d.Name == name {
			return d, true
		}
	}
	return tensor.Desc{}, false
}

// ReadParamRange writes elements [lo, hi) of a parameter, encoded in dtype
// (little-endian), into dst ((hi-lo) x dtype.Size() bytes), as
// ReadParamBytes does for the whole tensor: the stored bytes as they are
// when dtype is the param dtype, converted element by element otherwise,
// with no Go heap buffer of the tensor's size. The parameter's layer must
// be begun. Without Options.GatherLayers the range must lie in this
// rank's partition (see Partition); with it, anywhere in the tensor.
func (r *Runtime) ReadParamRange(ctx context.Context, name string, lo, hi int, dtype tensor.DType, dst []byte) (err error) {
	if err := r.closedErr("read range of "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return err
	}
	defer r.checkRead(ctx, &err)
	return r.readSpans(ctx, "read range of", name, []param.Span{{Lo: lo, Hi: hi}}, dtype, dst)
}

// ReadParamRows writes the given rows of a parameter (see RowLen), in the
// order given — duplicates allowed, as an embedding lookup has them —
// encoded in dtype, back to back into dst (len(rows) x RowLen x
// dtype.Size() bytes). Only those rows are read. Residency and partition
// rules are ReadParamRange's.
func (r *Runtime) ReadParamRows(ctx context.Context, name string, rows []int, dtype tensor.DType, dst []byte) (err error) {
	if err := r.closedErr("read rows of "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return err
	}
	defer r.checkRead(ctx, &err)
	spans, err := r.rowSpans("read rows of", name, rows, false)
	if err != nil {
		return err
	}
	return r.readSpans(ctx, "read rows of", name, spans, dtype, dst)
}

// rowSpans turns rows into element spans of the full tensor; ascending
// requires them strictly ascending.
func (r *Runtime) rowSpans(op, name string, rows []int, ascending bool) ([]param.Span, error) {
	numel, ok := r.model.Numel[name]
	if !ok {
		return nil, fmt.Errorf("zinf: %s %q: not a tensor of the model", op, name)
	}
	rl := r.RowLen(name)
	nrows := int(numel) / rl
	spans := make([]param.Span, len(rows))
	for i, row := range rows {
		if row < 0 || row >= nrows {
			return nil, fmt.Errorf("zinf: %s %q: row %d (index %d) is outside the tensor's %d rows", op, name, row, i, nrows)
		}
		if ascending && i > 0 && row <= rows[i-1] {
			return nil, fmt.Errorf("zinf: %s %q: row %d after row %d: rows must be strictly ascending (sum a row's gradients before handing them over)", op, name, row, rows[i-1])
		}
		spans[i] = param.Span{Lo: row * rl, Hi: (row + 1) * rl}
	}
	return spans, nil
}

// readSpans reads full-tensor spans of name into dst in dtype.
func (r *Runtime) readSpans(ctx context.Context, op, name string, spans []param.Span, dtype tensor.DType, dst []byte) error {
	numel, ok := r.model.Numel[name]
	if !ok {
		return fmt.Errorf("zinf: %s %q: not a tensor of the model", op, name)
	}
	if !dtype.Valid() {
		return fmt.Errorf("zinf: %s %q: unknown dtype %d", op, name, dtype)
	}
	total := 0
	for _, sp := range spans {
		if sp.Lo < 0 || sp.Hi < sp.Lo || int64(sp.Hi) > numel {
			return fmt.Errorf("zinf: %s %q: range [%d, %d) is outside the tensor's %d elements", op, name, sp.Lo, sp.Hi, numel)
		}
		total += sp.Hi - sp.Lo
	}
	sz := dtype.Size()
	if len(dst) != total*sz {
		return fmt.Errorf("zinf: %s %q: destination of %d bytes for %d elements of %s (%d bytes)", op, name, len(dst), total, dtype, total*sz)
	}
	if r.gatherOn {
		full, err := r.gatheredBytes("read", name)
		if err != nil {
			return err
		}
		es, at := r.DType.Size(), 0
		for _, sp := range spans {
			n := sp.Hi - sp.Lo
			buffers.Transcode(r.DType, full[sp.Lo*es:sp.Hi*es], dtype, dst[at:at+n*sz])
			at += n * sz
		}
		return nil
	}
	plo, phi := partition(int(numel), r.Rank, r.World)
	local := make([]param.Span, len(spans))
	for i, sp := range spans {
		if sp.Hi > sp.Lo && (sp.Lo < plo || sp.Hi > phi) {
			return fmt.Errorf("zinf: %s %q: range [%d, %d) is not in rank %d's partition [%d, %d) (Options.GatherLayers reads any range)", op, name, sp.Lo, sp.Hi, r.Rank, plo, phi)
		}
		local[i] = param.Span{Lo: max(sp.Lo-plo, 0), Hi: max(sp.Hi-plo, 0)}
	}
	return r.Params.ReadSpansAs(ctx, name, local, dtype, dst)
}

// AccumulateGradRange adds a micro-step's gradient for elements [lo,
// lo+len(g)) of a parameter; every other element counts as 0. It is the
// partition form of AccumulateGrad: this rank keeps the part of the range
// inside its partition, so a rank that computes only its partition passes
// just that (lo = Partition's lo) and never allocates the full length;
// a layer computed in blocks hands over each block. Any pieces, in any
// number of calls, give bit for bit what AccumulateGrad of the full
// gradient with zeros elsewhere gives (the sum starts at +0 and never
// holds -0, so a zero added changes nothing). Written behind like
// AccumulateGrad, with its retry rule.
func (r *Runtime) AccumulateGradRange(ctx context.Context, name string, lo int, g []float32) error {
	if err := r.closedErr("accumulate range of "+strconv.Quote(name), grad.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	numel, ok := r.model.Numel[name]
	if !ok {
		return fmt.Errorf("zinf: accumulate range of %q: not a tensor of the model", name)
	}
	if lo < 0 || int64(lo)+int64(len(g)) > numel {
		return fmt.Errorf("zinf: accumulate range of %q: range [%d, %d) is outside the tensor's %d elements", name, lo, lo+len(g), numel)
	}
	return r.accumulateSpans(ctx, name, []param.Span{{Lo: lo, Hi: lo + len(g)}}, g)
}

// AccumulateGradRows adds a micro-step's gradient for the given rows of a
// parameter (see RowLen; strictly ascending: a row used twice in a batch,
// as an embedding's rows are, has its gradients summed by the caller
// first), g holding them back to back (len(rows) x RowLen); every other
// element counts as 0. Results and partition rules are
// AccumulateGradRange's: one call costs what the rows' bytes cost in
// memory, plus the read-modify-write of the pieces of the gradient they
// fall in.
func (r *Runtime) AccumulateGradRows(ctx context.Context, name string, rows []int, g []float32) error {
	if err := r.closedErr("accumulate rows of "+strconv.Quote(name), grad.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	spans, err := r.rowSpans("accumulate rows of", name, rows, true)
	if err != nil {
		return err
	}
	if len(g) != len(rows)*r.RowLen(name) {
		return fmt.Errorf("zinf: accumulate rows of %q: %d values for %d rows of %d", name, len(g), len(rows), r.RowLen(name))
	}
	return r.accumulateSpans(ctx, name, spans, g)
}

// accumulateSpans keeps the parts of full-tensor spans (ascending,
// disjoint; g back to back) inside this rank's partition.
func (r *Runtime) accumulateSpans(ctx context.Context, name string, spans []param.Span, g []float32) error {
	if r.inference {
		return errInference
	}
	// The partition is one range, so the spans it meets are consecutive:
	// the first clipped at its start, the last at its end, and their
	// values one piece of g.
	plo, phi := r.Partition(name)
	local := make([]grad.Span, 0, len(spans))
	from, to, at := -1, 0, 0
	for _, sp := range spans {
		lo, hi := max(sp.Lo, plo), min(sp.Hi, phi)
		if lo < hi {
			local = append(local, grad.Span{Lo: lo - plo, Hi: hi - plo})
			if from < 0 {
				from = at + lo - sp.Lo
			}
			to = at + hi - sp.Lo
		}
		at += sp.Hi - sp.Lo
	}
	var vals []float32
	if from >= 0 {
		vals = g[from:to]
	}
	t0 := time.Now()
	var err error
	if h := r.held[r.model.Layer[name]]; h != nil {
		// A layer-major visit holds the layer's sums in pinned memory
		// until it ends (EndLayer writes them behind).
		err = r.grads.AccumulateSpansHold(ctx, name, local, vals)
		if _, ok := h.count[name]; !ok && err == nil {
			h.count[name] = 0
		}
	} else {
		err = r.grads.AccumulateSpans(ctx, name, local, vals)
	}
	if err == nil {
		r.train.pending = nil // the gradients changed: a step retried after this checks them again
	}
	r.mu.Lock()
	r.ioWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	r.trace.gradWait(name, t0, err)
	return err
}

// Flush waits for every gradient write-behind of the micro-steps so far
// and returns the first failure (naming its tensor), without stepping:
// for a loop that wants the gradients on disk (before a checkpoint of
// its own, or to learn of a full disk before Step). Gradients whose
// write failed are written again, so once space is back a second Flush
// succeeds; Step flushes by itself.
func (r *Runtime) Flush(ctx context.Context) error {
	if err := r.closedErr("flush", grad.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if r.inference {
		return nil
	}
	t0 := time.Now()
	err := r.grads.Flush(ctx)
	r.mu.Lock()
	r.ioWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("zinf: flush: gradient write-behind: %w", err)
	}
	return nil
}

// Streamed reports whether this rank's partition of a parameter moves in
// pieces (see Options.PieceBytes): it is never swapped in whole, so
// BeginLayer does not wait for it, and reading only the rows or the range
// a step needs (ReadParamRows, ReadParamRange) reads only those pieces
// from NVMe. False for an unknown name.
func (r *Runtime) Streamed(name string) bool { return r.Params.Streamed(name) }

// ReadParamBlocks reads a parameter in blocks of whole rows, in order, for
// a loop that computes with each block while the next one is read (an
// output head streamed in blocks): dst holds one block in dtype — a whole
// number of rows (see RowLen) — and fn is called once per block with its
// first row and its row count (the last block may be shorter; it is at
// dst's start). For a streamed tensor the next piece is read from NVMe
// while fn runs (when the pool has a second piece free), and only one
// block of the tensor is ever in dst; fn must not keep dst. An error from
// fn stops the reading and is returned. Without Options.GatherLayers this
// rank's partition must be the whole tensor (world size 1, or a tensor
// too small to partition; else read its range with ReadParamRange); a
// tensor that is not streamed must have its layer begun.
func (r *Runtime) ReadParamBlocks(ctx context.Context, name string, dtype tensor.DType, dst []byte, fn func(row, rows int) error) (err error) {
	if err := r.closedErr("read blocks of "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return err
	}
	defer r.checkRead(ctx, &err)
	numel, ok := r.model.Numel[name]
	if !ok {
		return fmt.Errorf("zinf: read blocks of %q: not a tensor of the model", name)
	}
	if !dtype.Valid() {
		return fmt.Errorf("zinf: read blocks of %q: unknown dtype %d", name, dtype)
	}
	rl, sz := r.RowLen(name), dtype.Size()
	rows := len(dst) / sz / rl
	if rows == 0 || len(dst) != rows*rl*sz {
		return fmt.Errorf("zinf: read blocks of %q: a destination of %d bytes is not a whole number of rows (%d elements of %s each)", name, len(dst), rl, dtype)
	}
	if fn == nil {
		return fmt.Errorf("zinf: read blocks of %q: no function to call with the blocks", name)
	}
	block := func(lo, n int) error { return fn(lo/rl, n/rl) }
	if r.gatherOn {
		full, err := r.gatheredBytes("read", name)
		if err != nil {
			return err
		}
		es := r.DType.Size()
		for lo := 0; lo < int(numel); lo += rows * rl {
			n := min(rows*rl, int(numel)-lo)
			buffers.Transcode(r.DType, full[lo*es:(lo+n)*es], dtype, dst[:n*sz])
			if err := block(lo, n); err != nil {
				return err
			}
		}
		return nil
	}
	if plo, phi := r.Partition(name); plo != 0 || int64(phi) != numel {
		return fmt.Errorf("zinf: read blocks of %q: rank %d holds elements [%d, %d) of %d (read them with ReadParamRange, or gather the layers: Options.GatherLayers)", name, r.Rank, plo, phi, numel)
	}
	return r.Params.ReadBlocks(ctx, name, rows*rl, dtype, dst, block)
}
