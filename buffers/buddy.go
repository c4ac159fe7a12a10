package buffers

import "math/bits"

// buddy is a binary buddy allocator over nUnits granules. It hands out
// contiguous runs of granules; a run of n granules is carved from a free
// block of 2^ceil(log2 n) granules whose unused tail is returned at once, so
// a buffer wastes less than one granule (not up to half its size, as a plain
// buddy allocator would). Freeing a run splits it into aligned power-of-two
// blocks and merges each with its buddy while the buddy is free, so once
// every buffer is released the arena is whole again: fragmentation is never
// permanent.
//
// Free blocks of each order sit on an intrusive doubly linked list threaded
// through next/prev, indexed by the block's first granule; order[u] is the
// order of the free block starting at u, or -1. All operations are O(log
// nUnits) and allocation free. buddy is not safe for concurrent use.
type buddy struct {
	nUnits    int32
	maxOrder  int     // largest order a block can have: 2^maxOrder <= nUnits
	heads     []int32 // per order: first free block, or -1
	next      []int32
	prev      []int32
	order     []int8
	freeUnits int64
}

const noUnit int32 = -1

func newBuddy(nUnits int32) *buddy {
	b := &buddy{
		nUnits:   nUnits,
		maxOrder: bits.Len32(uint32(nUnits)) - 1,
		next:     make([]int32, nUnits),
		prev:     make([]int32, nUnits),
		order:    make([]int8, nUnits),
	}
	b.heads = make([]int32, b.maxOrder+1)
	for i := range b.heads {
		b.heads[i] = noUnit
	}
	for i := range b.order {
		b.order[i] = -1
	}
	b.freeRange(0, nUnits)
	b.freeUnits = int64(nUnits)
	return b
}

// ceilOrder returns the order of the smallest block that holds n granules.
func ceilOrder(n int32) int { return bits.Len32(uint32(n - 1)) }

// fits reports whether a run of n granules can ever be allocated.
func (b *buddy) fits(n int32) bool { return n >= 1 && ceilOrder(n) <= b.maxOrder }

func (b *buddy) push(u int32, k int) {
	b.order[u] = int8(k)
	b.prev[u] = noUnit
	h := b.heads[k]
	b.next[u] = h
	if h != noUnit {
		b.prev[h] = u
	}
	b.heads[k] = u
}

func (b *buddy) remove(u int32, k int) {
	p, n := b.prev[u], b.next[u]
	if p != noUnit {
		b.next[p] = n
	} else {
		b.heads[k] = n
	}
	if n != noUnit {
		b.prev[n] = p
	}
	b.order[u] = -1
}

// freeBlock returns the aligned block [u, u+2^k) and merges it upward.
func (b *buddy) freeBlock(u int32, k int) {
	for k < b.maxOrder {
		size := int32(1) << k
		bu := u ^ size
		// The buddy must lie inside the arena (its end can pass nUnits when
		// the arena is not a power of two) and be free at the same order.
		if bu+size > b.nUnits || b.order[bu] != int8(k) {
			break
		}
		b.remove(bu, k)
		u = min(u, bu)
		k++
	}
	b.push(u, k)
}

// freeRange returns [lo, hi) as the largest aligned blocks that tile it.
func (b *buddy) freeRange(lo, hi int32) {
	for lo < hi {
		k := bits.Len32(uint32(hi-lo)) - 1 // largest block that fits
		if lo != 0 {
			k = min(k, bits.TrailingZeros32(uint32(lo))) // and is aligned
		}
		b.freeBlock(lo, k)
		lo += int32(1) << k
	}
}

// canAlloc reports whether alloc(n) would succeed now.
func (b *buddy) canAlloc(n int32) bool {
	for k := ceilOrder(n); k <= b.maxOrder; k++ {
		if b.heads[k] != noUnit {
			return true
		}
	}
	return false
}

// alloc takes a run of n granules and returns its first granule.
func (b *buddy) alloc(n int32) (int32, bool) {
	k := ceilOrder(n)
	j := k
	for j <= b.maxOrder && b.heads[j] == noUnit {
		j++
	}
	if j > b.maxOrder {
		return noUnit, false
	}
	u := b.heads[j]
	b.remove(u, j)
	for j > k { // split, keeping the lower half
		j--
		b.push(u+int32(1)<<j, j)
	}
	if end := u + int32(1)<<k; u+n < end {
		b.freeRange(u+n, end) // give back the unused tail
	}
	b.freeUnits -= int64(n)
	return u, true
}

// release returns the run [u, u+n) taken by alloc.
func (b *buddy) release(u, n int32) {
	b.freeRange(u, u+n)
	b.freeUnits += int64(n)
}

// largestFree returns the size in granules of the largest free block.
func (b *buddy) largestFree() int64 {
	for k := b.maxOrder; k >= 0; k-- {
		if b.heads[k] != noUnit {
			return int64(1) << k
		}
	}
	return 0
}
