package zinf

import (
	"context"
	"fmt"
	"strconv"

	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// InitInPlace gives a tensor of an inference runtime (Options.Inference)
// its values where they already lie: bytes [off, off+numel x size) of the
// file at path, encoded in dtype, which must be the runtime's parameter
// dtype (a checkpoint's or a safetensors file's tensor). Each swap-in reads
// them from there with O_DIRECT (see swapper.Store.Adopt); nothing is
// written to the swap files and the file is never written or removed.
// Any offset works (see swapper.Store.Adopt). Where reading in place
// cannot be done — no O_DIRECT, a tensor not on NVMe or moved in pieces,
// several ranks — it returns an error wrapping swapper.ErrNotInPlace and
// changes nothing: call Init instead.
func (r *Runtime) InitInPlace(ctx context.Context, name, path string, off int64, dtype tensor.DType) error {
	if err := r.closedErr("init in place "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.settled(ctx); err != nil {
		return err
	}
	numel, ok := r.model.Numel[name]
	if !ok {
		return fmt.Errorf("zinf: init in place %q: not a tensor of the model", name)
	}
	if !r.inference {
		return fmt.Errorf("zinf: init in place %q: %w: a training runtime keeps fp32 masters (open with Options.Inference)", name, swapper.ErrNotInPlace)
	}
	if dtype != r.DType {
		return fmt.Errorf("zinf: init in place %q: %w: the file holds %s, the runtime's parameters are %s", name, swapper.ErrNotInPlace, dtype, r.DType)
	}
	if r.World > 1 {
		return fmt.Errorf("zinf: init in place %q: %w: each of %d ranks holds a partition", name, swapper.ErrNotInPlace, r.World)
	}
	r.mu.Lock()
	done := r.inited[name]
	r.mu.Unlock()
	if done {
		return fmt.Errorf("zinf: init in place %q: already initialized", name)
	}
	if err := r.Params.Adopt(ctx, name, path, off); err != nil {
		return fmt.Errorf("zinf: init in place %q: %w", name, err)
	}
	r.mu.Lock()
	r.inited[name] = true
	r.params = append(r.params, name)
	r.numel[name] = int(numel)
	r.mu.Unlock()
	return nil
}
