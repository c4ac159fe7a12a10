package zinf

import (
	"context"
	"fmt"
	"sort"

	"github.com/zinfio/zinf/swapper/param"
)

// WarmCache reads, on an inference runtime, every NVMe parameter its CPU
// cache keeps for good (CacheKeeps) into that cache now, one at a time,
// the largest first, instead of letting the first pass fill it.
//
// Why: the pinned pool hands out power-of-two spans. A first pass that
// reads a layer's kept and streamed weights together leaves the kept ones
// scattered over the pool, between the holes its streamed ones leave,
// and a later layer's large weight may then find no free span: the pass
// waits on the pool, and a weight released while it waits is not cached
// (it would take memory the wait needs), so it is read again by every
// pass. Read alone and largest first, the kept weights pack at one end
// and the passes' buffers find whole spans in the rest.
//
// It returns the bytes read. Call it after every kept parameter has its
// values (Init or InitInPlace) and before the first pass; a training
// runtime, or one without a kept set, reads nothing.
func (r *Runtime) WarmCache(ctx context.Context) (int64, error) {
	if err := r.closedErr("warm the cache", param.ErrClosed); err != nil {
		return 0, err
	}
	var ks []warmKept
	for name := range r.cacheSet {
		n, err := r.Params.PartitionLen(name)
		if err != nil {
			return 0, fmt.Errorf("zinf: warm the cache: %w", err)
		}
		ks = append(ks, warmKept{name, n * r.DType.Size()})
	}
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].bytes != ks[j].bytes {
			return ks[i].bytes > ks[j].bytes
		}
		return ks[i].name < ks[j].name
	})
	before := r.Params.Stats().BytesRead
	// A few reads in flight keep the disk busy; they are asked for in the
	// order they are placed.
	const ahead = 4
	next := 0 // the first not yet asked for
	for i, k := range ks {
		for ; next < min(i+ahead, len(ks)); next++ {
			if err := r.Params.Prefetch(ks[next].name); err != nil {
				r.releaseWarm(ks[i:next])
				return r.Params.Stats().BytesRead - before, fmt.Errorf("zinf: warm the cache: %q: %w", ks[next].name, err)
			}
		}
		if err := r.Params.Wait(ctx, k.name); err != nil {
			r.releaseWarm(ks[i:next]) // the reads still in flight are given up
			return r.Params.Stats().BytesRead - before, fmt.Errorf("zinf: warm the cache: %q: %w", k.name, err)
		}
		r.Params.Release(k.name)
	}
	r.Params.SettleCache()
	return r.Params.Stats().BytesRead - before, nil
}

// warmKept is a kept parameter and its partition's bytes.
type warmKept struct {
	name  string
	bytes int
}

// releaseWarm gives up the warm-up's reads of ks.
func (r *Runtime) releaseWarm(ks []warmKept) {
	for _, k := range ks {
		r.Params.Release(k.name)
	}
}
