package zinf

// Serving's read path: a loop that only reads the parameters (token
// generation, evaluation) goes from the layer's placement straight to the
// parameter swapper's pinned slots, with none of the step machinery that a
// training loop's reads pass through.

import (
	"context"
	"errors"
	"fmt"

	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// Reader reads a serving runtime's parameters layer by layer: BeginLayer,
// then Copy, CopyRows or View of the layer's tensors, then EndLayer. It
// reads what the last step committed — for a runtime opened with
// Options.Inference, the values Init gave — and knows nothing of steps:
// Runtime.Reader hands one out only where no step's update can be running
// while it reads. Announce the passes on the Runtime (Forward,
// ForwardRepeating, ReleasePrefetched) as for BeginLayer: the prefetching
// is the same. Like the loop methods, a Reader is for one goroutine, and
// its layers are the runtime's: a layer begun through the Reader is ended
// by Reader.EndLayer or Runtime.EndLayer alike.
type Reader struct {
	rt      *Runtime
	params  *param.Swapper
	tensors map[string]readTensor
}

// readTensor is what a read checks a tensor's buffers against.
type readTensor struct {
	numel  int
	rowLen int // elements of one row (RowLen)
}

// errReaderOverlap is Runtime.Reader's refusal on a runtime whose Step
// returns before its update commits.
var errReaderOverlap = errors.New("zinf: reader: Step returns before its update commits (zinf.overlap_update), so a read may meet an update in flight: read through BeginLayer and ReadParamBytes, which wait for each tensor's update")

// Reader returns the runtime's read path for serving. It is refused on
// a runtime where a read could meet a step's update still running —
// Step returns before its update commits (OverlapUpdate: zinf.overlap_update
// on a training runtime) — and where a rank does not hold whole tensors
// (Options.GatherLayers, or a world of more than one rank): BeginLayer and
// ReadParamBytes serve those, waiting for each tensor's update and
// gathering the layer. Everywhere else Step commits its update before it
// returns, so between steps the stored parameters are the committed ones,
// and the Reader has nothing to wait for.
func (r *Runtime) Reader() (*Reader, error) {
	if err := r.closedErr("reader", param.ErrClosed); err != nil {
		return nil, err
	}
	if r.OverlapUpdate() {
		return nil, errReaderOverlap
	}
	if r.gatherOn || r.World > 1 {
		return nil, fmt.Errorf("zinf: reader: rank %d of %d holds a partition of each tensor (Options.GatherLayers gathers them): read through BeginLayer and ReadParamBytes", r.Rank, r.World)
	}
	ts := make(map[string]readTensor, len(r.model.Descs))
	for _, d := range r.model.Descs {
		rl := 1
		if len(d.Shape) > 1 {
			for _, s := range d.Shape[1:] {
				rl *= s
			}
		}
		ts[d.Name] = readTensor{numel: int(r.model.Numel[d.Name]), rowLen: rl}
	}
	return &Reader{rt: r, params: r.Params, tensors: ts}, nil
}

// BeginLayer makes layer l's parameters readable: a barrier that waits for
// their swap-in (a demand miss jumps the queue) and prefetches the layers
// that follow in the pass within the prefetch window, as
// Runtime.BeginLayer does. Pair it with EndLayer.
func (rd *Reader) BeginLayer(ctx context.Context, l int) error {
	if err := rd.rt.checkBegin(l); err != nil {
		return err
	}
	return rd.rt.beginResident(ctx, l)
}

// EndLayer releases layer l's parameters.
func (rd *Reader) EndLayer(l int) { rd.rt.EndLayer(l) }

// Copy writes a parameter, encoded in dtype (little-endian), into dst
// (its elements x dtype.Size() bytes): the stored bytes as they are when
// dtype is the param dtype, converted element by element otherwise, with
// no Go heap buffer of the tensor's size. Its layer must be begun (a
// tensor moved in pieces is read piece by piece whenever it is read).
func (rd *Reader) Copy(ctx context.Context, name string, dtype tensor.DType, dst []byte) error {
	t, err := rd.tensor("read", name, dtype)
	if err != nil {
		return err
	}
	if len(dst) != t.numel*dtype.Size() {
		return fmt.Errorf("zinf: read %q: destination of %d bytes for %d elements of %s", name, len(dst), t.numel, dtype)
	}
	return rd.params.ReadAs(ctx, name, dtype, dst)
}

// CopyRows writes the given rows of a parameter (see Runtime.RowLen), in
// the order given — duplicates allowed, as an embedding lookup has them —
// encoded in dtype, back to back into dst (len(rows) x RowLen x
// dtype.Size() bytes). Only those rows are read: of a tensor moved in
// pieces, only the pieces that hold them.
func (rd *Reader) CopyRows(ctx context.Context, name string, rows []int, dtype tensor.DType, dst []byte) error {
	t, err := rd.tensor("read rows of", name, dtype)
	if err != nil {
		return err
	}
	if len(dst) != len(rows)*t.rowLen*dtype.Size() {
		return fmt.Errorf("zinf: read rows of %q: destination of %d bytes for %d rows of %d elements of %s", name, len(dst), len(rows), t.rowLen, dtype)
	}
	nrows := 0
	if t.rowLen > 0 {
		nrows = t.numel / t.rowLen
	}
	spans := make([]param.Span, len(rows))
	for i, row := range rows {
		if row < 0 || row >= nrows {
			return fmt.Errorf("zinf: read rows of %q: row %d (index %d) is outside the tensor's %d rows", name, row, i, nrows)
		}
		spans[i] = param.Span{Lo: row * t.rowLen, Hi: (row + 1) * t.rowLen}
	}
	return rd.params.ReadSpansAs(ctx, name, spans, dtype, dst)
}

// View returns a parameter's values where the runtime holds them, between
// BeginLayer and EndLayer of its layer: the bytes of its pinned buffer in
// the stored dtype, not a copy, for a caller that computes on them in
// place. The buffer stays the tensor's until release is called; call it
// before EndLayer. ok is false, with nothing held, where there is no
// single buffer to view (a tensor moved in pieces, a GPU-tier one): Copy
// copies those.
func (rd *Reader) View(ctx context.Context, name string) (data []byte, dtype tensor.DType, release func(), ok bool, err error) {
	t, err := rd.tensor("view", name, rd.params.DType())
	if err != nil {
		return nil, 0, nil, false, err
	}
	b, rel, ok, err := rd.params.View(ctx, name)
	if err != nil || !ok {
		return nil, 0, nil, false, err
	}
	dt := rd.params.DType()
	if len(b) != t.numel*dt.Size() {
		rel()
		return nil, 0, nil, false, nil
	}
	return b, dt, rel, true, nil
}

// tensor checks a read of name in dtype (op names it in errors): the
// runtime open, the tensor the model's, the dtype one zinf knows.
func (rd *Reader) tensor(op, name string, dtype tensor.DType) (readTensor, error) {
	r := rd.rt
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return readTensor{}, fmt.Errorf("zinf: %s %q: the runtime is closed: %w", op, name, param.ErrClosed)
	}
	t, ok := rd.tensors[name]
	if !ok {
		return readTensor{}, fmt.Errorf("zinf: %s %q: not a tensor of the model", op, name)
	}
	if !dtype.Valid() {
		return readTensor{}, fmt.Errorf("zinf: %s %q: unknown dtype %d", op, name, dtype)
	}
	return t, nil
}
