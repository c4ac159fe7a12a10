package gds

import (
	"errors"
	"fmt"
	"sync"

	"github.com/zinfio/zinf/aio"
)

// File is a file opened for device I/O by a DeviceIO (the cuFile Engine or
// the bounce path); only the DeviceIO that opened it may use it. One type
// serves both paths so that callers hold the same handle whichever Select
// chose: it wraps an *aio.File (the descriptor, its O_DIRECT state and
// alignment) and, for the Engine, the file's cuFile handle, registered
// once at open.
//
// A File is safe for concurrent use. Close waits for no one: the cuFile
// handle is deregistered and the descriptor closed when the last request
// in flight on the file completes.
type File struct {
	af    *aio.File
	owner DeviceIO
	// handle is the cuFile handle (Engine files only).
	handle uintptr
	// finish runs once, when the file is closed and idle: it deregisters
	// the handle and forgets the file in its owner.
	finish func()

	mu       sync.Mutex
	refs     int
	closing  bool
	closed   bool
	closeErr error
}

// Path returns the file's path.
func (f *File) Path() string { return f.af.Path() }

// Direct reports whether the file was opened with O_DIRECT.
func (f *File) Direct() bool { return f.af.Direct() }

// Alignment returns the alignment O_DIRECT transfers on the file need (1
// when not O_DIRECT).
func (f *File) Alignment() int { return f.af.Alignment() }

// Size returns the file's size.
func (f *File) Size() (int64, error) { return f.af.Size() }

// Allocate reserves size bytes of disk for the file, so later writes cannot
// fail for lack of space.
func (f *File) Allocate(size int64) error { return f.af.Allocate(size) }

// Truncate sets the file's size.
func (f *File) Truncate(size int64) error { return f.af.Truncate(size) }

// Sync flushes the file's data to the device.
func (f *File) Sync() error { return f.af.Sync() }

// acquire takes a reference for a request by owner.
func (f *File) acquire(owner DeviceIO) error {
	if f == nil {
		return errors.New("nil file")
	}
	if f.owner != owner {
		return fmt.Errorf("file %s was opened by another DeviceIO (%s)", f.Path(), f.owner.Mode())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return aio.ErrClosed
	}
	f.refs++
	return nil
}

// release drops a reference; the last one after Close finishes the file.
func (f *File) release() {
	f.mu.Lock()
	f.refs--
	last := f.refs == 0 && f.closing && !f.closed
	f.mu.Unlock()
	if last {
		f.finishClose()
	}
}

// Close marks the file closed. Its cuFile handle is deregistered and its
// descriptor closed now if no request is in flight on it, else when the
// last one completes. Requests after Close fail with aio.ErrClosed. Close
// is idempotent.
func (f *File) Close() error {
	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		return nil
	}
	f.closing = true
	idle := f.refs == 0
	f.mu.Unlock()
	if idle {
		return f.finishClose()
	}
	return nil
}

func (f *File) finishClose() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return f.closeErr
	}
	f.closed = true
	f.mu.Unlock()
	if f.finish != nil {
		f.finish()
	}
	err := f.af.Close()
	f.mu.Lock()
	f.closeErr = err
	f.mu.Unlock()
	return err
}

// AIO returns the underlying aio file (path, O_DIRECT state, alignment,
// Sync), for code that handles both paths alike.
func (f *File) AIO() *aio.File { return f.af }
