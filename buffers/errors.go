package buffers

import (
	"errors"
	"fmt"
	"github.com/zinfio/zinf/tensor"
	"strings"
	"time"
)

// Sentinel errors; test for them with errors.Is.
var (
	// ErrClosed is returned by Acquire after Close, and to Acquire calls
	// that were waiting when Close ran.
	ErrClosed = tensor.ClosedError("buffers: pool closed")
	// ErrTooLarge is returned by Acquire for a size that can never be
	// served: larger than the capacity, or than the largest buffer the
	// arena can hold (Pool.MaxBufferBytes).
	ErrTooLarge = errors.New("buffers: request larger than the pool can ever hold")
	// ErrInvalidSize is returned by Acquire for a size <= 0, and
	// ErrInvalidPurpose for a purpose outside [0, NumPurposes).
	ErrInvalidSize    = errors.New("buffers: invalid buffer size")
	ErrInvalidPurpose = errors.New("buffers: invalid purpose")
	// ErrPinned is wrapped by NewPool when the arena cannot be mlock'ed
	// under PinRequired; the error names RLIMIT_MEMLOCK and the bytes wanted.
	ErrPinned = errors.New("buffers: cannot pin host memory")
	// ErrOutstanding is wrapped by Close when buffers are still held (a
	// leak); the error names how many and their purposes.
	ErrOutstanding = errors.New("buffers: buffers still outstanding")
	// ErrStalled is wrapped (as a *StallError) by Acquire when the region
	// it waits on saw no release for Options.StallTimeout: every byte is
	// held by buffers whose holders are not giving them back, typically
	// because they wait themselves.
	ErrStalled = errors.New("buffers: pool stalled")
	// ErrDeadlock is wrapped (as a *DeadlockError) by Acquire when its
	// wait can never be served: every buffer of its region is held by
	// holders (WithHolder) that wait themselves, so none can be released.
	// It is reported when the wait becomes unsatisfiable, not after
	// Options.StallTimeout; errors.Is(err, ErrStalled) holds too.
	ErrDeadlock = errors.New("buffers: pool deadlocked")
	// ErrMemory is wrapped by NewPool when the capacity is more than this
	// process may still allocate (the tightest of MemAvailable, the memory
	// cgroup's limit less its usage, and ulimit -v less the address space
	// mapped): the error names both figures and the limit. A pool that
	// large would be OOM-killed once locked, or die in a Go fatal
	// out-of-memory; it is refused before anything is mapped.
	ErrMemory = errors.New("buffers: not enough memory for the pool")
)

// StallError is the cause of an Acquire failed by the stall watchdog. It
// names the region, how long it saw no release, and what the whole pool's
// memory was held for at that moment.
type StallError struct {
	Region  string
	Stalled time.Duration
	Holders string
}

func (e *StallError) Error() string {
	return fmt.Sprintf("pool stalled: no buffer of the %s region released for %v; held: %s", e.Region, e.Stalled, e.Holders)
}

// Unwrap makes errors.Is(err, ErrStalled) hold.
func (e *StallError) Unwrap() error { return ErrStalled }

// DeadlockError is the cause of the Acquire calls the wait-for check
// failed (see Holder): Holders says, for each holder whose waits can never
// be served, what it holds and what it waits for; Held is what the whole
// pool's memory was held for at that moment (Pool.Holders).
type DeadlockError struct {
	Holders string
	Held    string
}

func (e *DeadlockError) Error() string {
	return fmt.Sprintf("pool deadlocked: every buffer these waits need is held by holders that wait themselves, so none can be released: %s; held: %s", e.Holders, e.Held)
}

// Unwrap makes errors.Is(err, ErrDeadlock) and errors.Is(err, ErrStalled)
// hold.
func (e *DeadlockError) Unwrap() []error { return []error{ErrDeadlock, ErrStalled} }

// AcquireError is returned by Acquire and says which request failed and why.
// Err is one of the sentinels above, or the context's error.
type AcquireError struct {
	Size    int
	Purpose Purpose
	Err     error
}

func (e *AcquireError) Error() string {
	// The sentinels carry the package prefix already; say it once.
	return fmt.Sprintf("buffers: acquire %d bytes for %s: %s", e.Size, e.Purpose,
		strings.TrimPrefix(fmt.Sprint(e.Err), "buffers: "))
}

func (e *AcquireError) Unwrap() error { return e.Err }
