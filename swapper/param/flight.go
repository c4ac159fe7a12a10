package param

import (
	"context"
	"errors"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// flightStage is how far a swap-in got.
type flightStage uint8

const (
	awaitingSlot   flightStage = iota // queued for a BufferCount slot
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

	done    chan struct{}
	err     error
	dropped bool // abandoned (Release, a newer generation, Close)
}

// startFlightLocked requests a swap-in of t (OnNVMe, swapper open). The
// slot is requested here, not in the goroutine, so that slots are granted
// in the order partitions were asked for.
func (s *Swapper) startFlightLocked(t *tensor, demand bool) {
	ctx, cancel := context.WithCancel(s.ctx)
	f := &flight{ctx: ctx, cancel: cancel, done: make(chan struct{}), demand: demand}
	f.slot.demand = demand
	s.gate.request(&f.slot)
	t.flight, t.state, t.failed = f, InFlight, nil
	s.flights[f] = t
	s.wg.Add(1)
	go s.fly(t, f)
	if demand && s.gate.waiting(&f.slot) {
		s.preemptOneLocked(true)
	}
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
		s.preemptOneLocked(false)
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
	delete(s.unclaimed, t)
	blk := t.res
	t.res, t.state = nil, OnNVMe
	s.gate.release()
	s.stats.Preemptions++
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

// claimLocked records that t's resident copy is in use: it is no longer a
// candidate for preemption.
func (s *Swapper) claimLocked(t *tensor) { delete(s.unclaimed, t) }

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

// swapInBuffer takes the pool buffer for flight f. Before it blocks, it
// evicts CPU-cache entries (their memory is the pool's) and, for a
// waited-for swap-in, preempts an unclaimed prefetched partition.
func (s *Swapper) swapInBuffer(f *flight, size int) (*buffers.Buffer, error) {
	s.mu.Lock()
	f.stage = awaitingBuffer
	s.mu.Unlock()
	if b, ok := s.pool.TryAcquire(size, buffers.PurposeParams); ok {
		return b, nil
	}
	if s.cachedBytes.Load() > 0 && s.shrinkCache(int64(size)) {
		if b, ok := s.pool.TryAcquire(size, buffers.PurposeParams); ok {
			return b, nil
		}
	}
	s.mu.Lock()
	if f.demand {
		s.preemptOneLocked(false)
	}
	s.mu.Unlock()
	return s.pool.Acquire(f.ctx, size, buffers.PurposeParams)
}

// land finishes a flight: blk (one reference, generation gen) becomes t's
// resident copy and keeps the slot, or, when the flight was dropped or is
// stale, goes to the cache and the slot is given back.
func (s *Swapper) land(t *tensor, f *flight, blk *block, gen uint64, slot bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer close(f.done)
	delete(s.flights, f)
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
	if f.demand {
		return // claimed by its waiter
	}
	s.unclaimed[t] = struct{}{}
	if kind := s.starvationLocked(); kind != notStarved {
		// A waited-for swap-in is stuck behind prefetches: this one, which
		// nobody is waiting for, gives way at once.
		s.preemptLocked(t, kind == slotStarved)
	}
}
