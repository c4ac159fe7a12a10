package grad_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper/grad"
)

// TestAccumulatePair: a layer-major step that hands two micro-batches
// over at once (AccumulatePairHold, then AccumulatePair or a last
// Accumulate when k is odd) gives the bits and the sum of squares of k
// Accumulate calls, whole gradients and gradients kept in pieces, in a
// pool that holds every sum and in one that spills; the -0 of a first
// pair of -0s becomes +0, as two calls make it; a pair of unequal
// lengths is refused and adds nothing.
func TestAccumulatePair(t *testing.T) {
	const n = 4099
	names := []string{"w", "b", "c"}
	for _, k := range []int{2, 3, 5} {
		for _, pieces := range []int{0, 1000} {
			for _, pool := range []int64{1 << 20, 64 << 10} {
				t.Run(fmt.Sprintf("k%d/pieces%d/pool%d", k, pieces, pool), func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					o := grad.Options{SumSquares: true, PieceElems: pieces}
					one, _, _ := holdEnvWith(t, 1<<20, o)
					two, _, _ := holdEnvWith(t, pool, o)
					for _, s := range []*grad.Swapper{one, two} {
						for _, nm := range names {
							if err := s.Register(nm, n); err != nil {
								t.Fatal(err)
							}
						}
					}
					g := func(m int, nm string) []float32 {
						v := holdGrads(uint64(100*m+len(nm)), n)
						v[0] = float32(math.Copysign(0, -1)) // -0 + -0 from a fresh sum: +0
						return v
					}
					for m := range k {
						for _, nm := range names {
							if err := one.Accumulate(ctx, nm, g(m, nm)); err != nil {
								t.Fatal(err)
							}
						}
					}
					for m := 0; m < k; m += 2 {
						for _, nm := range names {
							var err error
							switch {
							case m+1 == k:
								err = two.Accumulate(ctx, nm, g(m, nm))
							case m+2 < k:
								err = two.AccumulatePairHold(ctx, nm, g(m, nm), g(m+1, nm))
							default:
								err = two.AccumulatePair(ctx, nm, g(m, nm), g(m+1, nm))
							}
							if err != nil {
								t.Fatal(err)
							}
						}
					}
					if err := two.AccumulatePair(ctx, "w", make([]float32, n), make([]float32, n-1)); err == nil {
						t.Fatal("a pair of unequal lengths was taken")
					}
					if got, want := two.Stats().PairedBytes, int64(k/2*2*len(names)*n*4); got != want {
						t.Errorf("paired bytes %d, want %d (%d pairs of %d gradients)", got, want, k/2, len(names))
					}
					if got := one.Stats().PairedBytes; got != 0 {
						t.Errorf("paired bytes %d without a pair", got)
					}
					for _, s := range []*grad.Swapper{one, two} {
						if err := s.Flush(ctx); err != nil {
							t.Fatal(err)
						}
					}
					for _, nm := range names {
						want, got := make([]float32, n), make([]float32, n)
						if err := one.Read(ctx, nm, want); err != nil {
							t.Fatal(err)
						}
						if err := two.Read(ctx, nm, got); err != nil {
							t.Fatal(err)
						}
						if math.Float32bits(got[0]) != 0 {
							t.Fatalf("%s[0]: %#08x, want +0", nm, math.Float32bits(got[0]))
						}
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s[%d]: in pairs %v, one by one %v", nm, i, got[i], want[i])
							}
						}
						a, err := one.SumSquares(nm)
						if err != nil {
							t.Fatal(err)
						}
						b, err := two.SumSquares(nm)
						if err != nil {
							t.Fatal(err)
						}
						if math.Float64bits(a) != math.Float64bits(b) {
							t.Fatalf("%s: sum of squares %v in pairs, %v one by one", nm, b, a)
						}
					}
				})
			}
		}
	}
}
