package aio

import (
	"errors"
	"fmt"
	"github.com/zinfio/zinf/tensor"
	"syscall"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrAlignment: an O_DIRECT transfer whose offset, length or buffer
	// address is not aligned to what the file's device demands.
	ErrAlignment = errors.New("aio: misaligned O_DIRECT transfer")
	// ErrNoSpace: the filesystem is full (ENOSPC or EDQUOT).
	ErrNoSpace = errors.New("aio: no space left on device")
	// ErrClosed: the engine or file was closed.
	ErrClosed = tensor.ClosedError("aio: closed")
	// ErrUnavailable: the requested backend cannot run on this system.
	ErrUnavailable = errors.New("aio: backend unavailable")
	// ErrNoDirect: O_DIRECT was required but the filesystem does not support it.
	ErrNoDirect = errors.New("aio: O_DIRECT not supported")
	// ErrShortTransfer: a read hit end of file (or a write made no progress)
	// before the request was complete.
	ErrShortTransfer = errors.New("aio: short transfer")
	// ErrIO: the device reported an I/O error (EIO).
	ErrIO = errors.New("aio: I/O error")
	// ErrRingFailed: the request failed because of its ring (io_uring
	// instance, AIO context or thread pool), not its file: the ring refused
	// a submission, lost completions, or could not be reaped. The error
	// names the backend, the ring and the cause.
	ErrRingFailed = errors.New("aio: ring failed")
	// ErrCompletionLost: the kernel dropped the completion of one of the
	// request's operations (io_uring CQ overflow), so whether its bytes
	// were moved is unknown. It comes wrapped with ErrRingFailed.
	ErrCompletionLost = errors.New("aio: completion lost")
)

// OpError describes a failed request: the operation, the file, where, how
// much was asked and how much was done before the failure. It unwraps to the
// underlying errno, and matches ErrNoSpace, ErrAlignment, ErrIO and
// ErrShortTransfer with errors.Is where they apply.
type OpError struct {
	Op      string // "read" or "write"
	Path    string
	Offset  int64 // the request's file offset
	Bytes   int   // bytes requested
	Done    int64 // bytes completed before the failure
	Direct  bool  // whether the file was opened with O_DIRECT
	Backend string
	Err     error // the cause: a syscall.Errno or a sentinel
}

func (e *OpError) Error() string {
	d := ""
	if e.Direct {
		d = " O_DIRECT"
	}
	return fmt.Sprintf("aio %s%s %s at offset %d (%d bytes, %d done, backend %s): %v",
		e.Op, d, e.Path, e.Offset, e.Bytes, e.Done, e.Backend, e.Err)
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// Is maps errnos to the package's sentinels.
func (e *OpError) Is(target error) bool {
	var errno syscall.Errno
	if !errors.As(e.Err, &errno) {
		return false
	}
	switch target {
	case ErrNoSpace:
		return errno == syscall.ENOSPC || errno == syscall.EDQUOT
	case ErrAlignment:
		return errno == syscall.EINVAL && e.Direct
	case ErrIO:
		return errno == syscall.EIO
	}
	return false
}
