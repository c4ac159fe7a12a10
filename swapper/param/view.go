package param

import (
	"context"

	"github.com/zinfio/zinf/swapper"
)

// View returns name's partition where it lies, in the parameter dtype
// (Options.DType, little-endian): the bytes of its pinned buffer, not a
// copy, held until release is called (the buffer is neither freed nor
// reused before that, whatever is swapped meanwhile). Residency rules are
// ReadBytes'. ok is false, and nothing is held, where the partition has
// no single host buffer to view (a tensor streamed in pieces, a GPU-tier
// partition): ReadBytes copies those.
func (s *Swapper) View(ctx context.Context, name string) (b []byte, release func(), ok bool, err error) {
	t, ctx, done, err := s.begin(ctx, "view", name)
	if err != nil {
		return nil, nil, false, err
	}
	defer s.wg.Done()
	defer done()
	if t.n == 0 || t.streamed {
		return nil, nil, false, nil
	}
	blk, err := s.acquireCurrent(ctx, t)
	if err != nil {
		return nil, nil, false, err
	}
	if blk.buf == nil {
		blk.release()
		return nil, nil, false, nil
	}
	released := false
	return blk.buf.Bytes()[:t.bytes:t.bytes], func() {
		if !released {
			released = true
			blk.release()
		}
	}, true, nil
}

// DType is the parameter dtype partitions are stored in (what View's
// bytes hold).
func (s *Swapper) DType() swapper.DType { return s.opts.DType }
