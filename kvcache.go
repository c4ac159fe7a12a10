package zinf

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
)

// KVCache is a generation's attention key/value cache on the tier its
// plan chose: one entry of at most LayerBytes per layer, which the loop
// makes available with Begin (in the order of use: the nvme tier reads
// the next entry back while the loop works on this one) and hands back
// with End (the nvme tier writes it behind). An entry never written reads
// as zeros. For one loop goroutine.
type KVCache struct {
	plan  plan.KVCache
	rt    *Runtime
	bufs  [][]byte          // memory and cpu: each layer's bytes
	pool  *buffers.Pool     // cpu and nvme
	held  []*buffers.Buffer // acquired from pool
	store *swapper.Store    // nvme
	slots []*kvSlot         // nvme
	lens  []int             // nvme: the bytes last written of each layer (0: never)
	inUse int               // the layer begun, -1 when none

	mu     sync.Mutex
	stats  KVCacheStats
	closed bool
}

// KVCacheStats counts a KV cache's traffic with NVMe.
type KVCacheStats struct {
	BytesRead, BytesWritten int64
	Reads, Writes           int64
	// Prefetched counts entries read back ahead of their Begin.
	Prefetched int64
}

type kvSlot struct {
	buf     []byte
	layer   int // whose bytes it holds, -1 none
	pend    *swapper.Pending
	writing bool
	used    bool
}

// OpenKVCache plans (plan.ForKVCache) and opens a KV cache of layers entries
// of layerBytes each. Close it before the runtime.
func (r *Runtime) OpenKVCache(layers int, layerBytes int64) (c *KVCache, err error) {
	if err := r.closedErr("open KV cache", nil); err != nil {
		return nil, err
	}
	p, err := plan.ForKVCache(r.Config, layers, layerBytes)
	if err != nil {
		return nil, err
	}
	// The cache's memory (the Go heap, or pinned memory of its own beside
	// zinf.tiers.cpu_pinned_bytes) is taken whole here: refuse what this
	// process cannot take (MemAvailable, the cgroup, ulimit -v; the pool is
	// already mapped, so it is counted) instead of dying out of memory.
	if need := p.MemoryBytes + p.PinnedBytes; need > 0 {
		if lim, ok := memlimit.Available(); ok && need > lim.Bytes {
			return nil, fmt.Errorf("zinf: the KV cache on %s needs %s of memory (%d layers x %s), more than the %s this process may still take (%s): set zinf.kv_cache.device nvme (or auto with zinf.kv_cache.bytes below the cache), or lower the batch or the sequence length: %w",
				p.Device, config.Size(need), layers, config.Size(layerBytes), config.Size(lim.Bytes), lim.What, buffers.ErrMemory)
		}
	}
	c = &KVCache{plan: p, rt: r, inUse: -1}
	// The error returns below set c to nil: close what was built through
	// a copy.
	built := c
	defer func() {
		if err != nil {
			built.Close()
			c = nil
		}
	}()
	switch p.Device {
	case config.KVCacheMemory:
		c.bufs = make([][]byte, layers)
		for l := range c.bufs {
			c.bufs[l] = make([]byte, layerBytes)
		}
	case config.KVCacheCPU:
		if c.pool, err = buffers.NewPool(buffers.Options{CapacityBytes: p.PinnedBytes, MinBufferBytes: int(plan.GranuleBytes()), Logger: r.log}); err != nil {
			return nil, fmt.Errorf("zinf: KV cache pinned memory (%s): %w", config.Size(p.PinnedBytes), err)
		}
		c.bufs = make([][]byte, layers)
		for l := range c.bufs {
			b, ok := c.pool.TryAcquire(int(layerBytes), buffers.PurposeStaging)
			if !ok {
				return nil, fmt.Errorf("zinf: KV cache: layer %d's %d bytes do not fit the %s planned", l, layerBytes, config.Size(p.PinnedBytes))
			}
			c.held = append(c.held, b)
			c.bufs[l] = b.Bytes()
			clear(c.bufs[l])
		}
	case config.KVCacheNVMe:
		o := plan.StoreOptions(r.Config, r.Config.NVMePaths())
		o.Engine, o.Name, o.Logger = r.Engine, fmt.Sprintf("kv-rank%d", r.Rank), r.log
		if c.store, err = swapper.OpenStore(o); err != nil {
			return nil, fmt.Errorf("zinf: KV cache swap store: %w", err)
		}
		// Every layer's entry is written, copy-on-write, into swap files
		// beside the runtime's: refuse now what the disk cannot hold,
		// instead of failing with ENOSPC in the middle of decoding.
		sizes := make([]int64, layers)
		for l := range sizes {
			sizes[l] = layerBytes
		}
		needs := c.store.SpaceNeeds(sizes, swapper.CopyOnWriteVersions)
		if r.storeNeeds != nil {
			needs = append(r.storeNeeds(), needs...)
		}
		if err := swapper.CheckSpace(needs...); err != nil {
			return nil, fmt.Errorf("zinf: not enough free disk for the KV cache on nvme (%d layers x %s = %s, %s of swap files with copy-on-write, beside the runtime's own): lower the batch or the sequence length, or give zinf.nvme_paths more space: %w",
				layers, config.Size(layerBytes), config.Size(p.CacheBytes), config.Size(c.store.DiskBytes(sizes, swapper.CopyOnWriteVersions)), err)
		}
		granule := int(plan.GranuleBytes(c.store))
		slot := buffers.SpanBytes(c.store.PaddedLen(layerBytes), granule)
		n := plan.KVCacheSlots(layers)
		if c.pool, err = buffers.NewPool(buffers.Options{CapacityBytes: int64(n) * slot, MinBufferBytes: granule, Logger: r.log}); err != nil {
			return nil, fmt.Errorf("zinf: KV cache pinned staging (%s): %w", config.Size(int64(n)*slot), err)
		}
		for range n {
			b, ok := c.pool.TryAcquire(int(layerBytes), buffers.PurposeStaging)
			if !ok {
				return nil, fmt.Errorf("zinf: KV cache: a staging buffer of %d bytes does not fit", layerBytes)
			}
			c.held = append(c.held, b)
			c.slots = append(c.slots, &kvSlot{buf: b.Bytes(), layer: -1})
		}
		c.lens = make([]int, layers)
	}
	return c, nil
}

// Plan is the cache's plan.
func (c *KVCache) Plan() plan.KVCache { return c.plan }

// Stats are the cache's NVMe counters.
func (c *KVCache) Stats() KVCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

func (c *KVCache) name(l int) string { return fmt.Sprintf("kv%d", l) }

// Begin makes layer l's entry readable and writable: LayerBytes bytes,
// valid until End(l). On nvme it waits for the entry's read (started ahead
// by the Begin before, or now) and starts reading the next layer's.
func (c *KVCache) Begin(ctx context.Context, l int) ([]byte, error) {
	if c.closed {
		return nil, errors.New("zinf: KV cache: closed")
	}
	if l < 0 || l >= c.plan.Layers {
		return nil, fmt.Errorf("zinf: KV cache: layer %d (the cache has layers 0..%d)", l, c.plan.Layers-1)
	}
	if c.inUse >= 0 {
		return nil, fmt.Errorf("zinf: KV cache: Begin(%d) while layer %d is begun (call End first)", l, c.inUse)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c.store == nil {
		c.inUse = l
		return c.bufs[l][:c.plan.LayerBytes], nil
	}
	s := c.slotOf(l)
	if s != nil {
		// Read ahead, or still being written behind (its bytes are the
		// entry's newest): wait for the transfer.
		if err := c.wait(s); err != nil {
			return nil, err
		}
	} else {
		var err error
		if s, err = c.free(); err != nil {
			return nil, err
		}
		if n := c.lens[l]; n > 0 {
			if err := c.read(s, l); err != nil {
				return nil, err
			}
			if err := c.wait(s); err != nil {
				return nil, err
			}
		} else {
			clear(s.buf[:c.plan.LayerBytes])
			s.layer = l
		}
	}
	s.used = true
	c.inUse = l
	// Read the next layer back while this one is used.
	if next := (l + 1) % c.plan.Layers; next != l && c.lens[next] > 0 && c.slotOf(next) == nil {
		if ns, err := c.free(); err == nil {
			if err := c.read(ns, next); err != nil {
				return nil, err
			}
			c.mu.Lock()
			c.stats.Prefetched++
			c.mu.Unlock()
		}
	}
	return s.buf[:c.plan.LayerBytes], nil
}

// End hands layer l's entry back; its first used bytes are what the layer
// wrote (the rest need not be kept). On nvme they are written behind.
func (c *KVCache) End(l, used int) error {
	if c.inUse != l {
		return fmt.Errorf("zinf: KV cache: End(%d) but layer %d is begun", l, c.inUse)
	}
	if used < 0 || int64(used) > c.plan.LayerBytes {
		return fmt.Errorf("zinf: KV cache: End(%d): %d bytes used of %d", l, used, c.plan.LayerBytes)
	}
	c.inUse = -1
	if c.store == nil {
		return nil
	}
	s := c.slotOf(l)
	s.used = false
	if used == 0 {
		return nil
	}
	p, err := c.store.WriteAsync(c.name(l), s.buf[:used])
	if err != nil {
		s.layer = -1
		return fmt.Errorf("zinf: KV cache: writing layer %d: %w", l, err)
	}
	s.pend, s.writing = p, true
	c.lens[l] = used
	c.mu.Lock()
	c.stats.Writes++
	c.stats.BytesWritten += int64(used)
	c.mu.Unlock()
	return nil
}

func (c *KVCache) slotOf(l int) *kvSlot {
	for _, s := range c.slots {
		if s.layer == l {
			return s
		}
	}
	return nil
}

func (c *KVCache) read(s *kvSlot, l int) error {
	n := c.lens[l]
	p, err := c.store.ReadAsync(c.name(l), s.buf[:n])
	if err != nil {
		return fmt.Errorf("zinf: KV cache: reading layer %d: %w", l, err)
	}
	s.layer, s.pend, s.writing = l, p, false
	c.mu.Lock()
	c.stats.Reads++
	c.stats.BytesRead += int64(n)
	c.mu.Unlock()
	return nil
}

// wait completes s's transfer; a failed one leaves the slot empty.
func (c *KVCache) wait(s *kvSlot) error {
	if s.pend == nil {
		return nil
	}
	err := s.pend.Wait()
	s.pend = nil
	if err != nil {
		what := "reading"
		if s.writing {
			what = "writing"
			c.lens[s.layer] = 0 // the entry is lost: the store keeps the previous version, which is stale
		}
		l := s.layer
		s.layer, s.writing = -1, false
		return fmt.Errorf("zinf: KV cache: %s layer %d: %w", what, l, err)
	}
	s.writing = false
	return nil
}

// free returns a slot to use, finishing the transfer it had in flight.
func (c *KVCache) free() (*kvSlot, error) {
	var pick *kvSlot
	rank := 9
	for _, s := range c.slots {
		if s.used {
			continue
		}
		r := 3 // a read ahead in flight
		switch {
		case s.layer < 0:
			r = 0
		case s.pend == nil:
			r = 1 // holds a finished transfer
		case s.writing:
			r = 2
		}
		if r < rank {
			pick, rank = s, r
		}
	}
	if pick == nil {
		return nil, errors.New("zinf: KV cache: no free staging buffer")
	}
	if err := c.wait(pick); err != nil {
		return nil, err
	}
	pick.layer = -1
	return pick, nil
}

// Close waits for the writes in flight, frees the pinned memory and
// removes the swap files. It returns the first error met.
func (c *KVCache) Close() error {
	if c == nil || c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, s := range c.slots {
		if err := c.wait(s); err != nil {
			errs = append(errs, err)
		}
	}
	for _, b := range c.held {
		b.Release()
	}
	c.held = nil
	if c.store != nil {
		errs = append(errs, c.store.Close())
	}
	if c.pool != nil {
		errs = append(errs, c.pool.Close())
	}
	c.bufs = nil
	return errors.Join(errs...)
}
