package swapper

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf/aio"
)

// Pinned holds versions of tensors of a Store (Store.Pin): while it is
// held, each pinned version stays allocated and readable whatever later
// writes, renames and deletes do to its name, since those go to new
// extents anyway (the store is copy-on-write). It is how a checkpoint
// takes a consistent snapshot of store-resident tensors without copying
// them: pin, let training go on, read the pinned versions, release.
//
// Methods are safe for concurrent use. Release is called once, after the
// last read has been waited for; a pinned version costs its extents in
// the swap files until then.
type Pinned struct {
	s        *Store
	versions map[string]*version
	released bool
}

// Pin pins the current versions of names. It fails, pinning nothing, when
// a name is not stored (ErrNotFound) or the store is closed.
func (s *Store) Pin(names ...string) (*Pinned, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	for _, n := range names {
		if _, ok := s.tensors[n]; !ok {
			return nil, &TensorError{Op: "pin", Tensor: n, Err: ErrNotFound}
		}
	}
	p := &Pinned{s: s, versions: make(map[string]*version, len(names))}
	for _, n := range names {
		if _, dup := p.versions[n]; dup {
			continue
		}
		v := s.tensors[n]
		v.refs++ // as a read in flight: freed only at refs == 0
		p.versions[n] = v
	}
	return p, nil
}

// Len returns the logical length of name's pinned version.
func (p *Pinned) Len(name string) (int64, bool) {
	v, ok := p.versions[name]
	if !ok {
		return 0, false
	}
	return v.length, true
}

// ReadAsync starts reading name's pinned version into b (as
// Store.ReadAsync: len(b) is the tensor's length, cap(b) covers the padded
// length, b is aligned). Checksums, when on, are verified by Wait.
func (p *Pinned) ReadAsync(name string, b []byte) (*Pending, error) {
	s := p.s
	s.mu.Lock()
	v, ok := p.versions[name]
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: ErrClosed}
	case p.released:
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: fmt.Errorf("read after the pinned versions were released: %w", ErrClosed)}
	case !ok:
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: fmt.Errorf("not pinned: %w", ErrNotFound)}
	}
	if int64(len(b)) != v.length || int64(cap(b)) < v.padded {
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: fmt.Errorf("buffer length %d / capacity %d; the tensor has %d bytes (%d padded)", len(b), cap(b), v.length, v.padded)}
	}
	v.refs++ // the read's own reference, dropped by Wait
	s.mu.Unlock()
	pd := &Pending{s: s, op: "swap-in", name: name, v: v, buf: b[:v.padded]}
	if err := s.submit(pd, aio.OpRead); err != nil {
		s.mu.Lock()
		s.unrefLocked(v)
		s.stats.ReadErrors++
		s.mu.Unlock()
		return nil, &TensorError{Op: "swap-in", Tensor: name, Err: err}
	}
	pd.started()
	return pd, nil
}

// Read is ReadAsync and Wait.
func (p *Pinned) Read(ctx context.Context, name string, b []byte) error {
	if err := ctx.Err(); err != nil {
		return &TensorError{Op: "swap-in", Tensor: name, Err: err}
	}
	pd, err := p.ReadAsync(name, b)
	if err != nil {
		return err
	}
	return pd.Wait()
}

// Release unpins every version; versions replaced or deleted meanwhile
// are freed (once no read uses them). Later calls do nothing.
func (p *Pinned) Release() {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.released {
		return
	}
	p.released = true
	for _, v := range p.versions {
		s.unrefLocked(v)
	}
}
