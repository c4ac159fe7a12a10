package aio

import (
	"syscall"
	"time"
)

// FaultHook is the fault-injection seam. When Options.Faults is set, the
// engine calls Before for every piece just before it is issued (including
// resubmissions of a short transfer's remainder and retries), from the
// worker goroutine that owns the piece; implementations must be safe for
// concurrent use by several workers.
type FaultHook interface {
	Before(p PieceInfo) Fault
}

// PieceInfo describes one piece about to be issued.
type PieceInfo struct {
	Op     Op
	Path   string
	Offset int64
	Len    int
	// Align is the file's required alignment (1 when not O_DIRECT). A hook
	// that shortens a transfer on an O_DIRECT file should keep the
	// shortened length a multiple of Align, as the kernel would.
	Align int
}

// Fault is a hook's verdict for one piece. The zero value means "proceed".
type Fault struct {
	// Err, when non-zero, completes the piece with this errno without doing
	// any I/O (as if the kernel had returned -Err).
	Err syscall.Errno
	// ShortLen, when 0 < ShortLen < Len, issues only the first ShortLen
	// bytes, so the engine sees a short transfer and must continue.
	ShortLen int
	// Delay is slept before the piece is issued.
	Delay time.Duration
}
