package buffers

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
)

// Pool hands out Buffers from one mmap'ed, optionally mlock'ed arena with a
// fixed byte budget. All methods are safe for concurrent use. Close is called
// once, after which Acquire fails with ErrClosed.
type Pool struct {
	logger       *slog.Logger
	mem          []byte // the arena; len == capacity
	granuleShift uint   // log2(MinBufferBytes)
	pinned       bool
	misuses      atomic.Int64

	mu       sync.Mutex
	alloc    *buddy
	closed   bool
	unmapped bool
	// Waiting Acquire calls, oldest first. Service is strictly FIFO: while
	// anyone waits, newcomers queue behind them, so a large request cannot be
	// starved by a stream of small ones. waiterFree recycles waiter records.
	waitHead, waitTail *waiter
	waiting            int
	waiterFree         *waiter

	inUse          [NumPurposes]int64
	outstandingBy  [NumPurposes]int64
	inUseTotal     int64
	requestedTotal int64
	peak           int64
	outstanding    int64
	acquires       int64
	waits          int64
}

// waiter is one blocked Acquire. ready (capacity 1) receives exactly one
// value when the waiter is granted (buf set) or failed (err set); the record
// is recycled afterwards, so the blocking path allocates nothing in steady
// state either.
type waiter struct {
	units      int32
	size       int
	purpose    Purpose
	buf        *Buffer
	err        error
	ready      chan struct{}
	prev, next *waiter
}

// Stats is a snapshot of a pool's accounting. Byte counts are in size-class
// bytes (what the arena gives up), except RequestedBytes.
type Stats struct {
	CapacityBytes        int64              // the arena's budget
	InUseBytes           int64              // held by outstanding buffers
	InUseBytesByPurpose  [NumPurposes]int64 // InUseBytes split by purpose
	RequestedBytes       int64              // sum of Len() of outstanding buffers
	PeakInUseBytes       int64              // high-water mark of InUseBytes
	FreeBytes            int64              // CapacityBytes - InUseBytes
	LargestFreeBytes     int64              // the largest buffer Acquire could get now
	Outstanding          int64              // buffers acquired and not yet released
	OutstandingByPurpose [NumPurposes]int64
	Acquires             int64 // successful acquisitions, ever
	Waits                int64 // Acquire calls that had to block, ever
	Waiting              int   // Acquire calls blocked right now
	Misuses              int64 // over-releases and retains after release
	Pinned               bool  // whether the arena is mlock'ed
}

// NewPool maps the arena and applies the pin policy. opts is copied,
// defaulted (EnsureDefaults) and validated first.
func NewPool(opts Options) (*Pool, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	granule := int64(opts.MinBufferBytes)
	capacity := roundUp(opts.CapacityBytes, granule)
	mem, err := mapArena(int(capacity))
	if err != nil {
		return nil, fmt.Errorf("buffers: mmap %s arena: %w", formatBytes(capacity), err)
	}
	p := &Pool{
		logger:       opts.Logger,
		mem:          mem,
		granuleShift: uint(bits.TrailingZeros64(uint64(granule))),
		alloc:        newBuddy(int32(capacity / granule)),
	}
	if err := p.pin(opts.Pin, opts.Logger); err != nil {
		_ = unmapArena(mem)
		return nil, err
	}
	return p, nil
}

// Pinned reports whether the arena was mlock'ed (PinAuto falls back to
// unpinned memory when the memlock limit is too low).
func (p *Pool) Pinned() bool { return p.pinned }

// CapacityBytes returns the arena's budget (rounded up to MinBufferBytes).
func (p *Pool) CapacityBytes() int64 { return int64(len(p.mem)) }

// MinBufferBytes returns the allocation granule: every Cap() is a multiple.
func (p *Pool) MinBufferBytes() int { return 1 << p.granuleShift }

// MaxBufferBytes returns the largest size Acquire can ever serve: the
// largest power-of-two multiple of MinBufferBytes within the capacity.
func (p *Pool) MaxBufferBytes() int { return 1 << (p.granuleShift + uint(p.alloc.maxOrder)) }

// Regions returns the arena's mapped memory, one region, so a GPU runtime
// can register it once (cudaHostRegister) instead of per buffer. It returns
// nil once the arena is unmapped.
func (p *Pool) Regions() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unmapped {
		return nil
	}
	return [][]byte{p.mem[:len(p.mem):len(p.mem)]}
}

// checkRequest turns size into granules, or says why it can never be served.
func (p *Pool) checkRequest(size int, purpose Purpose) (int32, error) {
	switch {
	case !purpose.Valid():
		return 0, &AcquireError{size, purpose, ErrInvalidPurpose}
	case size <= 0:
		return 0, &AcquireError{size, purpose, fmt.Errorf("%w: must be > 0", ErrInvalidSize)}
	case int64(size) > int64(len(p.mem)):
		return 0, &AcquireError{size, purpose, fmt.Errorf("%w: the capacity is %s",
			ErrTooLarge, formatBytes(int64(len(p.mem))))}
	case size > p.MaxBufferBytes():
		return 0, &AcquireError{size, purpose, fmt.Errorf(
			"%w: the largest buffer a %s arena holds is %s (use a power-of-two capacity to allow one buffer as large as the arena)",
			ErrTooLarge, formatBytes(int64(len(p.mem))), formatBytes(int64(p.MaxBufferBytes())))}
	}
	return int32((int64(size) + int64(p.MinBufferBytes()) - 1) >> p.granuleShift), nil
}

// Acquire returns a buffer of size bytes for purpose, blocking while the
// budget is spent (backpressure) until enough memory is released, ctx is
// done, or the pool is closed. Waiters are served first come, first served.
// It fails at once, without blocking, for a size <= 0 or one the pool can
// never hold (ErrTooLarge), after Close (ErrClosed), and when ctx is already
// done, even if memory is free. Errors are
// *AcquireError naming the size and purpose, wrapping the cause (a sentinel
// or ctx.Err()). The buffer's memory is not zeroed: it holds whatever its
// last user left.
func (p *Pool) Acquire(ctx context.Context, size int, purpose Purpose) (*Buffer, error) {
	units, err := p.checkRequest(size, purpose)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &AcquireError{size, purpose, err}
	}
	b := new(Buffer) // outside the lock; the one allocation per Acquire
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, &AcquireError{size, purpose, ErrClosed}
	}
	if p.waitHead == nil && p.allocLocked(b, units, size, purpose) {
		p.mu.Unlock()
		return b, nil
	}
	w := p.newWaiterLocked()
	w.units, w.size, w.purpose, w.buf = units, size, purpose, b
	p.enqueueLocked(w)
	p.waits++
	p.mu.Unlock()

	select {
	case <-w.ready:
		p.mu.Lock()
		err := w.err
		p.freeWaiterLocked(w)
		p.mu.Unlock()
		if err != nil {
			return nil, &AcquireError{size, purpose, err}
		}
		return b, nil
	case <-ctx.Done():
	}
	p.mu.Lock()
	select {
	case <-w.ready:
		// Granted (or failed by Close) while ctx was being cancelled: the
		// caller sees ctx's error, so give a granted buffer straight back.
		if w.err == nil {
			b.refs.Store(0)
			p.putLocked(b)
		}
	default:
		wasHead := p.waitHead == w
		p.dequeueLocked(w)
		if wasHead {
			p.grantLocked() // those queued behind may fit now
		}
	}
	p.freeWaiterLocked(w)
	p.mu.Unlock()
	return nil, &AcquireError{size, purpose, ctx.Err()}
}

// TryAcquire is Acquire without blocking: it returns false when the memory
// is not free right now, when other Acquire calls are already waiting (they
// keep their turn), when the size or purpose is invalid or too large, and
// after Close.
func (p *Pool) TryAcquire(size int, purpose Purpose) (*Buffer, bool) {
	units, err := p.checkRequest(size, purpose)
	if err != nil {
		return nil, false
	}
	b := new(Buffer)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.waitHead != nil || !p.allocLocked(b, units, size, purpose) {
		return nil, false
	}
	return b, true
}

// allocLocked carves units granules for b and does the accounting.
func (p *Pool) allocLocked(b *Buffer, units int32, size int, purpose Purpose) bool {
	u, ok := p.alloc.alloc(units)
	if !ok {
		return false
	}
	off := int64(u) << p.granuleShift
	n := int64(units) << p.granuleShift
	b.pool, b.unit, b.units, b.purpose = p, u, units, purpose
	b.data = p.mem[off : off+int64(size) : off+n]
	b.refs.Store(1)
	p.inUse[purpose] += n
	p.inUseTotal += n
	p.requestedTotal += int64(size)
	p.peak = max(p.peak, p.inUseTotal)
	p.outstanding++
	p.outstandingBy[purpose]++
	p.acquires++
	return true
}

// grantLocked serves waiters in order while the oldest one fits.
func (p *Pool) grantLocked() {
	for w := p.waitHead; w != nil; w = p.waitHead {
		if !p.alloc.canAlloc(w.units) {
			return
		}
		p.allocLocked(w.buf, w.units, w.size, w.purpose)
		p.dequeueLocked(w)
		w.ready <- struct{}{}
	}
}

// put returns a buffer whose count reached zero.
func (p *Pool) put(b *Buffer) {
	p.mu.Lock()
	p.putLocked(b)
	p.mu.Unlock()
}

func (p *Pool) putLocked(b *Buffer) {
	n := int64(b.units) << p.granuleShift
	p.alloc.release(b.unit, b.units)
	p.inUse[b.purpose] -= n
	p.inUseTotal -= n
	p.requestedTotal -= int64(len(b.data))
	p.outstanding--
	p.outstandingBy[b.purpose]--
	if !p.closed {
		p.grantLocked()
		return
	}
	if p.outstanding == 0 && !p.unmapped {
		// Close left the arena mapped for leaked buffers; the last is back.
		if err := p.unmapLocked(); err != nil {
			p.logger.Error("buffers: unmapping the arena after the last leaked buffer was released", slog.Any("error", err))
		}
	}
}

// Close wakes every waiting Acquire with ErrClosed and unmaps the arena.
// If buffers are still outstanding it returns an error wrapping
// ErrOutstanding that names how many and for which purposes, and leaves the
// arena mapped (correctness over a leak): their holders may still read or
// write it. The arena is then unmapped when the last of them is released.
// Close is called once; a second call returns ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.closed = true
	for w := p.waitHead; w != nil; w = p.waitHead {
		p.dequeueLocked(w)
		w.err = ErrClosed
		w.ready <- struct{}{}
	}
	if p.outstanding > 0 {
		var parts []string
		for i, c := range p.outstandingBy {
			if c > 0 {
				parts = append(parts, fmt.Sprintf("%s: %d (%s)", Purpose(i), c, formatBytes(p.inUse[i])))
			}
		}
		return fmt.Errorf("buffers: close: %w: %d buffer(s) never released [%s]; their %s stay mapped until they are",
			ErrOutstanding, p.outstanding, strings.Join(parts, ", "), formatBytes(p.inUseTotal))
	}
	return p.unmapLocked()
}

func (p *Pool) unmapLocked() error {
	p.unmapped = true
	if p.pinned {
		_ = munlockFn(p.mem) // munmap unlocks too; this is only tidy
	}
	if err := unmapArena(p.mem); err != nil {
		return fmt.Errorf("buffers: munmap %s arena: %w", formatBytes(int64(len(p.mem))), err)
	}
	return nil
}

// Stats returns a snapshot of the pool's accounting.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		CapacityBytes:        int64(len(p.mem)),
		InUseBytes:           p.inUseTotal,
		InUseBytesByPurpose:  p.inUse,
		RequestedBytes:       p.requestedTotal,
		PeakInUseBytes:       p.peak,
		FreeBytes:            p.alloc.freeUnits << p.granuleShift,
		LargestFreeBytes:     p.alloc.largestFree() << p.granuleShift,
		Outstanding:          p.outstanding,
		OutstandingByPurpose: p.outstandingBy,
		Acquires:             p.acquires,
		Waits:                p.waits,
		Waiting:              p.waiting,
		Misuses:              p.misuses.Load(),
		Pinned:               p.pinned,
	}
}

func (p *Pool) newWaiterLocked() *waiter {
	w := p.waiterFree
	if w == nil {
		return &waiter{ready: make(chan struct{}, 1)}
	}
	p.waiterFree = w.next
	w.next = nil
	return w
}

// freeWaiterLocked recycles w; its ready channel is empty by now.
func (p *Pool) freeWaiterLocked(w *waiter) {
	*w = waiter{ready: w.ready, next: p.waiterFree}
	p.waiterFree = w
}

func (p *Pool) enqueueLocked(w *waiter) {
	w.prev, w.next = p.waitTail, nil
	if p.waitTail != nil {
		p.waitTail.next = w
	} else {
		p.waitHead = w
	}
	p.waitTail = w
	p.waiting++
}

func (p *Pool) dequeueLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		p.waitHead = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		p.waitTail = w.prev
	}
	w.prev, w.next = nil, nil
	p.waiting--
}
