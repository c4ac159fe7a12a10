package param

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// Streamed reports whether name's partition moves in pieces (see
// Options.PieceBytes): it is never resident, and its reads go to the store.
func (s *Swapper) Streamed(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tensors[name]
	return ok && t.streamed
}

// streams reports whether a partition of bytes on tier moves in pieces.
func (s *Swapper) streams(tier swapper.Tier, bytes int) bool {
	return tier == swapper.TierNVMe && s.opts.PieceBytes > 0 && s.opts.DeviceIO == nil && int64(bytes) > s.opts.PieceBytes
}

// readStreamed reads the spans of streamed partition t from the store,
// in windows of at most PieceBytes through one pool buffer, and hands
// each part to fn with the index, in the spans' concatenation, of its
// first element and its bytes in the parameter dtype (an error from fn
// stops the reading). Spans may come in any order and overlap; parts
// close together share a window. The next window is read while fn works
// on this one, when the pool has a second buffer free.
func (s *Swapper) readStreamed(ctx context.Context, t *tensor, spans []Span, fn func(out int, src []byte) error) error {
	type part struct{ lo, hi, out int } // bytes of the partition; element index of the output
	es := s.elem
	parts := make([]part, 0, len(spans))
	out := 0
	for _, sp := range spans {
		if sp.Hi > sp.Lo {
			parts = append(parts, part{sp.Lo * es, sp.Hi * es, out})
		}
		out += sp.Hi - sp.Lo
	}
	if len(parts) == 0 {
		return nil
	}
	slices.SortStableFunc(parts, func(a, b part) int { return a.lo - b.lo })
	piece := s.opts.PieceBytes
	u := s.store.RangeUnit()
	// Windows of reads: a window's reads are packed into one buffer of at
	// most piece bytes, each read one stretch of the partition (parts
	// less than readGap apart share a read, since reading through a
	// small gap is cheaper than another request; farther ones get their
	// own, so a few rows cost a few units, not the span between them).
	type seg struct{ lo, end, out, r int } // part bytes [lo, end), output element, read
	type rd struct{ lo, hi, at int }       // partition bytes [lo, hi) read at buffer offset at
	type window struct {
		rds  []rd
		segs []seg
	}
	rangeLen := func(lo, hi int) int { return int(s.store.RangeLen(int64(lo), int64(hi))) }
	var windows []window
	var w window
	used := 0 // buffer bytes the window's reads take
	for i := 0; i < len(parts); {
		p := parts[i]
		if n := len(w.rds); n > 0 {
			last := &w.rds[n-1]
			if p.lo <= last.hi+readGap {
				if grown := last.at + rangeLen(last.lo, max(last.hi, p.hi)); grown <= int(piece) {
					last.hi = max(last.hi, p.hi)
					used = grown
					w.segs = append(w.segs, seg{p.lo, p.hi, p.out, n - 1})
					i++
					continue
				}
			}
			if used+rangeLen(p.lo, p.hi) > int(piece) {
				windows = append(windows, w)
				w, used = window{}, 0
				continue
			}
		}
		end := p.hi
		if used+rangeLen(p.lo, p.hi) > int(piece) {
			// Alone in the window and larger than it: the part's first
			// piece now, the rest next.
			end = int(int64(p.lo)/u*u + piece)
			parts[i] = part{end, p.hi, p.out + (end-p.lo)/es}
		} else {
			i++
		}
		w.rds = append(w.rds, rd{p.lo, end, used})
		w.segs = append(w.segs, seg{p.lo, end, p.out, len(w.rds) - 1})
		used += rangeLen(p.lo, end)
		if end < p.hi {
			windows = append(windows, w)
			w, used = window{}, 0
		}
	}
	if len(w.rds) > 0 {
		windows = append(windows, w)
	}
	size := 0
	for _, w := range windows {
		r := w.rds[len(w.rds)-1]
		size = max(size, r.at+rangeLen(r.lo, r.hi))
	}
	first, err := s.acquireBuffer(ctx, size, buffers.PurposeParams)
	if err != nil {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
	}
	bufs := []*buffers.Buffer{first}
	if len(windows) > 1 {
		// A second buffer, when the pool has one free at once, reads the
		// next window while this one is decoded; without it the windows
		// go one after the other (the minimum pool counts one).
		if b, ok := s.pool.TryAcquire(size, buffers.PurposeParams); ok {
			bufs = append(bufs, b)
		}
	}
	defer func() {
		for _, b := range bufs {
			b.Release()
		}
	}()
	type read struct {
		p    *swapper.Pending
		data []byte
	}
	var flying [][]read // per window issued, in order; waited for before the buffers go back
	defer func() {
		for _, rs := range flying {
			for _, r := range rs {
				_ = r.p.Wait()
			}
		}
	}()
	issue := func(i int) error {
		if err := ctx.Err(); err != nil {
			return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
		}
		buf := bufs[i%len(bufs)].Bytes()
		var rs []read
		for _, r := range windows[i].rds {
			p, data, err := s.store.ReadRangeAsync(t.key, int64(r.lo), int64(r.hi), buf[r.at:])
			if err != nil {
				flying = append(flying, rs)
				return err
			}
			rs = append(rs, read{p, data})
		}
		flying = append(flying, rs)
		return nil
	}
	for i := 0; i < len(bufs) && i < len(windows); i++ {
		if err := issue(i); err != nil {
			return err
		}
	}
	for i, w := range windows {
		rs := flying[0]
		flying = flying[1:]
		var errs []error
		for _, r := range rs {
			if err := r.p.Wait(); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		s.mu.Lock()
		for _, r := range w.rds {
			s.stats.SwapIns++
			s.stats.BytesRead += int64(r.hi - r.lo)
		}
		s.mu.Unlock()
		for _, g := range w.segs {
			r := w.rds[g.r]
			if err := fn(g.out, rs[g.r].data[g.lo-r.lo:g.end-r.lo]); err != nil {
				return err
			}
		}
		if next := i + len(bufs); next < len(windows) {
			if err := issue(next); err != nil {
				return err
			}
		}
	}
	return nil
}

// readGap is the distance below which two parts of a streamed read share
// one store read (see readStreamed).
const readGap = 64 << 10

// builder assembles a new version of a partition from values handed over
// in order (StageUpdate: all at once; StageRange: range by range),
// encoding them into pinned memory as they come: a streamed partition
// piece by piece, each piece written as soon as it is full; any other one
// in one buffer of its size (NVMe: written when complete; CPU: the new
// copy; GPU: copied to a new device allocation).
type builder struct {
	s   *Swapper
	t   *tensor
	key string
	w   *swapper.PieceWriter // streamed

	buf   *buffers.Buffer // the piece (streamed) or the partition being filled
	bufLo int             // element of the partition at buf's start
	pos   int             // elements received

	wg  sync.WaitGroup // piece writes in flight
	mu  sync.Mutex
	err error // the first failed piece write
}

func (s *Swapper) newBuilder(t *tensor, key string) (*builder, error) {
	b := &builder{s: s, t: t, key: key}
	if t.streamed {
		w, err := s.store.NewPieceWriter(key, int64(t.bytes))
		if err != nil {
			return nil, err
		}
		b.w = w
	}
	return b, nil
}

// pieceElems is the elements of a streamed partition's piece.
func (b *builder) pieceElems() int { return int(b.s.opts.PieceBytes) / b.s.elem }

// add encodes values, the partition's elements [pos, pos+len(values)).
func (b *builder) add(ctx context.Context, values []float32) error {
	s, t := b.s, b.t
	es := s.elem
	for len(values) > 0 {
		if b.buf == nil {
			size, purpose := t.bytes, buffers.PurposeParams
			switch {
			case t.streamed:
				b.bufLo = b.pos
				size = min(b.pieceElems(), t.n-b.pos) * es
				size = int(s.store.PaddedLen(int64(size)))
			case t.tier == swapper.TierNVMe:
				size = int(s.store.PaddedLen(int64(size)))
			case t.tier == swapper.TierGPU:
				purpose = buffers.PurposeStaging
			}
			buf, err := s.acquireBuffer(ctx, size, purpose)
			if err != nil {
				return &swapper.TensorError{Op: "stage", Tensor: t.name, Err: err}
			}
			b.buf = buf
		}
		end := t.n
		if t.streamed {
			end = min(b.bufLo+b.pieceElems(), t.n)
		}
		k := min(len(values), end-b.pos)
		at := (b.pos - b.bufLo) * es
		buffers.Encode(s.opts.DType, b.buf.Bytes()[at:at+k*es], values[:k])
		values = values[k:]
		b.pos += k
		if t.streamed && b.pos == end {
			if err := b.flushPiece(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flushPiece writes the full piece in buf behind; the buffer goes back to
// the pool when the write is done.
func (b *builder) flushPiece() error {
	s, t := b.s, b.t
	buf := b.buf
	b.buf = nil
	n := (b.pos - b.bufLo) * s.elem
	p, err := b.w.WriteAsync(buf.Bytes()[:n])
	if err != nil {
		buf.Release()
		return err
	}
	b.wg.Add(1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer b.wg.Done()
		err := p.Wait()
		buf.Release()
		b.mu.Lock()
		if err != nil && b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
		if err == nil {
			s.mu.Lock()
			s.stats.BytesWritten += int64(n)
			s.mu.Unlock()
		}
		_ = t
	}()
	return nil
}

// finish turns a complete builder (pos == n) into a staged version.
func (b *builder) finish(ctx context.Context) (*staged, error) {
	s, t := b.s, b.t
	st := &staged{t: t, done: make(chan struct{})}
	switch {
	case t.streamed:
		st.key = b.key
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			b.wg.Wait()
			b.mu.Lock()
			err := b.err
			b.mu.Unlock()
			if err == nil {
				err = b.w.Commit()
			}
			if err != nil {
				b.w.Abort()
			}
			st.err = err
			close(st.done)
		}()
		return st, nil
	case t.tier == swapper.TierNVMe:
		buf := b.buf
		b.buf = nil
		p, err := s.store.WriteAsync(b.key, buf.Bytes()[:t.bytes])
		if err != nil {
			buf.Release()
			return nil, err
		}
		st.key = b.key
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := p.Wait()
			buf.Release()
			if err == nil {
				s.mu.Lock()
				s.stats.BytesWritten += int64(t.bytes)
				s.mu.Unlock()
			}
			st.err = err
			close(st.done)
		}()
		return st, nil
	case t.tier == swapper.TierCPU:
		st.blk = hostBlock(b.buf)
		b.buf = nil
	default: // TierGPU
		stage := b.buf
		b.buf = nil
		defer stage.Release()
		mem, err := s.dev.Alloc(int64(t.bytes))
		if err != nil {
			return nil, &swapper.TensorError{Op: "stage", Tensor: t.name, Err: err}
		}
		blk := deviceBlock(s.dev, mem, s.log)
		if err := s.deviceCopy(func(str accel.Stream) error {
			return s.dev.CopyToDevice(str, mem, 0, stage.Bytes()[:t.bytes])
		}); err != nil {
			blk.release()
			return nil, &swapper.TensorError{Op: "stage", Tensor: t.name, Err: err}
		}
		st.blk = blk
	}
	close(st.done)
	return st, nil
}

// abort drops an incomplete builder: its piece writes are waited for and
// the version being written freed.
func (b *builder) abort() {
	if b.buf != nil {
		b.buf.Release()
		b.buf = nil
	}
	b.wg.Wait()
	if b.w != nil {
		b.w.Abort()
	}
}

// stageAll writes values (the whole partition) aside under key: prepare
// for a streamed partition.
func (s *Swapper) stageAll(ctx context.Context, t *tensor, values []float32, key string) (*staged, error) {
	b, err := s.newBuilder(t, key)
	if err != nil {
		return nil, err
	}
	if err := b.add(ctx, values); err != nil {
		b.abort()
		return nil, err
	}
	st, err := b.finish(ctx)
	if err != nil {
		b.abort()
		return nil, err
	}
	return st, nil
}

// StageRange is StageUpdate with the new partition handed over in pieces
// (optimizer.RangeSink): values are elements [lo, lo+len(values)) of the
// partition of n elements, ranges in ascending order, back to back, from
// lo = 0 to the one ending at n, after which the update is staged as
// StageUpdate stages it and its Waiter returned (earlier ranges return a
// Waiter that is already done: their values were copied). The values are
// encoded into pinned memory as they come — a streamed partition (see
// Options.PieceBytes) one piece at a time, each written as soon as it is
// full — so no copy of the partition is ever assembled on the Go heap. A
// range at lo = 0 starts the partition over; DiscardUpdates drops one
// not finished.
func (s *Swapper) StageRange(ctx context.Context, name string, lo, n int, values []float32) (Waiter, error) {
	t, ctx, done, err := s.begin(ctx, "stage", name)
	if err != nil {
		return nil, err
	}
	defer s.wg.Done()
	defer done()
	if n != t.n || lo < 0 || lo+len(values) > t.n {
		return nil, &swapper.TensorError{Op: "stage", Tensor: name, Err: fmt.Errorf("range [%d, %d) of a partition of %d elements (the partition has %d)", lo, lo+len(values), n, t.n)}
	}
	if t.n == 0 {
		return doneWaiter{}, nil
	}
	s.mu.Lock()
	b := t.building
	if lo == 0 {
		t.building = nil
	}
	s.mu.Unlock()
	if lo == 0 {
		if b != nil {
			b.abort()
		}
		s.mu.Lock()
		s.stageSeq++
		key := fmt.Sprintf("%s%s%d", t.key, stagingMark, s.stageSeq)
		s.mu.Unlock()
		if b, err = s.newBuilder(t, key); err != nil {
			return nil, err
		}
	} else if b == nil || b.pos != lo {
		at := -1
		if b != nil {
			at = b.pos
		}
		return nil, &swapper.TensorError{Op: "stage", Tensor: name, Err: fmt.Errorf("range at %d: the ranges so far end at %d (they come in order from 0)", lo, at)}
	}
	fail := func(err error) (Waiter, error) {
		s.mu.Lock()
		if t.building == b {
			t.building = nil
		}
		s.mu.Unlock()
		b.abort()
		return nil, err
	}
	if err := b.add(ctx, values); err != nil {
		return fail(err)
	}
	if b.pos < t.n {
		s.mu.Lock()
		closed := s.closed
		if !closed {
			t.building = b
		}
		s.mu.Unlock()
		if closed {
			return fail(&swapper.TensorError{Op: "stage", Tensor: name, Err: ErrClosed})
		}
		return doneWaiter{}, nil
	}
	st, err := b.finish(ctx)
	if err != nil {
		return fail(err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.dispose(st)
		return nil, &swapper.TensorError{Op: "stage", Tensor: name, Err: ErrClosed}
	}
	t.building = nil
	old := t.staged
	t.staged = st
	s.mu.Unlock()
	if old != nil {
		s.dispose(old)
	}
	return st, nil
}

// dropBuilds aborts every partition's unfinished StageRange.
func (s *Swapper) dropBuilds() {
	s.mu.Lock()
	var bs []*builder
	for _, t := range s.tensors {
		if t.building != nil {
			bs = append(bs, t.building)
			t.building = nil
		}
	}
	s.mu.Unlock()
	for _, b := range bs {
		b.abort()
	}
}
