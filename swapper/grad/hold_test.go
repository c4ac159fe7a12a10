package grad_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
)

// holdEnv is a pool of poolBytes, a posix engine with a fault injector,
// a store and a gradient swapper over them, closed at the end of t.
func holdEnv(t *testing.T, poolBytes int64) (*grad.Swapper, *swapper.Store, *faults.Injector) {
	t.Helper()
	return holdEnvWith(t, poolBytes, grad.Options{SumSquares: true})
}

// holdEnvWith is holdEnv with the swapper's options o (Store, Pool and
// Logger filled in).
func holdEnvWith(t *testing.T, poolBytes int64, o grad.Options) (*grad.Swapper, *swapper.Store, *faults.Injector) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: poolBytes, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inj := faults.New(3)
	eng, err := aio.New(aio.Options{Backend: aio.BackendPosix, Faults: inj, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	store, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: "holdtest", Checksums: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	o.Store, o.Pool, o.Logger = store, pool, quiet
	s, err := grad.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		store.Close()
		eng.Close()
		if n := pool.Stats().Outstanding; n != 0 {
			t.Errorf("%d pool buffers outstanding after Close", n)
		}
		pool.Close()
	})
	return s, store, inj
}

func holdGrads(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 9))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-4)))
	}
	return g
}

// TestAccumulateHold sums k micro-batch gradients of every tensor of a
// "layer" in pinned memory (k-1 AccumulateHold, then Accumulate: the
// layer-major order) and compares with the micro-batch-major order (k
// Accumulate calls, each written behind and read back): the same bits,
// the same sum of squares, and one write per gradient instead of k, no
// read-modify-write. A pool too small to hold the layer's sums spills
// them (written, read back) and still gives the same bits.
func TestAccumulateHold(t *testing.T) {
	const n = 4099
	names := []string{"w", "b", "c"}
	for _, k := range []int{1, 3, 8} {
		for _, pool := range []int64{1 << 20, 64 << 10} {
			t.Run(fmt.Sprintf("k%d/pool%d", k, pool), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				mb, _, _ := holdEnv(t, 1<<20)
				lm, _, _ := holdEnv(t, pool)
				for _, s := range []*grad.Swapper{mb, lm} {
					for _, nm := range names {
						if err := s.Register(nm, n); err != nil {
							t.Fatal(err)
						}
					}
				}
				g := func(m int, nm string) []float32 { return holdGrads(uint64(100*m+len(nm)), n) }
				// Micro-batch-major: micro-batch by micro-batch.
				for m := range k {
					for _, nm := range names {
						if err := mb.Accumulate(ctx, nm, g(m, nm)); err != nil {
							t.Fatal(err)
						}
					}
				}
				// Layer-major: every micro-batch of the layer, each tensor's
				// last one written behind.
				for m := range k {
					for _, nm := range names {
						var err error
						if m < k-1 {
							err = lm.AccumulateHold(ctx, nm, g(m, nm))
						} else {
							err = lm.Accumulate(ctx, nm, g(m, nm))
						}
						if err != nil {
							t.Fatal(err)
						}
					}
				}
				for _, s := range []*grad.Swapper{mb, lm} {
					if err := s.Flush(ctx); err != nil {
						t.Fatal(err)
					}
				}
				for _, nm := range names {
					want, got := make([]float32, n), make([]float32, n)
					if err := mb.Read(ctx, nm, want); err != nil {
						t.Fatal(err)
					}
					if err := lm.Read(ctx, nm, got); err != nil {
						t.Fatal(err)
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s[%d]: layer-major %v, micro-batch-major %v", nm, i, got[i], want[i])
						}
					}
					a, _ := mb.SumSquares(nm)
					b, _ := lm.SumSquares(nm)
					if math.Float64bits(a) != math.Float64bits(b) {
						t.Fatalf("%s: sum of squares %v, micro-batch-major %v", nm, b, a)
					}
				}
				ms, ls := mb.Stats(), lm.Stats()
				if ms.Writes != int64(k*len(names)) || ms.Reads < int64((k-1)*len(names)) {
					t.Errorf("micro-batch-major: %d writes, %d reads for k=%d", ms.Writes, ms.Reads, k)
				}
				if pool >= 1<<20 && (ls.Writes != int64(len(names)) || ls.Reads != int64(len(names))) {
					// The reads are the checks above.
					t.Errorf("layer-major: %d writes, %d reads (want %d each: one write per gradient, the test's read)", ls.Writes, ls.Reads, len(names))
				}
				if pool < 1<<20 && k > 1 && ls.Writes <= int64(len(names)) {
					t.Errorf("a pool of two gradients' blocks held three sums without spilling: %+v", ls)
				}
			})
		}
	}
}

// TestWriteBehindHeld: WriteBehind writes a held sum (once), an ENOSPC on
// that write loses nothing (Flush reports it, a second Flush after space
// returns writes the same bits), and WriteBehind with nothing held does
// nothing.
func TestWriteBehindHeld(t *testing.T) {
	const n = 1000
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, _, inj := holdEnv(t, 1<<20)
	if err := s.Register("w", n); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteBehind(ctx, "w"); err != nil || s.Stats().Writes != 0 {
		t.Fatalf("WriteBehind with nothing held: %v, %+v", err, s.Stats())
	}
	a, b := holdGrads(1, n), holdGrads(2, n)
	if err := s.AccumulateHold(ctx, "w", a); err != nil {
		t.Fatal(err)
	}
	if err := s.AccumulateHold(ctx, "w", b); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Writes != 0 || st.PinnedBytes == 0 {
		t.Fatalf("a held sum was written or let go: %+v", st)
	}
	inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC, Times: 1})
	if err := s.WriteBehind(ctx, "w"); err != nil {
		t.Fatal(err) // the failure is behind
	}
	if err := s.Flush(ctx); !errors.Is(err, aio.ErrNoSpace) {
		t.Fatalf("Flush after a failed write-behind: %v, want ENOSPC", err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush after space returned: %v", err)
	}
	got := make([]float32, n)
	if err := s.Read(ctx, "w", got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if want := a[i] + b[i]; math.Float32bits(got[i]) != math.Float32bits(want) {
			t.Fatalf("w[%d] = %v, want %v", i, got[i], want)
		}
	}
	if st := s.Stats(); st.Writes != 1 || st.PinnedBytes != 0 {
		t.Fatalf("after the retry: %+v (want 1 write, nothing pinned)", st)
	}
}
