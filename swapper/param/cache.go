package param

import (
	"context"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// cacheEntry is a CPU-cache value: one reference on a pinned copy of a
// partition at generation gen. The reference is dropped by OnExit, which
// ristretto calls for every value that leaves the cache (eviction,
// rejection, Del, replacement, Clear, Close).
type cacheEntry struct {
	name string
	blk  *block
	gen  uint64
}

// cacheLocked returns the CPU cache, creating it on first use, when the
// registered tensors are known: ristretto wants about ten counters per item
// it will hold.
func (s *Swapper) cacheLocked() *ristretto.Cache[string, *cacheEntry] {
	if s.cache != nil || s.opts.MaxInCPUBytes == 0 || s.closed {
		return s.cache
	}
	items := int64(0)
	for _, t := range s.tensors {
		if t.tier == swapper.TierNVMe && t.n > 0 {
			items++
		}
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, *cacheEntry]{
		NumCounters:        max(10*items, 100),
		MaxCost:            s.opts.MaxInCPUBytes,
		BufferItems:        64, // ristretto's recommended Get buffer
		IgnoreInternalCost: true,
		OnExit: func(e *cacheEntry) {
			if e != nil {
				s.cachedBytes.Add(-e.blk.bytes)
				e.blk.release()
			}
		},
	})
	if err != nil {
		s.log.Error("param: creating the CPU cache failed; continuing without it", "err", err)
		s.opts.MaxInCPUBytes = 0
		return nil
	}
	s.cache = c
	return c
}

// cachePutLocked hands blk's reference (generation gen) to the CPU cache,
// or drops it when there is no cache, the cache refuses it, or someone
// waits for the pool's memory (poolShortLocked).
func (s *Swapper) cachePutLocked(t *tensor, blk *block, gen uint64) {
	c := s.cacheLocked()
	if c == nil || blk.buf == nil || blk.bytes > s.opts.MaxInCPUBytes || s.opts.CacheKeep != nil && !s.opts.CacheKeep(t.name) || s.poolShortLocked() {
		blk.release()
		return
	}
	if e, ok := c.Get(t.name); ok && e.blk == blk {
		blk.release() // already cached (it was a cache hit)
		return
	}
	s.cachedBytes.Add(blk.bytes)
	if !c.Set(t.name, &cacheEntry{name: t.name, blk: blk, gen: gen}, blk.bytes) {
		// Dropped before admission: OnExit will not run for it.
		s.cachedBytes.Add(-blk.bytes)
		blk.release()
	}
}

// cacheLookup returns a reference on t's current copy from the CPU cache.
func (s *Swapper) cacheLookup(t *tensor) (*block, uint64, bool) {
	s.mu.Lock()
	c, gen := s.cache, t.gen
	s.mu.Unlock()
	if c == nil {
		return nil, 0, false
	}
	e, ok := c.Get(t.name)
	if !ok || e == nil || e.gen != gen || !e.blk.tryRetain() {
		return nil, 0, false
	}
	return e.blk, e.gen, true
}

// shrinkCache evicts cache entries worth at least need bytes (fewer if the
// cache holds less), so a swap-in can have their pool memory. It reports
// whether it evicted anything.
func (s *Swapper) shrinkCache(need int64) bool {
	s.mu.Lock()
	c := s.cache
	s.mu.Unlock()
	if c == nil {
		return false
	}
	// A Set is applied by ristretto's goroutine later: until then the
	// entry holds its buffer (cachedBytes counts it) but IterValues does
	// not see it, and an eviction that missed it could leave a waiter
	// with nothing that would ever release the memory.
	c.Wait()
	var names []string
	freed := int64(0)
	c.IterValues(func(e *cacheEntry) bool {
		if e == nil {
			return false
		}
		names = append(names, e.name)
		freed += e.blk.bytes
		return freed >= need
	})
	for _, n := range names {
		c.Del(n)
	}
	return len(names) > 0
}

// acquireBuffer takes a pool buffer for staging an update. When the pool is
// dry it first evicts CPU-cache entries (their memory is the pool's),
// prefetched partitions nobody claimed yet and smaller ones a Wait in
// progress holds unclaimed (preemptForLocked), then waits; while it waits,
// such smaller partitions that land give way too (land). They must: a
// staged update's buffer needs a free aligned block (buffers.SpanBytes),
// and small partitions scattered over the region could deny it one while
// nothing else would release them. Prefetched ones are claimed by the
// next pass, which waits for the step that stages; a Wait's by its Wait,
// which returns only when its last partition is placed, and the pool
// serves that one only after the staged update queued before it (a step
// overlapping the backward pass stages layer l while BeginLayer(l-1)
// waits: TestStageBehindPendingWait).
func (s *Swapper) acquireBuffer(ctx context.Context, size int, purpose buffers.Purpose) (*buffers.Buffer, error) {
	if b, ok := s.pool.TryAcquire(size, purpose); ok {
		return b, nil
	}
	// While it waits, nothing new goes to the cache or stays prefetched
	// (poolShortLocked); counted before the cache is shrunk, so that an
	// entry put meanwhile is seen by the shrink.
	params := purpose == buffers.PurposeParams
	s.mu.Lock()
	s.stageWaiters++
	if params {
		s.stageSizes[size]++
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.stageWaiters--
		if params {
			if s.stageSizes[size]--; s.stageSizes[size] == 0 {
				delete(s.stageSizes, size)
			}
		}
		s.mu.Unlock()
	}()
	// Freed bytes are not always a block the pool can hand out (see
	// buffers.SpanBytes): evict until it can, or the cache is empty.
	for s.cachedBytes.Load() > 0 && s.shrinkCache(int64(size)) {
		if b, ok := s.pool.TryAcquire(size, purpose); ok {
			return b, nil
		}
	}
	if params {
		s.mu.Lock()
		for s.preemptForLocked(size) {
			s.mu.Unlock()
			if b, ok := s.pool.TryAcquire(size, purpose); ok {
				return b, nil
			}
			s.mu.Lock()
		}
		s.mu.Unlock()
	}
	return s.pool.Acquire(ctx, size, purpose)
}

// SettleCache waits until the CPU cache has applied every put so far (the
// cache takes them asynchronously): a lookup after it finds what was put.
func (s *Swapper) SettleCache() {
	s.mu.Lock()
	c := s.cache
	s.mu.Unlock()
	if c != nil {
		c.Wait()
	}
}
