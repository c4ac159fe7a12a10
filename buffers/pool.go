package buffers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/internal/base/units"
)

// Pool hands out Buffers from one mmap'ed, optionally mlock'ed arena with a
// fixed byte budget. All methods are safe for concurrent use. Close is called
// once, after which Acquire fails with ErrClosed.
//
// The arena may be split into reservations (Options.Reservations): a
// purpose with a reservation is served only from its own region of the
// arena, with its own allocator and its own queue of waiters, so consumers
// sized by a plan can never starve one another; purposes without one share
// the rest. No wait is unbounded: a waiter that sees no release in its
// region for Options.StallTimeout fails with ErrStalled and an error that
// names what the region's buffers are held for.
type Pool struct {
	logger       *slog.Logger
	mem          []byte // the arena; len == capacity
	granuleShift uint   // log2(MinBufferBytes)
	pinned       bool
	misuses      atomic.Int64
	stallTimeout time.Duration
	stopWatch    chan struct{}
	watchDone    chan struct{}

	mu        sync.Mutex
	regions   []*region            // shared first, then the reservations
	byPurpose [NumPurposes]*region // the region each purpose is served from
	closed    bool
	unmapped  bool
	// waiterFree recycles waiter records across regions.
	waiterFree *waiter

	// registrars hold the arena registered (Register) until unmap.
	registrars []MemoryRegistrar

	inUse          [NumPurposes]int64
	outstandingBy  [NumPurposes]int64
	inUseTotal     int64
	requestedTotal int64
	peak           int64
	outstanding    int64
	acquires       int64
	waits          int64
	waiting        int
	stalls         int64
	deadlocks      int64

	// holders is the accounting of the holders (WithHolder) that hold
	// buffers or wait; holderWaits counts their waiting Acquire calls.
	holders     map[*Holder]*holdState
	holderWaits int
}

// region is one independently allocated part of the arena: the shared
// region, or one purpose's reservation. Granule numbers in its buddy are
// relative to base.
type region struct {
	name  string // "shared" or the purpose's name
	index int    // in Pool.regions
	base  int32  // first granule in the arena
	alloc *buddy
	// Waiting Acquire calls, oldest first. Service is strictly FIFO: while
	// anyone waits, newcomers queue behind them, so a large request cannot be
	// starved by a stream of small ones.
	waitHead, waitTail *waiter
	waiting            int
	inUse              int64
	outstanding        int64
	anon               int64 // outstanding buffers acquired without a holder
	// progress counts releases; lastProgress is when the last happened (or
	// the first waiter queued on an idle region). The stall watchdog
	// compares them with each waiter's start.
	progress     uint64
	lastProgress time.Time
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
	since      time.Time
	hold       *holdState // the holder's, nil without one
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
	LargestFreeBytes     int64              // the largest buffer Acquire could get now (any region)
	Outstanding          int64              // buffers acquired and not yet released
	OutstandingByPurpose [NumPurposes]int64
	// ReservedBytes is each purpose's reservation (0: served from the
	// shared region).
	ReservedBytes [NumPurposes]int64
	Acquires      int64 // successful acquisitions, ever
	Waits         int64 // Acquire calls that had to block, ever
	Waiting       int   // Acquire calls blocked right now
	Stalls        int64 // Acquire calls failed with ErrStalled, ever
	Deadlocks     int64 // Acquire calls failed with ErrDeadlock, ever
	Misuses       int64 // over-releases and retains after release
	Pinned        bool  // whether the arena is mlock'ed
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
	var reserved int64
	for _, r := range opts.Reservations {
		reserved += roundUp(r, granule)
	}
	if reserved > capacity {
		return nil, fmt.Errorf("buffers: Options.Reservations add up to %s: more than the capacity, %s", formatBytes(reserved), formatBytes(capacity))
	}
	if lim, ok := memlimit.Available(); ok && capacity > lim.Bytes {
		return nil, fmt.Errorf("%w: Options.CapacityBytes %s is more than the %s this process may still allocate (%s)",
			ErrMemory, units.FormatBytesExact(capacity), units.FormatBytesExact(lim.Bytes), lim.What)
	}
	mem, err := mapArena(int(capacity))
	if err != nil {
		return nil, fmt.Errorf("buffers: mmap %s arena: %w", formatBytes(capacity), err)
	}
	p := &Pool{
		logger:       opts.Logger,
		mem:          mem,
		granuleShift: uint(bits.TrailingZeros64(uint64(granule))),
		stallTimeout: opts.StallTimeout,
	}
	// The shared region takes what the reservations leave; each
	// reservation follows in purpose order.
	next := int32(0)
	add := func(name string, units int32) *region {
		r := &region{name: name, index: len(p.regions), base: next}
		if units > 0 {
			r.alloc = newBuddy(units)
		}
		next += units
		p.regions = append(p.regions, r)
		return r
	}
	shared := add("shared", int32((capacity-reserved)/granule))
	for i := range p.byPurpose {
		if n := roundUp(opts.Reservations[i], granule); n > 0 {
			p.byPurpose[i] = add(Purpose(i).String(), int32(n/granule))
		} else {
			p.byPurpose[i] = shared
		}
	}
	if err := p.pin(opts.Pin, opts.Logger); err != nil {
		_ = unmapArena(mem)
		return nil, err
	}
	if p.stallTimeout > 0 {
		p.stopWatch, p.watchDone = make(chan struct{}), make(chan struct{})
		go p.watch()
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

// MaxBufferBytes returns the largest size Acquire can ever serve for a
// purpose served from the shared region: the largest power-of-two multiple
// of MinBufferBytes within it. See MaxBufferBytesFor for a reservation.
func (p *Pool) MaxBufferBytes() int { return p.maxBytes(p.regions[0]) }

// MaxBufferBytesFor returns the largest size Acquire can ever serve for
// purpose: the largest power-of-two multiple of MinBufferBytes within the
// region it is served from.
func (p *Pool) MaxBufferBytesFor(purpose Purpose) int {
	if !purpose.Valid() {
		return 0
	}
	return p.maxBytes(p.byPurpose[purpose])
}

func (p *Pool) maxBytes(r *region) int {
	if r.alloc == nil {
		return 0
	}
	return 1 << (p.granuleShift + uint(r.alloc.maxOrder))
}

// CapacityBytesFor returns the bytes of the region purpose is served
// from: its reservation, or the shared region.
func (p *Pool) CapacityBytesFor(purpose Purpose) int64 {
	if !purpose.Valid() {
		return 0
	}
	return p.regionBytes(p.byPurpose[purpose])
}

// ReservedBytes returns purpose's reservation, or 0 when it is served from
// the shared region.
func (p *Pool) ReservedBytes(purpose Purpose) int64 {
	if !purpose.Valid() || p.byPurpose[purpose] == p.regions[0] {
		return 0
	}
	return p.regionBytes(p.byPurpose[purpose])
}

func (p *Pool) regionBytes(r *region) int64 {
	if r.alloc == nil {
		return 0
	}
	return int64(r.alloc.nUnits) << p.granuleShift
}

// BlockBytes returns the arena bytes a buffer of size bytes occupies once
// acquired: size rounded up to the granule. See SpanBytes for what the
// allocator needs free to hand it out.
func (p *Pool) BlockBytes(size int64) int64 { return BlockBytes(size, p.MinBufferBytes()) }

// BlockBytes is the pool's block rule: a buffer of size bytes occupies size
// rounded up to a multiple of granule (the allocator returns the rest of
// its power-of-two block at once). A size <= 0 occupies nothing.
func BlockBytes(size int64, granule int) int64 {
	if size <= 0 {
		return 0
	}
	return roundUp(size, int64(granule))
}

// SpanBytes is the free, aligned power-of-two block the allocator must find
// to hand out a buffer of size bytes (it keeps BlockBytes of it). A region
// in which every buffer its consumer holds at once is counted at SpanBytes
// can always serve that consumer once its own buffers are released, which
// is how reservations are sized.
func SpanBytes(size int64, granule int) int64 {
	if size <= 0 {
		return 0
	}
	units := (size + int64(granule) - 1) / int64(granule)
	return int64(granule) << bits.Len64(uint64(units-1))
}

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
func (p *Pool) checkRequest(size int, purpose Purpose) (int32, *region, error) {
	if !purpose.Valid() {
		return 0, nil, &AcquireError{size, purpose, ErrInvalidPurpose}
	}
	r := p.byPurpose[purpose]
	capBytes := p.regionBytes(r)
	switch {
	case size <= 0:
		return 0, nil, &AcquireError{size, purpose, fmt.Errorf("%w: must be > 0", ErrInvalidSize)}
	case int64(size) > capBytes:
		// Named only here: building the string on every request would
		// allocate on the hot path.
		where := "the capacity"
		if r != p.regions[0] {
			where = "the " + purpose.String() + " reservation"
		}
		return 0, nil, &AcquireError{size, purpose, fmt.Errorf("%w: %s is %s",
			ErrTooLarge, where, formatBytes(capBytes))}
	case size > p.maxBytes(r):
		return 0, nil, &AcquireError{size, purpose, fmt.Errorf(
			"%w: the largest buffer a %s region holds is %s (use a power-of-two capacity to allow one buffer as large as the region)",
			ErrTooLarge, formatBytes(capBytes), formatBytes(int64(p.maxBytes(r))))}
	}
	return int32((int64(size) + int64(p.MinBufferBytes()) - 1) >> p.granuleShift), r, nil
}

// Acquire returns a buffer of size bytes for purpose, blocking while the
// budget of the purpose's region is spent (backpressure) until enough
// memory is released, ctx is done, the pool is closed, or the region makes
// no progress (no release) for Options.StallTimeout (ErrStalled, naming
// what the region's buffers are held for). Waiters are served first come,
// first served. It fails at once, without blocking, for a size <= 0 or one
// the region can never hold (ErrTooLarge), after Close (ErrClosed), and
// when ctx is already done, even if memory is free. Errors are
// *AcquireError naming the size and purpose, wrapping the cause (a sentinel
// or ctx.Err()). The buffer's memory is not zeroed: it holds whatever its
// last user left.
func (p *Pool) Acquire(ctx context.Context, size int, purpose Purpose) (*Buffer, error) {
	units, r, err := p.checkRequest(size, purpose)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &AcquireError{size, purpose, err}
	}
	b := new(Buffer) // outside the lock; the one allocation per Acquire
	h := HolderFrom(ctx)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, &AcquireError{size, purpose, ErrClosed}
	}
	if h != nil {
		b.hold = p.holdLocked(h)
	}
	queued := queuedFrom(ctx)
	if r.waitHead == nil && p.allocLocked(r, b, units, size, purpose) {
		p.mu.Unlock()
		if queued != nil {
			queued()
		}
		return b, nil
	}
	w := p.newWaiterLocked()
	w.units, w.size, w.purpose, w.buf, w.hold = units, size, purpose, b, b.hold
	w.since = time.Now()
	if r.waitHead == nil && r.lastProgress.Before(w.since) {
		// An idle region's clock starts with its first waiter.
		r.lastProgress = w.since
	}
	p.enqueueLocked(r, w)
	p.waits++
	if w.hold != nil {
		// This wait may be the one that leaves nobody able to release.
		p.checkDeadlockLocked()
	}
	p.mu.Unlock()
	if queued != nil {
		queued()
	}

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
		// Granted (or failed by Close or the watchdog) while ctx was being
		// cancelled: the caller sees ctx's error, so give a granted buffer
		// straight back.
		if w.err == nil {
			b.refs.Store(0)
			p.putLocked(b)
		}
	default:
		wasHead := r.waitHead == w
		p.dequeueLocked(r, w)
		if wasHead {
			p.grantLocked(r) // those queued behind may fit now
		}
	}
	p.freeWaiterLocked(w)
	p.mu.Unlock()
	return nil, &AcquireError{size, purpose, ctx.Err()}
}

// TryAcquire is Acquire without blocking: it returns false when the memory
// is not free right now, when other Acquire calls are already waiting in
// the purpose's region (they keep their turn), when the size or purpose is
// invalid or too large, and after Close.
func (p *Pool) TryAcquire(size int, purpose Purpose) (*Buffer, bool) {
	units, r, err := p.checkRequest(size, purpose)
	if err != nil {
		return nil, false
	}
	b := new(Buffer)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || r.waitHead != nil || !p.allocLocked(r, b, units, size, purpose) {
		return nil, false
	}
	return b, true
}

// allocLocked carves units granules of region r for b and does the
// accounting.
func (p *Pool) allocLocked(r *region, b *Buffer, units int32, size int, purpose Purpose) bool {
	u, ok := r.alloc.alloc(units)
	if !ok {
		return false
	}
	u += r.base
	off := int64(u) << p.granuleShift
	n := int64(units) << p.granuleShift
	b.pool, b.region, b.unit, b.units, b.purpose = p, r, u, units, purpose
	b.data = p.mem[off : off+int64(size) : off+n]
	b.refs.Store(1)
	p.inUse[purpose] += n
	p.inUseTotal += n
	r.inUse += n
	r.outstanding++
	if s := b.hold; s != nil {
		s.held[r.index]++
		s.bytes[r.index] += n
	} else {
		r.anon++
	}
	p.requestedTotal += int64(size)
	p.peak = max(p.peak, p.inUseTotal)
	p.outstanding++
	p.outstandingBy[purpose]++
	p.acquires++
	return true
}

// grantLocked serves r's waiters in order while the oldest one fits.
func (p *Pool) grantLocked(r *region) {
	for w := r.waitHead; w != nil; w = r.waitHead {
		if !r.alloc.canAlloc(w.units) {
			return
		}
		p.allocLocked(r, w.buf, w.units, w.size, w.purpose)
		p.dequeueLocked(r, w)
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
	r := b.region
	n := int64(b.units) << p.granuleShift
	r.alloc.release(b.unit-r.base, b.units)
	p.inUse[b.purpose] -= n
	p.inUseTotal -= n
	r.inUse -= n
	r.outstanding--
	if s := b.hold; s != nil {
		s.held[r.index]--
		s.bytes[r.index] -= n
		p.dropIdleLocked(s)
	} else {
		r.anon--
	}
	r.progress++
	if r.waitHead != nil {
		r.lastProgress = time.Now()
	}
	p.requestedTotal -= int64(len(b.data))
	p.outstanding--
	p.outstandingBy[b.purpose]--
	if !p.closed {
		p.grantLocked(r)
		if p.holderWaits > 0 && r.waitHead != nil {
			// The release may have left only waiting holders in r.
			p.checkDeadlockLocked()
		}
		return
	}
	if p.outstanding == 0 && !p.unmapped {
		// Close left the arena mapped for leaked buffers; the last is back.
		if err := p.unmapLocked(); err != nil {
			p.logger.Error("buffers: unmapping the arena after the last leaked buffer was released", slog.Any("error", err))
		}
	}
}

// watch is the stall watchdog: it fails every waiter of a region that has
// seen no release for stallTimeout since the waiter queued.
func (p *Pool) watch() {
	defer close(p.watchDone)
	tick := time.NewTicker(max(p.stallTimeout/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-p.stopWatch:
			return
		case now := <-tick.C:
			p.mu.Lock()
			for _, r := range p.regions {
				if r.waitHead == nil || now.Sub(r.lastProgress) < p.stallTimeout || now.Sub(r.waitHead.since) < p.stallTimeout {
					continue
				}
				err := &StallError{Region: r.name, Stalled: now.Sub(r.lastProgress).Round(time.Millisecond), Holders: p.holdersLocked()}
				for w := r.waitHead; w != nil; w = r.waitHead {
					p.dequeueLocked(r, w)
					w.err = err
					p.stalls++
					w.ready <- struct{}{}
				}
			}
			p.mu.Unlock()
		}
	}
}

// Holders describes what the pool's memory is held for right now, region
// by region: capacity, bytes and buffers held per purpose, and the waiting
// requests. It is what ErrStalled reports.
func (p *Pool) Holders() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holdersLocked()
}

func (p *Pool) holdersLocked() string {
	var parts []string
	for _, r := range p.regions {
		if r.alloc == nil {
			continue // a shared region the reservations left no room for
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "%s region %s: ", r.name, formatBytes(p.regionBytes(r)))
		if r.outstanding == 0 {
			sb.WriteString("nothing held")
		} else {
			fmt.Fprintf(&sb, "%s in %d buffer(s)", formatBytes(r.inUse), r.outstanding)
			var held []string
			for pu := range p.byPurpose {
				if p.byPurpose[pu] == r && p.outstandingBy[pu] > 0 {
					held = append(held, fmt.Sprintf("%s %s in %d", Purpose(pu), formatBytes(p.inUse[pu]), p.outstandingBy[pu]))
				}
			}
			fmt.Fprintf(&sb, " (%s)", strings.Join(held, ", "))
		}
		if w := r.waitHead; w != nil && r.alloc.freeUnits >= int64(w.units) && !r.alloc.canAlloc(w.units) {
			// Free bytes enough, no aligned block: the buffers held are
			// scattered over the region (see SpanBytes).
			fmt.Fprintf(&sb, ", fragmented: %s free but no free aligned %s block (the largest is %s)",
				formatBytes(r.alloc.freeUnits<<p.granuleShift), formatBytes(SpanBytes(int64(w.size), p.MinBufferBytes())), formatBytes(r.alloc.largestFree()<<p.granuleShift))
		}
		if r.waiting > 0 {
			var ws []string
			for w := r.waitHead; w != nil && len(ws) < 8; w = w.next {
				ws = append(ws, fmt.Sprintf("%s for %s", formatBytes(int64(w.size)), w.purpose))
			}
			if r.waiting > len(ws) {
				ws = append(ws, fmt.Sprintf("%d more", r.waiting-len(ws)))
			}
			fmt.Fprintf(&sb, ", %d waiting: %s", r.waiting, strings.Join(ws, ", "))
		}
		parts = append(parts, sb.String())
	}
	if len(parts) == 0 {
		return "nothing held"
	}
	return strings.Join(parts, "; ")
}

// Close wakes every waiting Acquire with ErrClosed and unmaps the arena.
// If buffers are still outstanding it returns an error wrapping
// ErrOutstanding that names how many and for which purposes, and leaves the
// arena mapped (correctness over a leak): their holders may still read or
// write it. The arena is then unmapped when the last of them is released.
// Close is called once; a second call returns ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	for _, r := range p.regions {
		for w := r.waitHead; w != nil; w = r.waitHead {
			p.dequeueLocked(r, w)
			w.err = ErrClosed
			w.ready <- struct{}{}
		}
	}
	p.mu.Unlock()
	if p.stopWatch != nil {
		close(p.stopWatch)
		<-p.watchDone
	}
	p.mu.Lock()
	defer p.mu.Unlock()
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
	var errs []error
	for _, r := range p.registrars {
		// Before the munmap: a registration that outlived the mapping
		// would keep the old pages pinned, and an I/O engine could take a
		// later mapping at the same address for registered memory.
		if err := r.UnregisterMemory(p.mem); err != nil {
			errs = append(errs, fmt.Errorf("buffers: unregistering the arena: %w", err))
		}
	}
	p.registrars = nil
	if p.pinned {
		_ = munlockFn(p.mem) // munmap unlocks too; this is only tidy
	}
	if err := unmapArena(p.mem); err != nil {
		errs = append(errs, fmt.Errorf("buffers: munmap %s arena: %w", formatBytes(int64(len(p.mem))), err))
	}
	return errors.Join(errs...)
}

// MemoryRegistrar is something that can register host memory for faster
// transfers and must be told before that memory goes away: an I/O engine
// (aio.Engine: io_uring registered buffers) or a device runtime.
type MemoryRegistrar interface {
	RegisterMemory(mem []byte) error
	UnregisterMemory(mem []byte) error
}

// Register registers the arena with r (r.RegisterMemory) and keeps it
// registered until the arena is unmapped: Close (or the last Release
// after it) calls r.UnregisterMemory first. r's error is returned; a
// registrar that refused may still hold the arena in its set (an aio
// engine does, moving it as ordinary memory), so the pool unregisters it
// in any case. Register fails with ErrClosed once Close was called, and
// for a registrar the arena is registered with already.
func (p *Pool) Register(r MemoryRegistrar) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	for _, have := range p.registrars {
		if have == r {
			return errors.New("buffers: Register: the arena is registered with this registrar already")
		}
	}
	p.registrars = append(p.registrars, r)
	return r.RegisterMemory(p.mem[:len(p.mem):len(p.mem)])
}

// Stats returns a snapshot of the pool's accounting.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{
		CapacityBytes:        int64(len(p.mem)),
		InUseBytes:           p.inUseTotal,
		InUseBytesByPurpose:  p.inUse,
		RequestedBytes:       p.requestedTotal,
		PeakInUseBytes:       p.peak,
		Outstanding:          p.outstanding,
		OutstandingByPurpose: p.outstandingBy,
		Acquires:             p.acquires,
		Waits:                p.waits,
		Waiting:              p.waiting,
		Stalls:               p.stalls,
		Deadlocks:            p.deadlocks,
		Misuses:              p.misuses.Load(),
		Pinned:               p.pinned,
	}
	for _, r := range p.regions {
		if r.alloc == nil {
			continue
		}
		st.FreeBytes += r.alloc.freeUnits << p.granuleShift
		st.LargestFreeBytes = max(st.LargestFreeBytes, r.alloc.largestFree()<<p.granuleShift)
	}
	for i, r := range p.byPurpose {
		if r != p.regions[0] {
			st.ReservedBytes[i] = p.regionBytes(r)
		}
	}
	return st
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

func (p *Pool) enqueueLocked(r *region, w *waiter) {
	w.prev, w.next = r.waitTail, nil
	if r.waitTail != nil {
		r.waitTail.next = w
	} else {
		r.waitHead = w
	}
	r.waitTail = w
	r.waiting++
	p.waiting++
	if s := w.hold; s != nil {
		s.waiting++
		p.holderWaits++
	}
}

func (p *Pool) dequeueLocked(r *region, w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		r.waitHead = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		r.waitTail = w.prev
	}
	w.prev, w.next = nil, nil
	r.waiting--
	p.waiting--
	if s := w.hold; s != nil {
		s.waiting--
		p.holderWaits--
		p.dropIdleLocked(s)
	}
}
