package checkpoint

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/crc32c"
	"github.com/zinfio/zinf/swapper"
)

// filler produces a planned file's bytes in order (header, then each
// tensor's data), chunk by chunk, into whatever memory the caller stages
// them in, computing each tensor's CRC-32C over exactly the bytes staged.
// One filler is used by one goroutine.
type filler struct {
	f   *plannedFile
	pos int64 // next file byte to produce
	ti  int   // current tensor
	crc uint32

	bounce *buffers.Pool   // pinned memory for FromStore tensors
	cur    *buffers.Buffer // a store tensor's bytes, when one is loaded
	curSrc *swapper.Store  // ... from this store
	curKey string          // ... under this name

	// noCRC leaves the checksums to a crcTracker (SaveAsync computes them
	// from its snapshot while it drains, so the copy that holds the caller
	// is a plain copy).
	noCRC bool
	// SaveAsync fills a file in two passes: while it holds the caller,
	// everything but the FromStore and FromPinned tensors (skipStore),
	// which it pins instead; while it drains, only those (storeOnly), read
	// from the pinned store versions (pins) and pinned bytes (pinned). Both
	// leave the other bytes as they are.
	skipStore, storeOnly bool
	pins                 map[*swapper.Store]*swapper.Pinned
	pinned               map[*Tensor][][]byte

	// Save's FromPinned tensor being read: pinned when its first byte is
	// needed, released after its last (or by close).
	pinT    *Tensor
	pinSegs [][]byte
	pinRel  func()
}

func newFiller(f *plannedFile, bounce *buffers.Pool) *filler {
	return &filler{f: f, bounce: bounce}
}

// fill writes the next len(dst) bytes of the file into dst. The caller
// never asks past the file's end.
func (fl *filler) fill(ctx context.Context, dst []byte) error {
	f := fl.f
	for len(dst) > 0 {
		if h := int64(len(f.header)); fl.pos < h {
			n := min(int64(len(dst)), h-fl.pos)
			if !fl.storeOnly {
				copy(dst, f.header[fl.pos:])
			}
			fl.pos += n
			dst = dst[n:]
			continue
		}
		// Skip finished (and empty) tensors: an empty tensor's CRC is 0,
		// the CRC of nothing.
		for fl.ti < len(f.tensors) && fl.pos >= f.tensors[fl.ti].offset+f.tensors[fl.ti].t.Bytes {
			fl.ti++
		}
		if fl.ti >= len(f.tensors) {
			return fmt.Errorf("checkpoint: internal error: %s filled past its end (%d of %d bytes)", f.relPath, fl.pos, f.length)
		}
		pt := f.tensors[fl.ti]
		t := pt.t
		off := fl.pos - pt.offset
		n := min(int64(len(dst)), t.Bytes-off)
		part := dst[:n]
		if deferred := t.deferred(); deferred && fl.skipStore || !deferred && fl.storeOnly {
			fl.pos += n
			dst = dst[n:]
			if off+n == t.Bytes {
				fl.ti++
			}
			continue
		}
		if err := fl.read(ctx, t, part, off); err != nil {
			return &Error{Op: "save", Path: f.relPath, Tensor: t.Name, Err: fmt.Errorf("reading bytes %d..%d of the source: %w", off, off+n, err)}
		}
		if !fl.noCRC {
			fl.crc = crc32c.Update(fl.crc, part)
		}
		fl.pos += n
		dst = dst[n:]
		if off+n == t.Bytes {
			if !fl.noCRC {
				pt.crc = fl.crc
			}
			fl.crc = 0
			fl.ti++
			if fl.pinT == t {
				fl.releasePin() // written out: the source may change again
			}
			// A loaded store tensor is kept: the next tensor may be
			// another range of it (an optimizer record's next state).
		}
	}
	return nil
}

// read copies bytes [off, off+len(dst)) of t into dst.
func (fl *filler) read(ctx context.Context, t *Tensor, dst []byte, off int64) error {
	if t.pin != nil {
		return fl.readPinned(ctx, t, dst, off)
	}
	if t.store == nil {
		return t.Read(ctx, dst, off)
	}
	for len(dst) > 0 {
		k, in := t.rangeAt(off)
		if k == len(t.ranges) {
			return fmt.Errorf("checkpoint: internal error: read at %d past the tensor's %d bytes", off, t.Bytes)
		}
		r := t.ranges[k]
		if fl.cur == nil || fl.curSrc != t.store || fl.curKey != r.Name {
			// The store reads whole tensors: load it once into pinned
			// memory.
			fl.releaseCur()
			n := t.storeLens[k]
			b, err := fl.bounce.Acquire(ctx, int(t.store.PaddedLen(n)), buffers.PurposeCheckpoint)
			if err != nil {
				return err
			}
			read := t.store.Read
			if pin := fl.pins[t.store]; pin != nil {
				read = pin.Read // the version pinned by SaveAsync
			}
			if err := read(ctx, r.Name, b.Bytes()[:n]); err != nil {
				b.Release()
				return err
			}
			fl.cur, fl.curSrc, fl.curKey = b, t.store, r.Name
		}
		c := copy(dst, fl.cur.Bytes()[r.Off+in:r.Off+r.Len])
		dst, off = dst[c:], off+int64(c)
	}
	return nil
}

func (fl *filler) releaseCur() {
	if fl.cur != nil {
		fl.cur.Release()
		fl.cur, fl.curSrc, fl.curKey = nil, nil, ""
	}
}

// readPinned copies bytes [off, off+len(dst)) of a FromPinned tensor:
// from the bytes SaveAsync pinned, or (Save) from the tensor's source,
// pinned now if it is not yet.
func (fl *filler) readPinned(ctx context.Context, t *Tensor, dst []byte, off int64) error {
	segs, ok := fl.pinned[t]
	if !ok {
		if fl.pinT != t {
			fl.releasePin()
			s, release, err := t.pinSegs(ctx)
			if err != nil {
				return err
			}
			fl.pinT, fl.pinSegs, fl.pinRel = t, s, release
		}
		segs = fl.pinSegs
	}
	copySegs(dst, segs, off)
	return nil
}

func (fl *filler) releasePin() {
	if fl.pinRel != nil {
		fl.pinRel()
	}
	fl.pinT, fl.pinSegs, fl.pinRel = nil, nil, nil
}

// close releases what an interrupted fill still holds.
func (fl *filler) close() {
	fl.releaseCur()
	fl.releasePin()
}

// crcTracker computes a planned file's tensor checksums from its bytes,
// fed in order (SaveAsync's drain, from the snapshot).
type crcTracker struct {
	f   *plannedFile
	ti  int
	crc uint32
}

// feed takes file bytes [pos, pos+len(p)); consecutive calls continue
// where the previous one stopped. Bytes past the file's end (alignment
// padding) are ignored.
func (c *crcTracker) feed(p []byte, pos int64) {
	f := c.f
	for len(p) > 0 && c.ti < len(f.tensors) {
		pt := f.tensors[c.ti]
		end := pt.offset + pt.t.Bytes
		if pos >= end { // finished, or empty: the CRC of nothing is 0
			pt.crc = c.crc
			c.crc = 0
			c.ti++
			continue
		}
		if pos < pt.offset { // header, or the gap before the tensor
			skip := min(int64(len(p)), pt.offset-pos)
			p, pos = p[skip:], pos+skip
			continue
		}
		n := min(int64(len(p)), end-pos)
		c.crc = crc32c.Update(c.crc, p[:n])
		p, pos = p[n:], pos+n
		if pos == end {
			pt.crc = c.crc
			c.crc = 0
			c.ti++
		}
	}
}

// finish closes the trailing empty tensors.
func (c *crcTracker) finish() {
	for ; c.ti < len(c.f.tensors); c.ti++ {
		c.f.tensors[c.ti].crc = c.crc
		c.crc = 0
	}
}

// pinStores pins the current version of every FromStore tensor of the
// plan, one Pin per store, checking each still has the length FromStore
// saw. On error nothing stays pinned.
func pinStores(p *plan) (map[*swapper.Store]*swapper.Pinned, error) {
	names := map[*swapper.Store][]string{}
	var order []*swapper.Store
	for _, pf := range p.files {
		for _, pt := range pf.tensors {
			if st := pt.t.store; st != nil {
				if _, ok := names[st]; !ok {
					order = append(order, st)
				}
				for _, r := range pt.t.ranges {
					names[st] = append(names[st], r.Name)
				}
			}
		}
	}
	pins := make(map[*swapper.Store]*swapper.Pinned, len(order))
	fail := func(err error) (map[*swapper.Store]*swapper.Pinned, error) {
		unpin(pins)
		return nil, err
	}
	for _, st := range order {
		pin, err := st.Pin(names[st]...)
		if err != nil {
			return fail(err)
		}
		pins[st] = pin
	}
	for _, pf := range p.files {
		for _, pt := range pf.tensors {
			if st := pt.t.store; st != nil {
				for k, r := range pt.t.ranges {
					if n, _ := pins[st].Len(r.Name); n != pt.t.storeLens[k] {
						return fail(&Error{Op: "save", Path: pf.relPath, Tensor: pt.t.Name, Err: fmt.Errorf("store tensor %q is now %d bytes, %d when the Tensor was made", r.Name, n, pt.t.storeLens[k])})
					}
				}
			}
		}
	}
	return pins, nil
}

func unpin(pins map[*swapper.Store]*swapper.Pinned) {
	for _, p := range pins {
		p.Release()
	}
}

// pinTensors pins every non-empty FromPinned tensor of the plan (SaveAsync,
// while it holds the caller) and returns their bytes and a function that
// releases them all. On error nothing stays pinned.
func pinTensors(ctx context.Context, p *plan) (map[*Tensor][][]byte, func(), error) {
	out := map[*Tensor][][]byte{}
	var rels []func()
	releaseAll := func() {
		for _, r := range rels {
			r()
		}
	}
	for _, pf := range p.files {
		for _, pt := range pf.tensors {
			t := pt.t
			if t.pin == nil || t.Bytes == 0 {
				continue
			}
			segs, release, err := t.pinSegs(ctx)
			if err != nil {
				releaseAll()
				return nil, nil, &Error{Op: "save", Path: pf.relPath, Tensor: t.Name, Err: fmt.Errorf("pinning the source: %w", err)}
			}
			out[t] = segs
			rels = append(rels, release)
		}
	}
	return out, releaseAll, nil
}

// deferred reports whether SaveAsync pins the tensor instead of copying
// it while it holds the caller (FromStore, FromStoreRanges, FromPinned).
func (t *Tensor) deferred() bool { return t.store != nil || t.pin != nil }

// hasDeferred reports whether the file has a non-empty tensor that
// SaveAsync pins (see deferred).
func (f *plannedFile) hasDeferred() bool {
	for _, pt := range f.tensors {
		if pt.t.deferred() && pt.t.Bytes > 0 {
			return true
		}
	}
	return false
}
