package swapper

import (
	"errors"
	"fmt"
	"os"

	"github.com/zinfio/zinf/aio"
)

// ErrNotInPlace is wrapped by Adopt's refusals: the bytes cannot be read
// where they lie, and nothing changed (write them with Write instead).
var ErrNotInPlace = errors.New("swapper: not readable in place")

// Adopt makes bytes [off, off+length) of the file at path the current
// version of name, read where they lie: no copy goes to the swap files,
// and the store never writes, moves or deletes the file. Each read is one
// O_DIRECT read of the aligned span around the bytes, padded as the
// store's own tensors are, and the bytes are moved to the buffer's start
// (so a tensor is read in place when its offset leaves it inside its
// padded length from the aligned start, and the span lies in the file).
// It refuses, wrapping ErrNotInPlace and changing nothing, a file that
// cannot be opened with O_DIRECT or bytes that do not fit that rule.
// Ranged reads (ReadRangeAsync) of an adopted tensor are refused; a later
// Write replaces it with a swap-file version as usual. Checksums are not
// computed for adopted bytes (the file's own, e.g. a checkpoint's CRCs,
// are the caller's to check).
func (s *Store) Adopt(name, path string, off, length int64) error {
	if off < 0 || length <= 0 {
		return &TensorError{Op: "adopt", Tensor: name, Err: fmt.Errorf("bytes [%d, %d) of %s (allowed: a non-empty range at offset >= 0)", off, off+length, path)}
	}
	f, err := s.adoptedFile(path)
	if err != nil {
		return &TensorError{Op: "adopt", Tensor: name, Err: err}
	}
	notInPlace := func(format string, args ...any) error {
		return &TensorError{Op: "adopt", Tensor: name, Err: fmt.Errorf("%w: %s", ErrNotInPlace, fmt.Sprintf(format, args...))}
	}
	if !f.Direct() {
		return notInPlace("%s is not open with O_DIRECT", path)
	}
	a := int64(f.Alignment())
	padded := s.PaddedLen(length)
	start := off / a * a
	head := off - start
	switch {
	case padded%a != 0:
		return notInPlace("the store's padding %d is not a multiple of %s's alignment %d", padded, path, a)
	case head+length > padded:
		return notInPlace("at offset %d the tensor's %d bytes end %d bytes past the %d-byte aligned span from %d", off, length, head+length-padded, padded, start)
	}
	size, err := f.Size()
	if err != nil {
		return &TensorError{Op: "adopt", Tensor: name, Err: err}
	}
	if start+padded > size {
		return notInPlace("the aligned span [%d, %d) ends past %s's %d bytes", start, start+padded, path, size)
	}
	v := &version{length: length, padded: padded, file: f, fileOff: start, head: head}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &TensorError{Op: "adopt", Tensor: name, Err: ErrClosed}
	}
	if old, ok := s.tensors[name]; ok {
		s.stats.LiveBytes -= old.padded
		old.retired = true
		if old.refs == 0 {
			s.freeLocked(old)
		}
	}
	s.tensors[name] = v
	s.stats.LiveBytes += v.padded
	return nil
}

// adoptedFile opens path read-only through the engine, once per path.
func (s *Store) adoptedFile(path string) (*aio.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if f := s.adopted[path]; f != nil {
		return f, nil
	}
	f, err := s.opts.Engine.Open(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	if s.adopted == nil {
		s.adopted = map[string]*aio.File{}
	}
	s.adopted[path] = f
	return f, nil
}

// closeAdopted closes the files read in place (they stay on disk).
func (s *Store) closeAdopted() error {
	var errs []error
	for _, f := range s.adopted {
		errs = append(errs, f.Close())
	}
	s.adopted = nil
	return errors.Join(errs...)
}
