package param

import (
	"log/slog"
	"sync/atomic"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/buffers"
)

// block is one copy of a partition's bytes: a pinned pool buffer or a
// device allocation, held by reference count. Its holders are the resident
// state, the CPU cache, a tier's current or staged copy, and readers for the
// duration of a read. The memory is freed at the last release and never
// earlier, so a cache eviction can never pull a buffer from under a reader.
type block struct {
	refs  atomic.Int32
	buf   *buffers.Buffer // host copy, or nil
	mem   accel.Mem       // device copy, or nil
	dev   accel.Device
	bytes int64 // memory held (the buffer's size class, or the allocation)
	log   *slog.Logger
}

func hostBlock(b *buffers.Buffer) *block {
	blk := &block{buf: b, bytes: int64(b.Cap())}
	blk.refs.Store(1)
	return blk
}

func deviceBlock(dev accel.Device, m accel.Mem, log *slog.Logger) *block {
	blk := &block{mem: m, dev: dev, bytes: m.Size(), log: log}
	blk.refs.Store(1)
	return blk
}

// retain adds a reference for a holder that already has one.
func (b *block) retain() { b.refs.Add(1) }

// tryRetain adds a reference unless the block is already freed; it is what
// a holder with no reference (a cache lookup) must use.
func (b *block) tryRetain() bool {
	for {
		r := b.refs.Load()
		if r <= 0 {
			return false
		}
		if b.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// release drops a reference and frees the memory at the last one.
func (b *block) release() {
	r := b.refs.Add(-1)
	if r > 0 {
		return
	}
	if r < 0 {
		panic("param: block released more times than retained") // broken invariant
	}
	if b.buf != nil {
		b.buf.Release()
	}
	if b.mem != nil {
		if err := b.dev.Free(b.mem); err != nil && b.log != nil {
			b.log.Error("param: freeing device memory", "bytes", b.bytes, "err", err)
		}
	}
}
