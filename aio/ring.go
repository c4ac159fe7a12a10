package aio

import (
	"errors"
	"fmt"
)

// ring is what a backend provides: a submission/completion queue for single
// pread/pwrite operations on file descriptors. The engine core (worker.go)
// owns splitting, queue depth, retries, short transfers and error mapping;
// a ring only moves one piece at a time and reports the raw result.
//
// A ring is used by exactly one goroutine (its worker); it need not be safe
// for concurrent use.
type ring interface {
	// prep queues one operation on t. buf stays valid and untouched by the
	// caller until its completion is returned by wait. token is returned
	// verbatim in the completion. prep never blocks; the worker never has
	// more than capacity() operations prepped-or-in-flight. A ring with
	// registered buffers (registerBuffers) moves a buf that lies wholly
	// inside one of them with the fixed-buffer operation (fixedBuffer says
	// whether it will); any other buf it moves as it is.
	prep(op Op, t target, buf []byte, off int64, token uint32)
	// fixedBuffer reports whether prep moves buf with a registered buffer.
	fixedBuffer(buf []byte) bool
	// submit hands every prepped operation to the kernel (or the thread
	// pool). It retries EINTR/EAGAIN internally and returns only fatal
	// errors; it returns one only when none of the prepped operations was
	// accepted, and withdraws them then, so the caller may fail them.
	submit() error
	// wait blocks until at least min completions are available (min may be
	// 0: poll), stores up to len(out) of them in out and returns how many.
	// The count is valid even when err is not nil: those completions are
	// delivered before err is looked at. err may wrap a *strayError (a
	// completion for a token not in flight, already discarded), a
	// *lostError (completions the kernel dropped; the ring no longer counts
	// those operations as in flight), or be fatal (anything else: the ring
	// cannot be reaped any more).
	wait(min int, out []completion) (int, error)
	// capacity is the maximum number of operations in flight.
	capacity() int
	// registerBuffers makes regions the ring's registered buffers,
	// replacing any registered before (none, when regions is empty). The
	// worker calls it only while nothing is prepped or in flight. On an
	// error the ring has no registered buffers. A ring without them returns
	// an error matching errors.ErrUnsupported.
	registerBuffers(regions [][]byte) error
	// registerFile puts fd in a free slot of the ring's fixed-file table
	// and returns the slot, for targets to name; the ring holds its own
	// reference to the open file until unregisterFile(slot), so closing fd
	// meanwhile does not close the file. It fails when the table is full
	// or the kernel refuses, and with an error matching
	// errors.ErrUnsupported on a ring without fixed files.
	registerFile(fd int) (slot int32, err error)
	// unregisterFile empties a slot registerFile returned. Nothing may be
	// prepped or in flight on it.
	unregisterFile(slot int32) error
	// close releases the ring. No operation may be in flight.
	close() error
}

// target is the file an operation works on: its descriptor and, when the
// ring has it in its fixed-file table, the slot (-1: none). A ring uses the
// slot when there is one.
type target struct {
	fd   int
	slot int32
}

// fdTarget names a file by its descriptor alone.
func fdTarget(fd int) target { return target{fd: fd, slot: -1} }

// errFixedUnsupported is what rings without registered buffers or fixed
// files return.
var errFixedUnsupported = fmt.Errorf("registered buffers and fixed files are io_uring features: %w", errors.ErrUnsupported)

// completion is one finished operation: res is bytes moved (>= 0) or a
// negated errno, as the kernel reports it.
type completion struct {
	token uint32
	res   int32
}

// newRingFunc builds a ring of the given capacity.
type newRingFunc func(entries int) (ring, error)

// strayError reports a completion whose token the ring did not hold. The
// ring discards it; the worker logs and counts it.
type strayError struct {
	backend string
	token   uint64
}

func (e *strayError) Error() string {
	return fmt.Sprintf("aio: %s ring returned a completion for token %d, which is not in flight", e.backend, e.token)
}

// lostError reports completions the kernel dropped (an io_uring CQ
// overflow it could not even queue). The operations finished, but which
// ones is known only once every other operation has completed.
type lostError struct {
	backend string
	n       int
}

func (e *lostError) Error() string {
	return fmt.Sprintf("aio: %s ring lost %d completions (CQ overflow)", e.backend, e.n)
}
