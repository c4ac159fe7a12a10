package grad_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
)

// openStore opens a store on paths temporary directories.
func openStore(t *testing.T, paths int, checksums bool) *swapper.Store {
	t.Helper()
	eng, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	var dirs []string
	for range paths {
		dirs = append(dirs, t.TempDir())
	}
	st, err := swapper.OpenStore(swapper.StoreOptions{Paths: dirs, Engine: eng, Name: "rangetest", Checksums: checksums,
		StripeBytes: 8192, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newPool(t *testing.T, capacity int64) *buffers.Pool {
	t.Helper()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: capacity, Pin: buffers.PinOff, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Close(); err != nil {
			t.Errorf("pool: %v", err)
		}
	})
	return pool
}

func randGrad(rng *rand.Rand, n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	return g
}

// TestReadRange reads random element ranges of gradients on a store
// (striped over two paths, with and without checksums), kept in pinned
// memory and never accumulated, straight into pool buffers of
// RangeBufferBytes, and compares them with the accumulated sums.
func TestReadRange(t *testing.T) {
	for _, checksums := range []bool{false, true} {
		for _, paths := range []int{1, 2} {
			t.Run(fmt.Sprintf("checksums=%v/paths=%d", checksums, paths), func(t *testing.T) {
				ctx := t.Context()
				pool := newPool(t, 4<<20)
				g, err := grad.New(grad.Options{Store: openStore(t, paths, checksums), Pool: pool, KeepInCPUBytes: 4 * 100,
					Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				sizes := map[string]int{"kept": 100, "disk": 30011, "zero": 500, "empty": 0}
				rng := rand.New(rand.NewPCG(uint64(paths), 9))
				want := map[string][]float32{}
				for name, n := range sizes {
					if err := g.Register(name, n); err != nil {
						t.Fatal(err)
					}
					want[name] = make([]float32, n)
					if name == "zero" {
						continue
					}
					for range 2 {
						x := randGrad(rng, n)
						if err := g.Accumulate(ctx, name, x); err != nil {
							t.Fatal(err)
						}
						for i := range x {
							want[name][i] += x[i]
						}
					}
				}
				if err := g.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				for name, n := range sizes {
					for range 20 {
						lo := rng.IntN(n + 1)
						hi := lo + rng.IntN(n-lo+1)
						b, err := pool.Acquire(ctx, max(g.RangeBufferBytes(lo, hi), 1), buffers.PurposeOptimizer)
						if err != nil {
							t.Fatal(err)
						}
						clear(b.Bytes())
						got, err := g.ReadRange(ctx, name, lo, hi, b.Bytes())
						if err != nil {
							t.Fatalf("%s [%d, %d): %v", name, lo, hi, err)
						}
						if len(got) != hi-lo {
							t.Fatalf("%s [%d, %d): %d values", name, lo, hi, len(got))
						}
						for i, v := range got {
							if math.Float32bits(v) != math.Float32bits(want[name][lo+i]) {
								t.Fatalf("%s [%d, %d): element %d is %v, want %v", name, lo, hi, lo+i, v, want[name][lo+i])
							}
						}
						b.Release()
					}
				}
				// A destination below RangeBufferBytes and a range outside
				// the partition are refused.
				if _, err := g.ReadRange(ctx, "disk", 1, 2000, make([]byte, 4*1999)); err == nil && g.RangeBufferBytes(1, 2000) > 4*1999 {
					t.Fatal("ReadRange accepted a destination below RangeBufferBytes")
				}
				if _, err := g.ReadRange(ctx, "kept", 90, 101, make([]byte, 1<<12)); err == nil {
					t.Fatal("ReadRange accepted a range beyond the partition")
				}
				if _, err := g.ReadRange(ctx, "nope", 0, 1, make([]byte, 1<<12)); !errors.Is(err, grad.ErrUnknown) {
					t.Fatalf("ReadRange of an unknown gradient: %v", err)
				}
				if st := g.Stats(); st.PinnedBytes > int64(pool.MinBufferBytes()) {
					t.Fatalf("after Flush only the kept gradient is pinned; %d bytes are", st.PinnedBytes)
				}
			})
		}
	}
}

// TestEmptyGradient: an empty partition registers, accumulates, reads and
// costs no memory.
func TestEmptyGradient(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, 1<<20)
	g, err := grad.New(grad.Options{Store: openStore(t, 1, true), Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Register("e", 0); err != nil {
		t.Fatal(err)
	}
	if err := g.Accumulate(ctx, "e", nil); err != nil {
		t.Fatal(err)
	}
	if err := g.Read(ctx, "e", nil); err != nil {
		t.Fatal(err)
	}
	if got, err := g.ReadRange(ctx, "e", 0, 0, nil); err != nil || len(got) != 0 {
		t.Fatalf("ReadRange of an empty gradient: %v, %v", got, err)
	}
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := pool.Stats(); st.Acquires != 0 {
		t.Fatalf("an empty gradient acquired %d buffers", st.Acquires)
	}
	if n := grad.PinnedNeedBytes(grad.Options{Pool: pool}, []int{0, 0}, nil); n != 0 {
		t.Fatalf("empty partitions need %d bytes", n)
	}
}

// TestRegisterAllOrNothing: a gradient too large for the pool is refused
// and leaves nothing registered; the name can then be registered.
func TestRegisterAllOrNothing(t *testing.T) {
	pool := newPool(t, 64<<10)
	g, err := grad.New(grad.Options{Store: openStore(t, 1, false), Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Register("w", 1<<20); err == nil {
		t.Fatal("Register of a gradient larger than the pool succeeded")
	}
	if err := g.Accumulate(t.Context(), "w", make([]float32, 1<<20)); !errors.Is(err, grad.ErrUnknown) {
		t.Fatalf("a refused gradient is registered: %v", err)
	}
	if err := g.Register("w", 1000); err != nil {
		t.Fatalf("Register again: %v", err)
	}
}

// TestPinnedNeedExactPool: in a pool of exactly grad.PinnedNeedBytes,
// kept and stored gradients of random sizes accumulate, flush, read (whole
// and ranged) and zero, from several goroutines, without waiting forever.
func TestPinnedNeedExactPool(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 5))
	for i := range 6 {
		parts := make([]int, 1+rng.IntN(6))
		for j := range parts {
			parts[j] = rng.IntN(40000)
		}
		keep := int64(rng.IntN(3)) * 40000
		withStore := i%3 != 0
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			var st *swapper.Store
			if withStore {
				st = openStore(t, 1, rng.IntN(2) == 0)
			}
			probe := newPool(t, 1<<16)
			need := grad.PinnedNeedBytes(grad.Options{Store: st, Pool: probe, KeepInCPUBytes: keep}, parts, nil)
			pool := newPool(t, max(need, 1))
			g, err := grad.New(grad.Options{Store: st, Pool: pool, KeepInCPUBytes: keep, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			defer func() {
				if ctx.Err() != nil {
					t.Errorf("watchdog: pool of %d bytes, stats %+v, gradients %+v", need, pool.Stats(), g.Stats())
				}
			}()
			for j, n := range parts {
				if err := g.Register(fmt.Sprint(j), n); err != nil {
					t.Fatal(err)
				}
			}
			for step := range 2 {
				errs := make(chan error, len(parts))
				for j, n := range parts {
					go func() {
						x := randGrad(rand.New(rand.NewPCG(uint64(j), uint64(step))), n)
						for range 2 {
							if err := g.Accumulate(ctx, fmt.Sprint(j), x); err != nil {
								errs <- err
								return
							}
						}
						errs <- g.Read(ctx, fmt.Sprint(j), make([]float32, n))
					}()
				}
				for range parts {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
				if err := g.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				g.Zero()
			}
		})
	}
}
