package checkpoint

import (
	"context"
	"fmt"
	"hash/crc32"

	"github.com/zinfio/zinf/buffers"
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
	cur    *buffers.Buffer // the current store tensor's bytes, when one is loaded
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
			n := copy(dst, f.header[fl.pos:])
			fl.pos += int64(n)
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
		if err := fl.read(ctx, t, part, off); err != nil {
			return &Error{Op: "save", Path: f.relPath, Tensor: t.Name, Err: fmt.Errorf("reading bytes %d..%d of the source: %w", off, off+n, err)}
		}
		fl.crc = crc32.Update(fl.crc, castagnoli, part)
		fl.pos += n
		dst = dst[n:]
		if off+n == t.Bytes {
			pt.crc = fl.crc
			fl.crc = 0
			fl.ti++
			fl.releaseCur()
		}
	}
	return nil
}

// read copies bytes [off, off+len(dst)) of t into dst.
func (fl *filler) read(ctx context.Context, t *Tensor, dst []byte, off int64) error {
	if t.store == nil {
		return t.Read(ctx, dst, off)
	}
	if fl.cur == nil {
		// The store reads whole tensors: load it once into pinned memory.
		padded := t.store.PaddedLen(t.Bytes)
		b, err := fl.bounce.Acquire(ctx, int(padded), buffers.PurposeCheckpoint)
		if err != nil {
			return err
		}
		if err := t.store.Read(ctx, t.storeName, b.Bytes()[:t.Bytes]); err != nil {
			b.Release()
			return err
		}
		fl.cur = b
	}
	copy(dst, fl.cur.Bytes()[off:])
	return nil
}

func (fl *filler) releaseCur() {
	if fl.cur != nil {
		fl.cur.Release()
		fl.cur = nil
	}
}

// close releases what an interrupted fill still holds.
func (fl *filler) close() { fl.releaseCur() }
