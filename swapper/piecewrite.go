package swapper

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/base/crc32c"
)

// PieceWriter writes a new version of a tensor piece by piece, in order,
// so that a writer never holds the whole tensor in one buffer: each piece
// is an asynchronous write of its own (WriteAsync), and the version becomes
// the tensor's current one only at Commit, once every byte is written and
// every piece waited for — copy-on-write as WriteAsync is: until then the
// previous version stays, and Abort frees the new one.
type PieceWriter struct {
	s      *Store
	name   string
	v      *version
	mu     sync.Mutex
	off    int64 // bytes handed to WriteAsync so far
	ok     int64 // bytes whose write succeeded
	flying int   // pieces not yet waited for
	err    error // the first failed piece
	ended  bool  // committed or aborted
}

// PieceUnit is the granule pieces are cut in: every piece but the last is
// a multiple of it (the stripe: a checksum covers one stripe chunk, and
// paths take whole chunks).
func (s *Store) PieceUnit() int64 { return s.stripe }

// NewPieceWriter starts a new version of name of length bytes (> 0); its
// extents are allocated now.
func (s *Store) NewPieceWriter(name string, length int64) (*PieceWriter, error) {
	if length <= 0 {
		return nil, &TensorError{Op: "swap-out", Tensor: name, Err: errors.New("empty tensor")}
	}
	padded := s.PaddedLen(length)
	v := &version{length: length, padded: padded}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &TensorError{Op: "swap-out", Tensor: name, Err: ErrClosed}
	}
	sizes := s.extentSizes(padded)
	v.ext = make([]extent, len(sizes))
	for i, sz := range sizes {
		if sz > 0 {
			v.ext[i] = extent{off: s.allocs[i].alloc(sz), len: sz}
		}
	}
	if s.opts.Checksums {
		v.sums = make([]uint32, (padded+s.unit-1)/s.unit)
	}
	return &PieceWriter{s: s, name: name, v: v}, nil
}

// WriteAsync starts writing b as the next piece: bytes [off, off+len(b))
// of the version, where off is what earlier pieces covered. len(b) is a
// multiple of PieceUnit unless the piece ends the tensor; b's capacity
// must cover its padding to the alignment and its start be aligned (a
// pool buffer), and b must not change until the Pending's Wait returns.
// The Pending must be waited for before Commit.
func (w *PieceWriter) WriteAsync(b []byte) (*Pending, error) {
	s, v := w.s, w.v
	n := int64(len(b))
	w.mu.Lock()
	lo := w.off
	switch {
	case w.ended:
		w.mu.Unlock()
		return nil, &TensorError{Op: "swap-out", Tensor: w.name, Err: errors.New("piece writer already committed or aborted")}
	case n == 0 || lo+n > v.length:
		w.mu.Unlock()
		return nil, &TensorError{Op: "swap-out", Tensor: w.name, Err: fmt.Errorf("piece of %d bytes at %d: the tensor has %d", n, lo, v.length)}
	case lo+n < v.length && n%s.stripe != 0:
		w.mu.Unlock()
		return nil, &TensorError{Op: "swap-out", Tensor: w.name, Err: fmt.Errorf("piece of %d bytes at %d is not a multiple of the piece unit %d", n, lo, s.stripe)}
	}
	hi := min(lo+s.PaddedLen(n), v.padded)
	if int64(cap(b)) < hi-lo {
		w.mu.Unlock()
		return nil, &TensorError{Op: "swap-out", Tensor: w.name, Err: fmt.Errorf("buffer capacity %d is below the padded piece %d: use a pool buffer", cap(b), hi-lo)}
	}
	w.off += n
	w.flying++
	w.mu.Unlock()
	full := b[:hi-lo]
	clear(full[n:])
	p := &Pending{s: s, op: "swap-out", name: w.name, v: v, buf: full, ranged: true, from: lo, to: hi, lo: lo, hi: lo + n, start: time.Now(), piece: w}
	if len(s.files) == 1 {
		p.single(aio.OpWrite, s.files[0], v.ext[0].off+lo, full)
	} else {
		s.chunks(v, func(c chunk) {
			a, z := max(c.lo, lo), min(c.hi, hi)
			if a < z {
				p.reqs = append(p.reqs, aio.Request{Op: aio.OpWrite, File: s.files[c.p], Offset: c.off + (a - c.lo), Buf: full[a-lo : z-lo]})
			}
		})
	}
	for i := range p.reqs {
		if err := s.opts.Engine.Submit(&p.reqs[i]); err != nil {
			for j := 0; j < i; j++ {
				p.reqs[j].Wait()
			}
			p.recycle()
			err = &TensorError{Op: "swap-out", Tensor: w.name, Err: err}
			w.finished(p, err)
			s.mu.Lock()
			s.stats.WriteErrors++
			s.mu.Unlock()
			return nil, err
		}
	}
	p.started()
	return p, nil
}

// finished records a piece's outcome.
func (w *PieceWriter) finished(p *Pending, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flying--
	if err != nil {
		if w.err == nil {
			w.err = err
		}
		return
	}
	w.ok += p.hi - p.lo
}

// pieceChecksums computes the checksums of the units a piece wrote.
func (p *Pending) pieceChecksums() {
	p.s.sumUnits(p.v, func(i int, lo, hi int64) {
		if lo >= p.from && lo < p.to {
			p.v.sums[i] = crc32c.Checksum(p.buf[lo-p.from : hi-p.from])
		}
	})
}

// finishPiece accounts a piece's write once it is waited for.
func (s *Store) finishPiece(p *Pending, end time.Time) {
	s.mu.Lock()
	if p.err != nil {
		s.stats.WriteErrors++
	} else {
		s.stats.WriteLatency.observe(end.Sub(p.start))
		s.countPathsLocked(p, true)
		s.stats.Writes++
		s.stats.BytesWritten += p.hi - p.lo
	}
	s.mu.Unlock()
	p.piece.finished(p, p.err)
}

// Commit makes the written version name's current one (replacing any
// other), once every byte was written and every piece waited for without
// error; otherwise it changes nothing and returns why (call Abort).
func (w *PieceWriter) Commit() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.ended:
		return &TensorError{Op: "swap-out", Tensor: w.name, Err: errors.New("piece writer already committed or aborted")}
	case w.err != nil:
		return w.err
	case w.flying > 0:
		return &TensorError{Op: "swap-out", Tensor: w.name, Err: fmt.Errorf("%d pieces not waited for", w.flying)}
	case w.ok != w.v.length:
		return &TensorError{Op: "swap-out", Tensor: w.name, Err: fmt.Errorf("%d of %d bytes written", w.ok, w.v.length)}
	}
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &TensorError{Op: "swap-out", Tensor: w.name, Err: ErrClosed}
	}
	w.ended = true
	if old, ok := s.tensors[w.name]; ok {
		s.stats.LiveBytes -= old.padded
		old.retired = true
		if old.refs == 0 {
			s.freeLocked(old)
		}
	}
	s.tensors[w.name] = w.v
	s.stats.LiveBytes += w.v.padded
	return nil
}

// Abort drops the version being written; the previous one stays. Pieces
// still in flight must be waited for first (their buffers are theirs
// until then). It is idempotent, and a no-op after Commit.
func (w *PieceWriter) Abort() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	w.ended = true
	s := w.s
	s.mu.Lock()
	if !s.closed {
		s.freeLocked(w.v)
	}
	s.mu.Unlock()
}
