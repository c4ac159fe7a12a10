package aio

import (
	"context"
	"os"
	"sync/atomic"
	"time"
)

// Engine moves bytes between host buffers and Files asynchronously.
//
// Submit, Open and the sync helpers may be called from any goroutine. Close
// is called once; it waits for in-flight requests to finish, then releases
// the rings. Requests submitted after Close fail with ErrClosed.
type Engine interface {
	// Name returns the concrete backend: "uring", "libaio" or "posix".
	Name() string
	// Options returns the engine's effective options (defaults filled).
	Options() Options
	// Open opens a file with the engine's O_DIRECT policy (see OpenFile).
	Open(path string, flag int, perm os.FileMode) (*File, error)
	// Submit starts r. The caller owns r and r.Buf until r.Wait returns
	// (or r.Done reports true); neither may be touched before. Submit
	// returns an error (and starts nothing) for invalid requests: a nil or
	// closed file, an empty buffer, a negative offset, or a misaligned
	// O_DIRECT request (ErrAlignment). A Request may be reused after Wait.
	Submit(r *Request) error
	// ReadAt and WriteAt are synchronous conveniences: Submit then Wait.
	ReadAt(ctx context.Context, f *File, buf []byte, off int64) (int, error)
	WriteAt(ctx context.Context, f *File, buf []byte, off int64) (int, error)
	// RegisterMemory registers mem, host memory that request buffers will
	// lie in (a pinned pool's arena: buffers.Pool.Register calls it), with
	// every ring, where the backend has registered buffers: io_uring pins
	// the pages once (IORING_REGISTER_BUFFERS) and moves every piece that
	// lies inside mem with READ_FIXED/WRITE_FIXED instead of pinning its
	// pages per request. Requests behave the same either way. It waits
	// until each ring has nothing in flight to change its set, and returns
	// nil when every ring registered mem; otherwise an error saying why not
	// (one matching errors.ErrUnsupported for libaio and posix; for
	// io_uring the errno and what to do, typically the memlock limit)
	// after logging it once per engine, and those rings move mem as any
	// other memory. Either way mem stays in the engine's set until
	// UnregisterMemory. mem must stay mapped until UnregisterMemory(mem)
	// has returned or the engine is closed; it must not overlap memory
	// registered already.
	RegisterMemory(mem []byte) error
	// UnregisterMemory removes mem (the same slice given to
	// RegisterMemory) from every ring; once it returns, no operation uses
	// mem's registration. It fails only for memory that was not
	// registered.
	UnregisterMemory(mem []byte) error
	// Stats returns cumulative counters.
	Stats() Stats
	// Close drains in-flight requests and releases the engine.
	Close() error
}

// Stats are cumulative engine counters.
type Stats struct {
	ReadOps, WriteOps     int64 // requests completed
	ReadBytes, WriteBytes int64 // bytes moved
	Pieces                int64 // pieces issued (including resubmissions)
	Retries               int64 // EINTR/EAGAIN retries
	ShortTransfers        int64 // short completions continued
	Errors                int64 // requests that failed
	// StrayCompletions counts completions a ring returned for an
	// operation it did not hold; they are logged and ignored.
	StrayCompletions int64
	// RingFailures counts ring-level failures: a refused submission, lost
	// completions (CQ overflow), a ring that could not be reaped. Each also
	// fails the requests it touched with an error matching ErrRingFailed.
	RingFailures int64
	// RegisteredBytes is the memory registered with RegisterMemory that
	// every ring took (0 when any refused it, or on libaio and posix).
	RegisteredBytes int64
	// FixedBufferPieces counts pieces moved with a registered buffer
	// (io_uring READ_FIXED/WRITE_FIXED); FixedFilePieces pieces that named
	// their file by a fixed-file slot (io_uring IOSQE_FIXED_FILE).
	FixedBufferPieces, FixedFilePieces int64
}

// Request is one read or write: Op, File, Offset and Buf are set by the
// caller before Submit. It doubles as the request's ticket: Wait returns the
// bytes moved and the error. The zero value plus those four fields is ready
// to submit; reuse after Wait allocates nothing.
type Request struct {
	Op     Op
	File   *File
	Offset int64
	Buf    []byte

	// Set by the engine.
	done    chan struct{} // created once per Request, reused
	pending atomic.Int32  // slices not yet finished
	moved   atomic.Int64  // bytes completed
	errSet  atomic.Bool
	err     error
	state   atomic.Int32 // 0 idle, 1 in flight, 2 done (not waited)
	slices  []slice      // per-worker parts, reused across submissions
	doneAt  time.Time    // when the last slice finished; read after done
}

// CompletedAt returns when the request completed: the moment its last
// piece was reaped, which may be well before Wait was called. It is valid
// once Wait (or WaitContext, or Done) has reported completion, until the
// request is submitted again; the zero time before that.
func (r *Request) CompletedAt() time.Time {
	if r.state.Load() == 1 {
		return time.Time{}
	}
	return r.doneAt
}

// Wait blocks until the request completes and returns the bytes moved and,
// on failure, an *OpError. Calling Wait on a request that was never
// submitted returns 0, nil.
func (r *Request) Wait() (int64, error) {
	if r.state.Load() == 0 {
		return 0, nil
	}
	<-r.done
	r.state.Store(0)
	return r.moved.Load(), r.err
}

// WaitContext is Wait that gives up when ctx is done. The request is still
// in flight then: the caller must call Wait before reusing r or r.Buf.
func (r *Request) WaitContext(ctx context.Context) (int64, error) {
	if r.state.Load() == 0 {
		return 0, nil
	}
	select {
	case <-r.done:
		r.state.Store(0)
		return r.moved.Load(), r.err
	case <-ctx.Done():
		return r.moved.Load(), ctx.Err()
	}
}

// Done reports whether the request has completed (without consuming it).
func (r *Request) Done() bool {
	if r.state.Load() == 0 {
		return true
	}
	select {
	case <-r.done:
		// Put the token back so Wait still returns.
		r.done <- struct{}{}
		return true
	default:
		return false
	}
}
