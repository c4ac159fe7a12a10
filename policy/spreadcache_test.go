package policy_test

import (
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/policy"
)

// TestSpreadCache: the tensors a cache keeps are within its budget, take
// all when the budget holds all, none without a budget, and are spread
// over the pass: at every point of the walk the bytes kept stay within one
// tensor of the budget's share of the bytes walked (caching the first-used
// tensors would be a whole budget ahead at the start and behind after).
func TestSpreadCache(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 1 + r.IntN(300)
		sizes := make([]int64, n)
		var total, largest int64
		for i := range sizes {
			// A layer's shape: a few small tensors and large ones.
			switch r.IntN(4) {
			case 0:
				sizes[i] = 1 + r.Int64N(4<<10)
			case 1:
				sizes[i] = 0 // nothing to cache (a streamed tensor)
			default:
				sizes[i] = 1<<20 + r.Int64N(64<<20)
			}
			total += sizes[i]
			largest = max(largest, sizes[i])
		}
		budget := r.Int64N(total + total/4 + 1)
		keep := policy.SpreadCache(sizes, budget)
		if len(keep) != n {
			t.Fatalf("trial %d: %d answers for %d tensors", trial, len(keep), n)
		}
		share := min(float64(budget)/float64(max(total, 1)), 1)
		var walked, kept int64
		for i, k := range keep {
			if k && sizes[i] <= 0 {
				t.Fatalf("trial %d: tensor %d of %d bytes kept", trial, i, sizes[i])
			}
			walked += sizes[i]
			if k {
				kept += sizes[i]
			}
			if d := float64(kept) - share*float64(walked); d > float64(largest) || d < -float64(largest) {
				t.Fatalf("trial %d: after %d tensors %d bytes kept, the budget's share of %d walked is %.0f: off by more than the largest tensor (%d)",
					trial, i+1, kept, walked, share*float64(walked), largest)
			}
		}
		if kept > budget {
			t.Fatalf("trial %d: %d bytes kept over a budget of %d", trial, kept, budget)
		}
		if budget >= total {
			for i, k := range keep {
				if !k && sizes[i] > 0 {
					t.Fatalf("trial %d: budget %d holds all %d bytes, tensor %d left out", trial, budget, total, i)
				}
			}
		}
		// Nearly the whole budget is used: what is left is less than a
		// large tensor's bytes over the share.
		if short := float64(min(budget, total) - kept); short > 2*float64(largest) {
			t.Fatalf("trial %d: %d of a %d budget kept (total %d)", trial, kept, budget, total)
		}
	}
	if k := policy.SpreadCache([]int64{10, 20}, 0); k[0] || k[1] {
		t.Fatalf("budget 0 keeps %v", k)
	}
	if k := policy.SpreadCache(nil, 100); len(k) != 0 {
		t.Fatalf("no tensors: %v", k)
	}
	// 10 equal layers, half the budget: every other one, not the first five.
	eq := make([]int64, 10)
	for i := range eq {
		eq[i] = 100
	}
	got := policy.SpreadCache(eq, 500)
	for i, k := range got {
		if k != (i%2 == 0) {
			t.Fatalf("10 equal tensors, half cached: %v (want every other one)", got)
		}
	}
}
