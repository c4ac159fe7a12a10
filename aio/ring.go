package aio

import "fmt"

// ring is what a backend provides: a submission/completion queue for single
// pread/pwrite operations on file descriptors. The engine core (worker.go)
// owns splitting, queue depth, retries, short transfers and error mapping;
// a ring only moves one piece at a time and reports the raw result.
//
// A ring is used by exactly one goroutine (its worker); it need not be safe
// for concurrent use.
type ring interface {
	// prep queues one operation. buf stays valid and untouched by the caller
	// until its completion is returned by wait. token is returned verbatim in
	// the completion. prep never blocks; the worker never has more than
	// capacity() operations prepped-or-in-flight.
	prep(op Op, fd int, buf []byte, off int64, token uint32)
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
	// close releases the ring. No operation may be in flight.
	close() error
}

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
