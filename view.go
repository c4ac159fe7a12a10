package zinf

import (
	"context"
	"strconv"

	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// ViewParam returns name's values where the runtime holds them, between
// BeginLayer and EndLayer of its layer: the bytes of its pinned buffer in
// the stored dtype, not a copy, for a caller that computes on them in
// place (the native decoder). The buffer stays the tensor's until release
// is called; call it before EndLayer. ok is false, with nothing held,
// where there is no single buffer to view (a tensor moved in pieces
// (Options.PieceBytes), one partitioned over ranks, a GPU-tier one):
// ReadParamBytes copies those.
func (r *Runtime) ViewParam(ctx context.Context, name string) (data []byte, dtype tensor.DType, release func(), ok bool, err error) {
	if err := r.closedErr("view "+strconv.Quote(name), param.ErrClosed); err != nil {
		return nil, 0, nil, false, err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return nil, 0, nil, false, err
	}
	numel, known := r.model.Numel[name]
	if !known {
		return nil, 0, nil, false, &unknownTensorError{name}
	}
	if r.gatherOn || r.World > 1 {
		return nil, 0, nil, false, nil
	}
	b, rel, ok, err := r.Params.View(ctx, name)
	if err != nil || !ok {
		return nil, 0, nil, false, err
	}
	dt := r.Params.DType()
	if int64(len(b)) != numel*int64(dt.Size()) {
		rel()
		return nil, 0, nil, false, nil
	}
	return b, dt, rel, true, nil
}

type unknownTensorError struct{ name string }

func (e *unknownTensorError) Error() string {
	return "zinf: view " + strconv.Quote(e.name) + ": not a tensor of the model"
}
