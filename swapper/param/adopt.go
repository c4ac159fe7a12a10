package param

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf/swapper"
)

// Adopt makes the stored partition of name the bytes [off, off+bytes) of
// the file at path, already encoded in the swapper's dtype, read where
// they lie (swapper.Store.Adopt) instead of written to the swap files: an
// Init with no copy. Only a whole NVMe-tier partition that is not moved
// in pieces can be adopted; anything else, and bytes the store cannot
// read in place, return an error wrapping swapper.ErrNotInPlace, with
// nothing changed.
func (s *Swapper) Adopt(ctx context.Context, name, path string, off int64) error {
	t, _, done, err := s.begin(ctx, "adopt", name)
	if err != nil {
		return err
	}
	defer s.wg.Done()
	defer done()
	switch {
	case s.store == nil || t.tier != swapper.TierNVMe:
		return &swapper.TensorError{Op: "adopt", Tensor: name, Err: fmt.Errorf("%w: the partition is not on NVMe", swapper.ErrNotInPlace)}
	case t.streamed:
		return &swapper.TensorError{Op: "adopt", Tensor: name, Err: fmt.Errorf("%w: the partition moves in pieces", swapper.ErrNotInPlace)}
	case t.lo != 0 || t.hi-t.lo != t.n || s.opts.WorldSize > 1:
		return &swapper.TensorError{Op: "adopt", Tensor: name, Err: fmt.Errorf("%w: a partition of a world of %d ranks", swapper.ErrNotInPlace, s.opts.WorldSize)}
	case t.n == 0:
		return &swapper.TensorError{Op: "adopt", Tensor: name, Err: fmt.Errorf("%w: an empty partition", swapper.ErrNotInPlace)}
	}
	if err := s.store.Adopt(t.key, path, off, int64(t.bytes)); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &swapper.TensorError{Op: "adopt", Tensor: name, Err: ErrClosed}
	}
	s.installLocked(t, &staged{t: t})
	return nil
}
