package buffers

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// checkInvariants verifies the allocator's structure: every free block is
// aligned, in bounds, on the list of its order and disjoint from the others;
// no two free buddies are left unmerged; the free count adds up.
func (b *buddy) checkInvariants() error {
	seen := make([]bool, b.nUnits)
	var free int64
	heads := 0
	for k, h := range b.heads {
		prev := noUnit
		for u := h; u != noUnit; u = b.next[u] {
			size := int32(1) << k
			if b.order[u] != int8(k) {
				return fmt.Errorf("block %d on list %d has order tag %d", u, k, b.order[u])
			}
			if b.prev[u] != prev {
				return fmt.Errorf("block %d: prev %d, want %d", u, b.prev[u], prev)
			}
			if u%size != 0 || u+size > b.nUnits {
				return fmt.Errorf("block %d order %d misaligned or out of %d", u, k, b.nUnits)
			}
			for i := u; i < u+size; i++ {
				if seen[i] {
					return fmt.Errorf("granule %d on two free blocks", i)
				}
				seen[i] = true
			}
			if bu := u ^ size; bu+size <= b.nUnits && b.order[bu] == int8(k) {
				return fmt.Errorf("free buddies %d and %d of order %d not merged", u, bu, k)
			}
			free += int64(size)
			heads++
			prev = u
		}
	}
	tags := 0
	for _, o := range b.order {
		if o >= 0 {
			tags++
		}
	}
	if tags != heads {
		return fmt.Errorf("%d order tags for %d free blocks", tags, heads)
	}
	if free != b.freeUnits {
		return fmt.Errorf("free lists hold %d granules, freeUnits says %d", free, b.freeUnits)
	}
	return nil
}

// hasFreeWindow reports whether live (true = in use) has an aligned, fully
// free window of 2^k granules: exactly when a buddy allocator that merges
// eagerly must be able to allocate 2^k.
func hasFreeWindow(live []bool, k int) bool {
	size := 1 << k
	for start := 0; start+size <= len(live); start += size {
		ok := true
		for i := start; i < start+size; i++ {
			if live[i] {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestBuddyRandomized runs random alloc/free mixes against a plain bitmap
// model: allocations never overlap, succeed exactly when an aligned free
// window exists, and freeing everything restores the initial state.
func TestBuddyRandomized(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	for round := range 40 {
		nUnits := int32(1 + r.IntN(200))
		if round%4 == 0 {
			nUnits = int32(1) << r.IntN(8)
		}
		b := newBuddy(nUnits)
		fresh := newBuddy(nUnits)
		live := make([]bool, nUnits)
		type run struct{ u, n int32 }
		var runs []run
		for op := range 400 {
			if len(runs) > 0 && r.IntN(5) < 2 {
				i := r.IntN(len(runs))
				x := runs[i]
				runs[i] = runs[len(runs)-1]
				runs = runs[:len(runs)-1]
				b.release(x.u, x.n)
				for j := x.u; j < x.u+x.n; j++ {
					live[j] = false
				}
			} else {
				n := int32(1 + r.IntN(int(nUnits)))
				if r.IntN(3) > 0 {
					n = int32(1 + r.IntN(min(int(nUnits), 8)))
				}
				if !b.fits(n) {
					continue
				}
				want := hasFreeWindow(live, ceilOrder(n))
				if got := b.canAlloc(n); got != want {
					t.Fatalf("seed %d round %d op %d: canAlloc(%d) = %v, model says %v", seed, round, op, n, got, want)
				}
				u, ok := b.alloc(n)
				if ok != want {
					t.Fatalf("seed %d round %d op %d: alloc(%d) ok=%v, model says %v", seed, round, op, n, ok, want)
				}
				if ok {
					for j := u; j < u+n; j++ {
						if live[j] {
							t.Fatalf("seed %d: alloc(%d) = %d overlaps a live run at %d", seed, n, u, j)
						}
						live[j] = true
					}
					runs = append(runs, run{u, n})
				}
			}
			if err := b.checkInvariants(); err != nil {
				t.Fatalf("seed %d round %d op %d: %v", seed, round, op, err)
			}
		}
		for _, x := range runs {
			b.release(x.u, x.n)
		}
		if err := b.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		for k := range b.heads {
			if b.heads[k] != fresh.heads[k] {
				t.Fatalf("seed %d: after freeing all, order %d list starts at %d, fresh at %d", seed, k, b.heads[k], fresh.heads[k])
			}
		}
		if b.freeUnits != int64(nUnits) {
			t.Fatalf("freeUnits %d after freeing all of %d", b.freeUnits, nUnits)
		}
	}
}

func TestBuddyTailTrimAndMaxOrder(t *testing.T) {
	b := newBuddy(6) // blocks [0,4) and [4,6)
	if b.maxOrder != 2 || b.fits(5) || !b.fits(4) {
		t.Fatalf("maxOrder %d fits(5)=%v fits(4)=%v", b.maxOrder, b.fits(5), b.fits(4))
	}
	u, ok := b.alloc(3) // takes [0,3), gives [3,4) back
	if !ok || u != 0 || b.freeUnits != 3 {
		t.Fatalf("alloc(3) = %d, %v, free %d", u, ok, b.freeUnits)
	}
	if v, ok := b.alloc(1); !ok || v != 3 {
		t.Fatalf("the trimmed tail should serve the next 1-granule request first: got %d, %v", v, ok)
	}
	if err := b.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}
