package param

import (
	"context"
	"errors"
	"fmt"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// flightStage is how far a swap-in got.
type flightStage uint8

const (
	awaitingSlot   flightStage = iota // queued for a BufferCount slot
	awaitingTurn                      // has a slot, lets swap-ins requested before it reach the pool first
	awaitingBuffer                    // has a slot, waits for pool memory
	reading                           // reading from the store
)

// flight is one swap-in of an NVMe partition, run by its own goroutine:
// a slot (BufferCount), then the CPU cache or a pool buffer and a store
// read. done is closed when it lands; err and dropped are set before.
type flight struct {
	ctx    context.Context
	cancel context.CancelFunc
	slot   slotReq
	demand bool        // someone waits for it (guarded by Swapper.mu)
	stage  flightStage // guarded by Swapper.mu
	// keep: the partition is claimed the moment it lands (a copy in use
	// swapped in again after an update, or a read waiting for it), never
	// preempted. size: the pool buffer it asks for, once awaitingBuffer.
	// Both guarded by Swapper.mu.
	keep bool
	size int
	// prev is the swap-in requested just before it that had not yet
	// asked the pool for memory then (nil: none, or the gate has a slot
	// limit); passed is closed once this one has asked the pool, or
	// landed (awaitTurn, passLocked). prev and passedDone are guarded by
	// Swapper.mu.
	prev       *flight
	passed     chan struct{}
	passedDone bool

	done    chan struct{}
	err     error
	dropped bool // abandoned (Release, a newer generation, Close)
}

// startFlightLocked requests a swap-in of t (OnNVMe, swapper open). The
// slot is requested here, not in the goroutine, so that slots are granted
// in the order partitions were asked for.
func (s *Swapper) startFlightLocked(t *tensor, demand bool) *flight {
	ctx, cancel := context.WithCancel(s.ctx)
	f := &flight{ctx: ctx, cancel: cancel, done: make(chan struct{}), demand: demand}
	f.slot.demand = demand
	if s.gate.limit == 0 && s.opts.DeviceIO == nil {
		// Every slot is granted at once: the flights ask the pool in
		// request order, each after the one before it (awaitTurn).
		f.passed, f.prev = make(chan struct{}), s.lastFlight
		s.lastFlight = f
	}
	s.gate.request(&f.slot)
	t.flight, t.state, t.failed = f, InFlight, nil
	s.flights[f] = t
	s.wg.Add(1)
	go s.fly(t, f)
	if demand && s.gate.waiting(&f.slot) {
		s.preemptOneLocked(true)
	}
	return f
}

// promoteLocked marks f as waited for: it moves ahead of queued
// prefetches, and if it is starved, a prefetched partition nobody has
// claimed yet gives up its slot and memory for it.
func (s *Swapper) promoteLocked(f *flight) {
	if f.demand {
		return
	}
	f.demand = true
	s.gate.promote(&f.slot)
	switch {
	case f.stage == awaitingSlot && s.gate.waiting(&f.slot):
		s.preemptOneLocked(true)
	case f.stage == awaitingBuffer:
		for s.preemptForLocked(f.size) {
		}
	}
}

// dropFlightLocked abandons t's swap-in; t goes back to OnNVMe. The
// flight's goroutine still lands it (into the cache when still current).
func (s *Swapper) dropFlightLocked(t *tensor) {
	f := t.flight
	t.flight, t.state = nil, OnNVMe
	f.cancel()
}

// Starvation kinds, for preemption.
const (
	notStarved = iota
	slotStarved
	poolStarved
)

// starvationLocked reports whether a waited-for swap-in cannot proceed:
// poolStarved when one waits for pool memory, else slotStarved when one
// waits for a slot.
func (s *Swapper) starvationLocked() int {
	kind := notStarved
	for f := range s.flights {
		if !f.demand {
			continue
		}
		switch {
		case f.stage == awaitingBuffer:
			return poolStarved
		case f.stage == awaitingSlot && s.gate.waiting(&f.slot):
			kind = slotStarved
		}
	}
	return kind
}

// preemptLocked sends resident t, prefetched and not claimed by any Wait
// or read, back to OnNVMe: its slot goes to a starved demand fetch, and
// its buffer to the CPU cache (toCache) or back to the pool.
func (s *Swapper) preemptLocked(t *tensor, toCache bool) {
	s.claimLocked(t)
	blk := t.res
	t.res, t.state = nil, OnNVMe
	s.gate.release()
	s.stats.Preemptions++
	s.stats.PreemptedBytes += int64(t.bytes)
	if toCache {
		s.cachePutLocked(t, blk, t.gen)
	} else {
		blk.release()
	}
}

func (s *Swapper) preemptOneLocked(toCache bool) bool {
	for t := range s.unclaimed {
		s.preemptLocked(t, toCache)
		return true
	}
	return false
}

// preemptForLocked makes room for a waited-for swap-in or a staged
// update of a size-byte buffer that the pool cannot serve: it sends back one prefetched,
// unclaimed partition, or else one that a Wait still in progress has
// swapped in (pending) whose buffer is smaller than size. It reports
// whether it sent one back.
//
// The pending ones matter because the pool's buddy allocator needs a
// free, aligned power-of-two block (buffers.SpanBytes), not just free
// bytes: a layer's small partitions, placed around what an earlier layer
// held, can leave no block for the layer's largest even though the
// region has its bytes, and nothing else would ever release them. Only
// smaller ones give way, so a partition is never sent back for an equal
// or smaller one and no two swap-ins can take turns evicting each other;
// once everything smaller is gone, every partition the region holds
// fills whole aligned blocks of size's span, and the region's
// reservation (the layer's sum of spans) leaves one free.
func (s *Swapper) preemptForLocked(size int) bool {
	if s.preemptOneLocked(false) {
		return true
	}
	for t := range s.pending {
		if t.res != nil && t.res.bytes < int64(size) {
			s.preemptLocked(t, false)
			return true
		}
	}
	return false
}

// poolShortLocked reports whether a staged update or a waited-for swap-in
// waits for pool memory: then released and preempted partitions give
// their memory back instead of keeping it in the CPU cache, and landing
// prefetches give way.
func (s *Swapper) poolShortLocked() bool {
	return s.stageWaiters > 0 || s.starvationLocked() == poolStarved
}

// starvedBytesLocked is the largest params buffer a waited-for swap-in or
// a staged update waits for in the pool, 0 when none does.
func (s *Swapper) starvedBytesLocked() int {
	n := 0
	for f := range s.flights {
		if f.demand && f.stage == awaitingBuffer {
			n = max(n, f.size)
		}
	}
	for size := range s.stageSizes {
		n = max(n, size)
	}
	return n
}

// claimLocked records that t's resident copy is in use: it is no longer a
// candidate for preemption.
func (s *Swapper) claimLocked(t *tensor) {
	delete(s.unclaimed, t)
	delete(s.pending, t)
}

// pendLocked marks resident t as wanted by a Wait still in progress: it
// is not handed out yet, so a larger waited-for swap-in that the pool
// cannot place may send it back (preemptForLocked); the Wait fetches it
// again. A claimed t stays claimed.
func (s *Swapper) pendLocked(t *tensor) {
	if _, ok := s.unclaimed[t]; ok {
		delete(s.unclaimed, t)
		s.pending[t] = struct{}{}
	}
}

// fly runs a swap-in.
func (s *Swapper) fly(t *tensor, f *flight) {
	defer s.wg.Done()
	defer f.cancel()
	if err := s.gate.await(f.ctx, &f.slot); err != nil {
		s.land(t, f, nil, 0, false, err)
		return
	}
	if s.opts.DeviceIO != nil {
		s.flyDevice(t, f) // the CPU cache holds no device copies
		return
	}
	if blk, gen, ok := s.cacheLookup(t); ok {
		s.mu.Lock()
		s.stats.CacheHits++
		s.mu.Unlock()
		s.land(t, f, blk, gen, true, nil)
		return
	}
	if h := beforeTurn; h != nil {
		h(t.name)
	}
	buf, err := s.swapInBuffer(f, int(s.store.PaddedLen(int64(t.bytes))))
	if err != nil {
		s.land(t, f, nil, 0, true, err)
		return
	}
	// The generation is read before the read is issued: data read from a
	// version newer than its label is discarded as stale, never the reverse,
	// because Init and CommitUpdates change the store before the generation.
	s.mu.Lock()
	f.stage = reading
	gen := t.gen
	if s.opts.MaxInCPUBytes > 0 {
		s.stats.CacheMisses++
	}
	s.mu.Unlock()
	p, err := s.store.ReadAsync(t.key, buf.Bytes()[:t.bytes])
	if err == nil {
		err = p.Wait()
	}
	if err != nil {
		buf.Release()
		s.mu.Lock()
		s.stats.SwapInErrors++
		s.mu.Unlock()
		s.land(t, f, nil, 0, true, err)
		return
	}
	s.mu.Lock()
	s.stats.SwapIns++
	s.stats.BytesRead += int64(t.bytes)
	s.mu.Unlock()
	s.land(t, f, hostBlock(buf), gen, true, nil)
}

// beforeTurn, when set (by this package's tests, before any swap-in
// starts), runs in a swap-in's goroutine on a cache miss before it waits
// for its turn at the pool: a test holds one there to stand for a
// goroutine the scheduler has not run yet.
var beforeTurn func(name string)

// awaitTurn holds flight f back until the swap-in requested before it
// holds its place at the pool (its buffer, or its place among the waiters;
// swapInBuffer) or has landed, and with it, transitively, every earlier
// one; then f asks (stage awaitingBuffer). The pool serves
// its waiters first come, first served; without this, a flight whose
// goroutine ran early took memory ahead of one requested before it that
// had not run yet (a loaded CPU), and gave it back, read for nothing, when
// that one was waited for (PreemptedBytes). The one waited for needs only
// the CPU to get there (no slot limit, a cache lookup), so the first never
// waits and the chain ends; f's context (Close, a dropped swap-in) ends
// the wait. Each flight waits on its predecessor's channel alone: no
// broadcast, however many swap-ins are in flight.
func (s *Swapper) awaitTurn(f *flight, size int) error {
	s.mu.Lock()
	f.stage, f.size = awaitingTurn, size
	prev := f.prev
	s.mu.Unlock()
	if prev != nil {
		select {
		case <-prev.passed:
		case <-f.ctx.Done():
			return fmt.Errorf("waiting for the swap-in requested before it to ask the pool: %w", f.ctx.Err())
		}
	}
	s.mu.Lock()
	f.stage = awaitingBuffer
	s.mu.Unlock()
	return nil
}

// passLocked records that f has asked the pool or landed: the flight
// requested after it may ask now.
func (s *Swapper) passLocked(f *flight) {
	if f.passed == nil || f.passedDone {
		return
	}
	f.passedDone, f.prev = true, nil
	close(f.passed)
	if s.lastFlight == f {
		s.lastFlight = nil
	}
}

// swapInBuffer takes the pool buffer for flight f. Before it blocks, it
// evicts CPU-cache entries (their memory is the pool's) and, for a
// waited-for swap-in, preempts unclaimed prefetched partitions and
// smaller ones of Waits in progress (preemptForLocked) until the pool
// serves it or none is left.
func (s *Swapper) swapInBuffer(f *flight, size int) (*buffers.Buffer, error) {
	if err := s.awaitTurn(f, size); err != nil {
		return nil, err
	}
	// The flight after f may ask the pool once f holds its place there: its
	// buffer, or its place among the waiters (buffers.WithQueued). Letting
	// it go any earlier, between f's turn and f's call to the pool, let it
	// take the memory first (and be preempted for f once f was waited for).
	pass := func() {
		s.mu.Lock()
		s.passLocked(f)
		s.mu.Unlock()
	}
	if b, ok := s.pool.TryAcquire(size, buffers.PurposeParams); ok {
		pass()
		return b, nil
	}
	for s.cachedBytes.Load() > 0 && s.shrinkCache(int64(size)) {
		if b, ok := s.pool.TryAcquire(size, buffers.PurposeParams); ok {
			pass()
			return b, nil
		}
	}
	s.mu.Lock()
	for f.demand && s.preemptForLocked(size) {
		s.mu.Unlock()
		if b, ok := s.pool.TryAcquire(size, buffers.PurposeParams); ok {
			pass()
			return b, nil
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return s.pool.Acquire(buffers.WithQueued(f.ctx, pass), size, buffers.PurposeParams)
}

// land finishes a flight: blk (one reference, generation gen) becomes t's
// resident copy and keeps the slot, or, when the flight was dropped or is
// stale, goes to the cache and the slot is given back.
func (s *Swapper) land(t *tensor, f *flight, blk *block, gen uint64, slot bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer close(f.done)
	delete(s.flights, f)
	s.passLocked(f)
	current := t.flight == f
	if current && err == nil && gen != t.gen {
		// Cannot happen (updates drop the flight before bumping the
		// generation); handled so it could never serve stale bytes.
		current = false
		t.flight, t.state = nil, OnNVMe
	}
	if !current || s.closed {
		f.dropped = true
		if slot {
			s.gate.release()
		}
		if blk != nil {
			if err == nil && !s.closed && gen == t.gen {
				s.cachePutLocked(t, blk, gen)
			} else {
				blk.release()
			}
		}
		if current {
			t.flight, t.state = nil, OnNVMe
		}
		return
	}
	t.flight = nil
	if err != nil {
		t.state = OnNVMe
		if slot {
			s.gate.release()
		}
		var te *swapper.TensorError
		if !errors.As(err, &te) {
			err = &swapper.TensorError{Op: "swap-in", Tensor: t.name, Err: err}
		}
		f.err = err
		t.failed = err
		return
	}
	t.res, t.state = blk, Resident
	if f.keep {
		return // claimed: in use, or a read waits for it
	}
	if f.demand {
		// Its Wait claims it once the whole set is resident; until then
		// a larger waited-for swap-in or staged update the pool cannot
		// place may send it back.
		s.pending[t] = struct{}{}
		if int64(s.starvedBytesLocked()) > blk.bytes {
			s.preemptLocked(t, false)
		}
		return
	}
	s.unclaimed[t] = struct{}{}
	if kind := s.starvationLocked(); kind != notStarved || s.stageWaiters > 0 {
		// A waited-for swap-in or a staged update is stuck behind
		// prefetches: this one, which nobody is waiting for, gives way
		// at once.
		s.preemptLocked(t, kind == slotStarved)
	}
}
