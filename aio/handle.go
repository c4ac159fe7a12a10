package aio

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
)

// Handle offers DeepNVMe's aio_handle shape on top of an Engine, for users
// coming from DeepSpeed: synchronous and asynchronous pread/pwrite by path
// with file offsets, and Wait returning how many requests completed.
//
// Files are opened on first use (read-write, created if missing, with the
// engine's O_DIRECT policy) and kept open until Close. A Handle is safe for
// concurrent use; Wait joins every asynchronous request submitted before it.
type Handle struct {
	e     Engine
	owned bool

	mu      sync.Mutex
	files   map[string]*File
	pending []*Request
	spare   []*Request
	closed  bool
}

// NewHandle builds an engine from opts and a Handle that owns it.
func NewHandle(opts Options) (*Handle, error) {
	e, err := New(opts)
	if err != nil {
		return nil, err
	}
	h := NewHandleWithEngine(e)
	h.owned = true
	return h, nil
}

// NewHandleWithEngine wraps an existing engine; Close leaves it open.
func NewHandleWithEngine(e Engine) *Handle {
	return &Handle{e: e, files: make(map[string]*File)}
}

// Engine returns the engine under the handle.
func (h *Handle) Engine() Engine { return h.e }

// BlockSize, QueueDepth, IntraOpParallelism, SingleSubmit and OverlapEvents
// report the engine's settings (DeepNVMe's getters).
func (h *Handle) BlockSize() int          { return h.e.Options().BlockSizeBytes }
func (h *Handle) QueueDepth() int         { return h.e.Options().QueueDepth }
func (h *Handle) IntraOpParallelism() int { return h.e.Options().IntraOpParallelism }
func (h *Handle) SingleSubmit() bool      { return h.e.Options().SingleSubmit }
func (h *Handle) OverlapEvents() bool     { return !h.e.Options().SerialEvents }

func (h *Handle) file(path string) (*File, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if f, ok := h.files[path]; ok {
		return f, nil
	}
	f, err := h.e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	h.files[path] = f
	return f, nil
}

// SyncPread reads len(buf) bytes of path at off into buf.
func (h *Handle) SyncPread(buf []byte, path string, off int64) (int, error) {
	f, err := h.file(path)
	if err != nil {
		return 0, err
	}
	return h.e.ReadAt(context.Background(), f, buf, off)
}

// SyncPwrite writes buf to path at off.
func (h *Handle) SyncPwrite(buf []byte, path string, off int64) (int, error) {
	f, err := h.file(path)
	if err != nil {
		return 0, err
	}
	return h.e.WriteAt(context.Background(), f, buf, off)
}

// AsyncPread starts reading into buf; buf is owned by the handle until Wait.
func (h *Handle) AsyncPread(buf []byte, path string, off int64) error {
	return h.async(OpRead, buf, path, off)
}

// AsyncPwrite starts writing buf; buf must not change until Wait.
func (h *Handle) AsyncPwrite(buf []byte, path string, off int64) error {
	return h.async(OpWrite, buf, path, off)
}

func (h *Handle) async(op Op, buf []byte, path string, off int64) error {
	f, err := h.file(path)
	if err != nil {
		return err
	}
	h.mu.Lock()
	var r *Request
	if n := len(h.spare); n > 0 {
		r = h.spare[n-1]
		h.spare = h.spare[:n-1]
	} else {
		r = new(Request)
	}
	h.mu.Unlock()
	r.Op, r.File, r.Buf, r.Offset = op, f, buf, off
	if err := h.e.Submit(r); err != nil {
		h.mu.Lock()
		h.spare = append(h.spare, r)
		h.mu.Unlock()
		return err
	}
	h.mu.Lock()
	h.pending = append(h.pending, r)
	h.mu.Unlock()
	return nil
}

// Wait blocks until every asynchronous request submitted so far has
// completed and returns how many completed, with every failure joined into
// the error (each an *OpError naming op, path, offset and bytes done).
func (h *Handle) Wait() (int, error) {
	h.mu.Lock()
	batch := h.pending
	h.pending = nil
	h.mu.Unlock()
	var errs []error
	for _, r := range batch {
		if _, err := r.Wait(); err != nil {
			errs = append(errs, err)
		}
		r.File, r.Buf = nil, nil
	}
	h.mu.Lock()
	h.spare = append(h.spare, batch...)
	h.mu.Unlock()
	return len(batch), errors.Join(errs...)
}

// Close waits for outstanding requests, closes the files and, when the
// handle built its engine, the engine.
func (h *Handle) Close() error {
	_, werr := h.Wait()
	h.mu.Lock()
	h.closed = true
	files := h.files
	h.files = nil
	h.mu.Unlock()
	errs := []error{werr}
	for _, f := range files {
		errs = append(errs, f.Close())
	}
	if h.owned {
		errs = append(errs, h.e.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("aio: closing handle: %w", err)
	}
	return nil
}
