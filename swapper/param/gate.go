package param

import (
	"context"
	"slices"
	"sync"
)

// gate bounds the NVMe partitions swapped in (resident or in flight) at
// once: Options.BufferCount. A swap-in takes a slot before it takes a pool
// buffer and keeps it while the partition is resident. Waiters are served in
// arrival order, demand fetches (someone is blocked in Wait on them) before
// prefetches: a demand miss jumps the queue. golang.org/x/sync/semaphore is
// FIFO without priorities, hence this small gate.
type gate struct {
	mu       sync.Mutex
	limit    int // 0: unbounded (only the pool bounds swap-ins)
	used     int
	demand   []*slotReq
	prefetch []*slotReq
}

// slotReq is one swap-in's claim on a slot. demand, queued and granted are
// guarded by gate.mu.
type slotReq struct {
	ready   chan struct{}
	demand  bool
	queued  bool
	granted bool
}

// request asks for a slot for r without blocking: granted at once when
// one is free and nobody with the same or higher priority is queued, else
// queued in arrival order. r.ready is closed when it is granted.
func (g *gate) request(r *slotReq) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r.ready = make(chan struct{})
	if g.limit == 0 || (g.used < g.limit && len(g.demand) == 0 && (r.demand || len(g.prefetch) == 0)) {
		g.used++
		r.granted = true
		close(r.ready)
		return
	}
	r.queued = true
	if r.demand {
		g.demand = append(g.demand, r)
	} else {
		g.prefetch = append(g.prefetch, r)
	}
}

// await waits until r is granted. On a context error r holds nothing: a
// slot granted meanwhile is passed on.
func (g *gate) await(ctx context.Context, r *slotReq) error {
	select {
	case <-r.ready:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.granted {
		r.granted = false
		g.used--
		g.grantLocked()
	} else {
		g.removeLocked(r)
	}
	return ctx.Err()
}

// waiting reports whether r is queued (requested, not granted).
func (g *gate) waiting(r *slotReq) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return r.queued
}

// promote makes r a demand request, moving it ahead of queued prefetches.
func (g *gate) promote(r *slotReq) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.demand {
		return
	}
	r.demand = true
	if r.queued && !r.granted {
		g.removeLocked(r)
		r.queued = true
		g.demand = append(g.demand, r)
	}
}

// release gives a slot back.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.used--
	if g.used < 0 {
		panic("param: gate released more slots than taken") // broken invariant
	}
	g.grantLocked()
}

func (g *gate) grantLocked() {
	for g.limit == 0 || g.used < g.limit {
		var r *slotReq
		switch {
		case len(g.demand) > 0:
			r, g.demand = g.demand[0], g.demand[1:]
		case len(g.prefetch) > 0:
			r, g.prefetch = g.prefetch[0], g.prefetch[1:]
		default:
			return
		}
		r.queued = false
		r.granted = true
		g.used++
		close(r.ready)
	}
}

func (g *gate) removeLocked(r *slotReq) {
	r.queued = false
	if i := slices.Index(g.demand, r); i >= 0 {
		g.demand = slices.Delete(g.demand, i, i+1)
	}
	if i := slices.Index(g.prefetch, r); i >= 0 {
		g.prefetch = slices.Delete(g.prefetch, i, i+1)
	}
}

// inUse returns the slots held.
func (g *gate) inUse() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used
}
