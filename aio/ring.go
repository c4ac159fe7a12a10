package aio

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
	// pool). It retries EINTR/EAGAIN internally and returns only fatal errors.
	submit() error
	// wait blocks until at least min completions are available (min may be
	// 0: poll), stores up to len(out) of them in out and returns how many.
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
