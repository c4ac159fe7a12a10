package gds

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
)

// Bounce moves bytes between files and device memory through pinned host
// staging buffers: NVMe -> host buffer (aio) -> device (an async copy), and
// back. It is what zinf uses when GPUDirect Storage is unavailable, and the
// only path to a simulated device. It implements DeviceIO and is safe for
// concurrent use.
//
// It holds Parallelism slots, each two staging buffers of BlockSizeBytes
// from the pool and one device stream, for its whole life: a request's
// pieces are spread over the free slots, and in each slot one buffer fills
// from the file while the other copies to the device (or, writing, one
// copies from the device while the other drains to the file). Concurrent
// requests share the slots and wait for one when all are busy.
//
// Files opened with O_DIRECT need no alignment from the caller: a piece
// whose ends are not aligned is widened to the alignment in its staging
// buffer. Reads simply read the wider range; writes first read the partial
// alignment blocks at the ends (read-modify-write), so the bytes around the
// range are preserved, and a write that ends past the end of the file
// extends the file to the next alignment boundary (with zeros). Writes
// from concurrent requests that share an alignment block must be ordered
// by the caller.
type Bounce struct {
	dev  accel.Device
	eng  aio.Engine
	opts BounceOptions

	slots chan *slot
	all   []*slot

	lifecycle // mu also guards files
	counters
	files map[*File]struct{}
}

var _ DeviceIO = (*Bounce)(nil)

// slot is one piece's worth of staging: two buffers and a stream.
type slot struct {
	bufs       [2]*buffers.Buffer
	registered [2]bool
	stream     accel.Stream
}

// NewBounce builds the bounce path over dev, the aio engine eng and
// staging buffers from pool, all owned by the caller (Close does not close
// them). It takes 2*Parallelism buffers of BlockSizeBytes from pool now,
// without waiting (an error says how much it needed), and registers them
// with the device for DMA; a device that refuses registration (the memory
// may already be registered as part of the pool's arena) only costs
// speed, and is logged once.
func NewBounce(dev accel.Device, eng aio.Engine, pool *buffers.Pool, opts BounceOptions) (*Bounce, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if dev == nil || eng == nil || pool == nil {
		return nil, fmt.Errorf("gds bounce: a device, an aio engine and a buffers pool are required: %w", accel.ErrInvalid)
	}
	if maxBuf := int64(pool.MaxBufferBytesFor(buffers.PurposeStaging)); opts.BlockSizeBytes > maxBuf {
		return nil, fmt.Errorf("gds bounce: block size %d exceeds the largest staging buffer the pool can give (%d bytes)", opts.BlockSizeBytes, maxBuf)
	}
	b := &Bounce{
		dev:   dev,
		eng:   eng,
		opts:  opts,
		slots: make(chan *slot, opts.Parallelism),
		files: make(map[*File]struct{}),
	}
	var regErr error
	for range opts.Parallelism {
		s := &slot{}
		b.all = append(b.all, s)
		for i := range s.bufs {
			buf, ok := pool.TryAcquire(int(opts.BlockSizeBytes), buffers.PurposeStaging)
			if !ok {
				b.releaseSlots()
				return nil, fmt.Errorf("gds bounce: the buffers pool cannot supply %d staging buffers of %d bytes now (%d bytes free of %d); raise its capacity or lower parallelism or block size",
					2*opts.Parallelism, opts.BlockSizeBytes, pool.Stats().FreeBytes, pool.CapacityBytes())
			}
			s.bufs[i] = buf
			if err := dev.RegisterHost(buf.Bytes()); err != nil {
				regErr = err
			} else {
				s.registered[i] = true
			}
		}
		st, err := dev.NewStream()
		if err != nil {
			b.releaseSlots()
			return nil, fmt.Errorf("gds bounce: creating a device stream: %w", err)
		}
		s.stream = st
		b.slots <- s
	}
	if regErr != nil {
		opts.Logger.Info("gds bounce: staging buffers are not registered with the device; copies are staged by the driver", "device", dev.Name(), "reason", regErr.Error())
	}
	return b, nil
}

// releaseSlots gives back every slot's stream, registrations and buffers.
// A device closed first has dropped its streams and registrations already;
// that is not an error here.
func (b *Bounce) releaseSlots() error {
	var errs []error
	keep := func(err error) {
		if err != nil && !errors.Is(err, accel.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, s := range b.all {
		if s.stream != nil {
			keep(s.stream.Close())
		}
		for i, buf := range s.bufs {
			if buf == nil {
				continue
			}
			if s.registered[i] {
				keep(b.dev.UnregisterHost(buf.Bytes()))
			}
			buf.Release()
		}
	}
	b.all = nil
	return errors.Join(errs...)
}

// Mode returns "bounce".
func (b *Bounce) Mode() string { return NameBounce }

// OpenFile opens path through the aio engine (with its O_DIRECT policy).
func (b *Bounce) OpenFile(path string, flag int, perm os.FileMode) (*File, error) {
	if err := b.enter(); err != nil {
		return nil, &os.PathError{Op: "gds bounce open", Path: path, Err: err}
	}
	defer b.exit()
	af, err := b.eng.Open(path, flag, perm)
	if err != nil {
		return nil, err
	}
	f := &File{af: af, owner: b}
	f.finish = func() {
		b.mu.Lock()
		delete(b.files, f)
		b.mu.Unlock()
	}
	b.mu.Lock()
	b.files[f] = struct{}{}
	b.mu.Unlock()
	return f, nil
}

// ReadToDevice reads n bytes of f at fileOff into dst at dstOff through the
// staging buffers. It returns the bytes that reached the device and, on
// failure, an *aio.OpError (Backend "bounce") whose *PieceError says which
// piece failed; a read past the end of the file fails with
// aio.ErrShortTransfer.
func (b *Bounce) ReadToDevice(ctx context.Context, f *File, dst accel.Mem, dstOff, fileOff, n int64) (int64, error) {
	return b.transfer(ctx, aio.OpRead, f, dst, dstOff, fileOff, n)
}

// WriteFromDevice writes n bytes of src at srcOff to f at fileOff through
// the staging buffers, as ReadToDevice does.
func (b *Bounce) WriteFromDevice(ctx context.Context, f *File, src accel.Mem, srcOff, fileOff, n int64) (int64, error) {
	return b.transfer(ctx, aio.OpWrite, f, src, srcOff, fileOff, n)
}

// bounceReq is one request's shared state.
type bounceReq struct {
	ctx     context.Context
	f       *File
	m       accel.Mem
	memOff  int64
	fileOff int64
	align   int64
	s       *split
}

// staged is a piece placed in a staging buffer: the file range
// [at, at+len(span)) is read or written; the piece's bytes are
// span[head:head+p.len].
type staged struct {
	p    piece
	at   int64
	span []byte
	head int64
}

func (r *bounceReq) stage(p piece, buf *buffers.Buffer) staged {
	at := p.start / r.align * r.align
	end := (p.start + p.len + r.align - 1) / r.align * r.align
	return staged{p: p, at: at, span: buf.Full()[:end-at], head: p.start - at}
}

func (r *bounceReq) memAt(p piece) int64 { return r.memOff + (p.start - r.fileOff) }

func (r *bounceReq) fail(p piece, err error) {
	r.s.fail(&PieceError{FileOffset: p.start, DeviceOffset: r.memAt(p), Len: p.len, Err: err})
}

func (b *Bounce) transfer(ctx context.Context, op aio.Op, f *File, m accel.Mem, memOff, fileOff, n int64) (int64, error) {
	if err := b.enter(); err != nil {
		return 0, opError(NameBounce, op.String(), f, fileOff, n, 0, err)
	}
	defer b.exit()
	if err := checkRequest(m, memOff, fileOff, n); err != nil {
		return 0, opError(NameBounce, op.String(), f, fileOff, n, 0, err)
	}
	if err := f.acquire(b); err != nil {
		return 0, opError(NameBounce, op.String(), f, fileOff, n, 0, err)
	}
	defer f.release()
	align := int64(f.Alignment())
	if b.opts.BlockSizeBytes%align != 0 {
		return 0, opError(NameBounce, op.String(), f, fileOff, n, 0,
			fmt.Errorf("%w: block size %d is not a multiple of the file's O_DIRECT alignment %d", aio.ErrAlignment, b.opts.BlockSizeBytes, align))
	}
	r := &bounceReq{ctx: ctx, f: f, m: m, memOff: memOff, fileOff: fileOff, align: align,
		s: newSplit(ctx, fileOff, n, b.opts.BlockSizeBytes)}
	r.s.run(b.opts.Parallelism, func() {
		var sl *slot
		select {
		case sl = <-b.slots:
		case <-ctx.Done():
			r.s.fail(ctx.Err())
			return
		}
		defer func() { b.slots <- sl }()
		if op == aio.OpRead {
			b.readWorker(r, sl)
		} else {
			b.writeWorker(r, sl)
		}
	})
	done, err := r.s.result()
	if err != nil {
		b.errs.Add(1)
		return done, opError(NameBounce, op.String(), f, fileOff, n, done, err)
	}
	if op == aio.OpRead {
		b.readOps.Add(1)
		b.readBytes.Add(n)
	} else {
		b.writeOps.Add(1)
		b.writeBytes.Add(n)
	}
	return n, nil
}

// readWorker reads pieces into alternating staging buffers, copying each to
// the device while the next is read from the file.
func (b *Bounce) readWorker(r *bounceReq, sl *slot) {
	var inflight piece // copied to the device, not yet synchronized
	copying := false
	wait := func() bool {
		if !copying {
			return true
		}
		copying = false
		err := sl.stream.Synchronize()
		p := inflight
		if err != nil {
			r.fail(p, err)
			return false
		}
		r.s.done.Add(p.len)
		return true
	}
	defer wait()
	for cur := 0; ; cur ^= 1 {
		p, ok := r.s.claim()
		if !ok {
			return
		}
		b.pieces.Add(1)
		st := r.stage(p, sl.bufs[cur])
		if err := b.readSpan(r, st, st.head+p.len); err != nil {
			r.fail(p, err)
			return
		}
		// The previous piece's copy ran while this one was read; the
		// buffer it used is the next one to fill.
		if !wait() {
			return
		}
		if err := b.dev.CopyToDevice(sl.stream, r.m, r.memAt(p), st.span[st.head:st.head+p.len]); err != nil {
			r.fail(p, err)
			return
		}
		inflight, copying = p, true
	}
}

// readSpan reads st's file range into its buffer; at least need bytes must
// arrive (the rest of the span may lie past the end of the file).
func (b *Bounce) readSpan(r *bounceReq, st staged, need int64) error {
	got, err := b.eng.ReadAt(r.ctx, r.f.af, st.span, st.at)
	if err != nil && !errors.Is(err, aio.ErrShortTransfer) {
		return err
	}
	if int64(got) < need {
		return fmt.Errorf("%w: end of file at %d, before %d", aio.ErrShortTransfer, st.at+int64(got), st.at+need)
	}
	return nil
}

// readBlock fills buf with the alignment block of the file at off,
// zero-filling what lies past the end of the file.
func (b *Bounce) readBlock(r *bounceReq, buf []byte, off int64) error {
	got, err := b.eng.ReadAt(r.ctx, r.f.af, buf, off)
	if err != nil && !errors.Is(err, aio.ErrShortTransfer) {
		return err
	}
	clear(buf[max(got, 0):])
	return nil
}

// prepareWrite stages p in buf: it reads the partial alignment blocks at
// the span's ends (so the write preserves their other bytes) and queues
// the copy of the piece from the device into the buffer.
func (b *Bounce) prepareWrite(r *bounceReq, sl *slot, buf *buffers.Buffer, p piece) (staged, error) {
	st := r.stage(p, buf)
	a := r.align
	if a > 1 {
		tail := st.head + p.len // where the piece ends in the span
		if st.head > 0 {
			if err := b.readBlock(r, st.span[:a], st.at); err != nil {
				return st, err
			}
		}
		if tail%a != 0 && (st.head == 0 || tail > a) {
			last := tail / a * a
			if err := b.readBlock(r, st.span[last:last+a], st.at+last); err != nil {
				return st, err
			}
		}
	}
	return st, b.dev.CopyFromDevice(sl.stream, st.span[st.head:st.head+p.len], r.m, r.memAt(p))
}

// writeWorker copies pieces from the device into alternating staging
// buffers, writing each to the file while the next is copied.
func (b *Bounce) writeWorker(r *bounceReq, sl *slot) {
	p, ok := r.s.claim()
	if !ok {
		return
	}
	b.pieces.Add(1)
	cur := 0
	st, err := b.prepareWrite(r, sl, sl.bufs[cur], p)
	if err != nil {
		r.fail(p, err)
		sl.stream.Synchronize()
		return
	}
	for {
		if err := sl.stream.Synchronize(); err != nil {
			r.fail(st.p, err)
			return
		}
		// Start the next piece's copy from the device, then write this one.
		var next staged
		nextOK := false
		if np, ok := r.s.claim(); ok {
			b.pieces.Add(1)
			var err error
			if next, err = b.prepareWrite(r, sl, sl.bufs[cur^1], np); err != nil {
				r.fail(np, err)
			} else {
				nextOK = true
			}
		}
		if _, err := b.eng.WriteAt(r.ctx, r.f.af, st.span, st.at); err != nil {
			r.fail(st.p, err)
			sl.stream.Synchronize() // the next copy must finish before the slot is reused
			return
		}
		r.s.done.Add(st.p.len)
		if !nextOK {
			sl.stream.Synchronize()
			return
		}
		st, cur = next, cur^1
	}
}

// Close waits for requests in flight, closes every file still open, and
// releases the staging buffers, their registrations and the streams. It
// does not close the device, the aio engine or the pool. It is idempotent.
func (b *Bounce) Close() error {
	b.life.Lock()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.life.Unlock()
		return nil
	}
	b.closed = true
	files := make([]*File, 0, len(b.files))
	for f := range b.files {
		files = append(files, f)
	}
	b.mu.Unlock()
	b.life.Unlock()

	var errs []error
	for _, f := range files {
		errs = append(errs, f.Close())
	}
	errs = append(errs, b.releaseSlots())
	return errors.Join(errs...)
}
