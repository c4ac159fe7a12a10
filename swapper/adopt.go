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
// store's own tensors are (at most PaddedLen(length) bytes, so a pool
// buffer sized for the tensor holds it), and the bytes are moved to the
// buffer's start. Any offset works: the tensor's last bytes that such a
// span cannot reach, because the offset pushes them into the block after
// it or they lie in the file's last, partial block, are fewer than one
// alignment unit; Adopt reads them once and keeps them in memory (the
// file is read-only to the store, and must not change while adopted).
// It refuses, wrapping ErrNotInPlace and changing nothing, a file that
// cannot be opened with O_DIRECT; bytes past the file's end are an
// error.
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
	if padded%a != 0 {
		return notInPlace("the store's padding %d is not a multiple of %s's alignment %d", padded, path, a)
	}
	size, err := f.Size()
	if err != nil {
		return &TensorError{Op: "adopt", Tensor: name, Err: err}
	}
	if off > size-length {
		return &TensorError{Op: "adopt", Tensor: name, Err: fmt.Errorf("bytes [%d, %d) lie past the end of %s (%d bytes)", off, off+length, path, size)}
	}
	// The O_DIRECT read: the whole aligned blocks from the one holding
	// off, at most the padded length (what a swap-in buffer holds) and
	// none past the file's end. The tensor's bytes after it (less than
	// one block: those in the block after a padded span that off's head
	// pushed them into, or in the file's last, partial block) are read
	// here once and kept.
	start := off / a * a
	head := off - start
	direct := min(padded, (size-start)/a*a)
	if direct <= head {
		direct = 0
	}
	keep := length
	if direct > 0 {
		keep = max(0, head+length-direct)
	}
	if keep >= a {
		return notInPlace("%d bytes at offset %d would leave %d bytes outside the aligned span (at most %d)", length, off, keep, a-1)
	}
	var tail []byte
	if keep > 0 {
		tail = make([]byte, keep)
		if err := readAt(f.Fd(), path, tail, off+length-keep); err != nil {
			return &TensorError{Op: "adopt", Tensor: name, Err: err}
		}
	}
	v := &version{length: length, padded: padded, file: f, fileOff: start, head: head, direct: direct, tail: tail}
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

// readAt reads len(b) bytes from off of the file open as fd (O_DIRECT)
// at path, through the page cache (a few bytes that no aligned O_DIRECT
// read covers): it opens path again and refuses a file other than the
// one fd reads, so that a file replaced at path meanwhile (a checkpoint
// rewritten beside the run) never gives a tensor bytes of two files.
func readAt(fd int, path string, b []byte, off int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	same, err := sameFile(fd, f)
	if err != nil {
		return err
	}
	if !same {
		return fmt.Errorf("%s was replaced since it was opened to be read in place: adopt from files that nothing rewrites while they are read", path)
	}
	_, err = f.ReadAt(b, off)
	return err
}
