package param

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// Span is a range [Lo, Hi) of elements of a partition.
type Span struct{ Lo, Hi int }

// ReadSpansAs copies the elements of name's partition that spans name
// (partition-relative, each within [0, PartitionLen); in any order, and
// overlapping spans are allowed) into dst, back to back, encoded in dtype
// (little-endian): dst holds sum(Hi-Lo) elements of dtype. It converts
// from the parameter dtype element by element (buffers.Transcode) with no
// buffer of the partition's size on the Go heap. Residency rules are
// ReadFloat32's; a GPU-tier partition's spans are staged through pinned
// memory one at a time.
func (s *Swapper) ReadSpansAs(ctx context.Context, name string, spans []Span, dtype swapper.DType, dst []byte) error {
	if !dtype.Valid() {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("unknown dtype %d", dtype)}
	}
	t, ctx, done, err := s.begin(ctx, "read", name)
	if err != nil {
		return err
	}
	defer s.wg.Done()
	defer done()
	total := 0
	for _, sp := range spans {
		if sp.Lo < 0 || sp.Hi < sp.Lo || sp.Hi > t.n {
			return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("range [%d, %d) is outside the partition's %d elements", sp.Lo, sp.Hi, t.n)}
		}
		total += sp.Hi - sp.Lo
	}
	if len(dst) != total*dtype.Size() {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("destination has %d bytes, the ranges %d elements of %s", len(dst), total, dtype)}
	}
	if total == 0 {
		return nil
	}
	return s.readSpansInto(ctx, t, spans, dtype, dst)
}

// readSpansInto is ReadSpansAs of t once the arguments are checked.
func (s *Swapper) readSpansInto(ctx context.Context, t *tensor, spans []Span, dtype swapper.DType, dst []byte) error {
	if t.streamed {
		es, ds := s.elem, dtype.Size()
		return s.readStreamed(ctx, t, spans, func(at int, src []byte) error {
			buffers.Transcode(s.opts.DType, src, dtype, dst[at*ds:at*ds+len(src)/es*ds])
			return nil
		})
	}
	blk, err := s.acquireCurrent(ctx, t)
	if err != nil {
		return err
	}
	defer blk.release()
	es, ds := s.elem, dtype.Size()
	if blk.buf != nil {
		src := blk.buf.Bytes()
		at := 0
		for _, sp := range spans {
			n := sp.Hi - sp.Lo
			buffers.Transcode(s.opts.DType, src[sp.Lo*es:sp.Hi*es], dtype, dst[at:at+n*ds])
			at += n * ds
		}
		return nil
	}
	maxSpan := 0
	for _, sp := range spans {
		maxSpan = max(maxSpan, sp.Hi-sp.Lo)
	}
	stage, err := s.pool.Acquire(ctx, maxSpan*es, buffers.PurposeStaging)
	if err != nil {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
	}
	defer stage.Release()
	at := 0
	for _, sp := range spans {
		n := sp.Hi - sp.Lo
		if n == 0 {
			continue
		}
		b := stage.Bytes()[:n*es]
		if err := s.deviceCopy(func(st accel.Stream) error {
			return s.dev.CopyFromDevice(st, b, blk.mem, int64(sp.Lo*es))
		}); err != nil {
			return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
		}
		buffers.Transcode(s.opts.DType, b, dtype, dst[at:at+n*ds])
		at += n * ds
	}
	return nil
}

// ReadBlocks reads name's partition in blocks of block elements, in order,
// encoded in dtype into dst (block x dtype's size bytes), and calls fn
// with each block's first element and length (the last may be shorter;
// it is at dst's start) — for a caller that computes with a block while
// the next is read: a streamed partition's next piece is read while fn
// runs, when the pool has a second buffer free. fn must not keep dst; an
// error from fn stops the reading and is returned. Residency rules are
// ReadFloat32's.
func (s *Swapper) ReadBlocks(ctx context.Context, name string, block int, dtype swapper.DType, dst []byte, fn func(lo, n int) error) error {
	if !dtype.Valid() {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("unknown dtype %d", dtype)}
	}
	t, ctx, done, err := s.begin(ctx, "read", name)
	if err != nil {
		return err
	}
	defer s.wg.Done()
	defer done()
	ds, es := dtype.Size(), s.elem
	if block <= 0 || len(dst) < block*ds {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("blocks of %d elements in a destination of %d bytes of %s", block, len(dst), dtype)}
	}
	if t.n == 0 {
		return nil
	}
	if t.streamed {
		lo, fill := 0, 0
		return s.readStreamed(ctx, t, []Span{{0, t.n}}, func(out int, src []byte) error {
			for len(src) > 0 {
				k := min(len(src)/es, block-fill)
				buffers.Transcode(s.opts.DType, src[:k*es], dtype, dst[fill*ds:(fill+k)*ds])
				fill += k
				src = src[k*es:]
				if fill == block || lo+fill == t.n {
					if err := fn(lo, fill); err != nil {
						return err
					}
					lo, fill = lo+fill, 0
				}
			}
			return nil
		})
	}
	for lo := 0; lo < t.n; lo += block {
		n := min(block, t.n-lo)
		if err := s.readSpansInto(ctx, t, []Span{{lo, lo + n}}, dtype, dst[:n*ds]); err != nil {
			return err
		}
		if err := fn(lo, n); err != nil {
			return err
		}
	}
	return nil
}
