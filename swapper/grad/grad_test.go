package grad

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testBackends(t *testing.T) []string {
	out := []string{aio.BackendPosix}
	if err := aio.Available(aio.BackendUring); err == nil {
		out = append(out, aio.BackendUring)
	} else {
		t.Logf("uring unavailable here: %v", err)
	}
	return out
}

type env struct {
	pool  *buffers.Pool
	store *swapper.Store
	inj   *faults.Injector
}

// newEnv builds a real pool, engine and store (store only when withStore)
// and a Swapper; cleanup closes them in order and checks for leaked
// buffers.
func newEnv(t *testing.T, backend string, withStore bool, o Options) (*env, *Swapper) {
	t.Helper()
	return newEnvPool(t, backend, withStore, o, 4<<20)
}

// newEnvPool is newEnv with a pool of poolBytes.
func newEnvPool(t *testing.T, backend string, withStore bool, o Options, poolBytes int64) (*env, *Swapper) {
	t.Helper()
	e := &env{inj: faults.New(7)}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: poolBytes, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.pool = pool
	var eng aio.Engine
	if withStore {
		eng, err = aio.New(aio.Options{Backend: backend, Faults: e.inj, Logger: quiet, BlockSizeBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		e.store, err = swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: "gradtest", Checksums: true, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
	}
	o.Store, o.Pool, o.Logger = e.store, pool, quiet
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if e.store != nil {
			if names := e.store.Names(); len(names) != 0 {
				t.Errorf("gradients left in the store after Close: %v", names)
			}
			e.store.Close()
			eng.Close()
		}
		if n := pool.Stats().Outstanding; n != 0 {
			t.Errorf("%d pool buffers outstanding after Close", n)
		}
		if err := pool.Close(); err != nil {
			t.Errorf("pool close: %v", err)
		}
	})
	return e, s
}

func grads(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 42))
	g := make([]float32, n)
	for i := range g {
		// Mixed magnitudes, so float32 rounding and the order of the
		// additions matter.
		g[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-4)))
	}
	return g
}

// reference accumulates micro-step gradients in memory: acc = g0 exactly,
// then acc[i] = acc[i] + g[i] in float32.
func reference(steps ...[]float32) []float32 {
	acc := append([]float32(nil), steps[0]...)
	for _, g := range steps[1:] {
		for i := range acc {
			acc[i] = acc[i] + g[i]
		}
	}
	return acc
}

func sameBits(t testing.TB, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d = %v (%#x), want %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestAccumulateBitExact accumulates three micro-steps, on NVMe (with and
// without a Flush between steps, so both the pinned-copy and the
// read-modify-write paths run), kept in pinned memory, and with no store,
// and compares with in-memory float32 accumulation bit for bit.
func TestAccumulateBitExact(t *testing.T) {
	const n = 10_007
	for _, backend := range testBackends(t) {
		for _, mode := range []string{"nvme", "nvme-flush-between", "kept", "no-store"} {
			t.Run(backend+"/"+mode, func(t *testing.T) {
				o := Options{}
				if mode == "kept" {
					o.KeepInCPUBytes = 3 * 4 * n
				}
				e, s := newEnv(t, backend, mode != "no-store", o)
				ctx := testCtx(t)
				names := []string{"a", "b", "c"}
				for _, nm := range names {
					if err := s.Register(nm, n); err != nil {
						t.Fatal(err)
					}
				}
				for step := range 2 { // two optimizer steps, Zero between
					var steps [][]float32
					for micro := range 3 {
						g := grads(uint64(100*step+micro), n)
						steps = append(steps, g)
						for _, nm := range names {
							if err := s.Accumulate(ctx, nm, g); err != nil {
								t.Fatal(err)
							}
						}
						if mode == "nvme-flush-between" {
							if err := s.Flush(ctx); err != nil {
								t.Fatal(err)
							}
							if p := s.Stats().PinnedBytes; p != 0 {
								t.Errorf("%d pinned bytes held after Flush", p)
							}
						}
					}
					if err := s.Flush(ctx); err != nil {
						t.Fatal(err)
					}
					want := reference(steps...)
					for _, nm := range names {
						got := make([]float32, n)
						if err := s.Read(ctx, nm, got); err != nil {
							t.Fatal(err)
						}
						sameBits(t, fmt.Sprintf("step %d %s", step, nm), got, want)
					}
					s.Zero()
				}
				st := s.Stats()
				switch mode {
				case "nvme", "nvme-flush-between":
					if st.Writes != 2*3*3 || st.WriteErrors != 0 {
						t.Errorf("stats %+v", st)
					}
					if mode == "nvme-flush-between" && st.Reads < 2*2*3 {
						t.Errorf("read-modify-write did not read: %+v", st)
					}
				case "kept":
					if st.Writes != 0 || st.KeptBytes != 3*4*n || len(e.store.Names()) != 0 {
						t.Errorf("kept gradients went to the store: %+v", st)
					}
				}
				// After Zero a gradient reads as zeros.
				got := make([]float32, n)
				got[0] = 1
				if err := s.Read(ctx, "a", got); err != nil || got[0] != 0 {
					t.Errorf("read after Zero: %v, %v", got[0], err)
				}
			})
		}
	}
}

// TestWriteBehindENOSPC: a full disk during write-behind surfaces from
// Flush, Read and the next Accumulate, naming the tensor, and loses
// nothing: after space returns a retry succeeds and the sum is exact.
func TestWriteBehindENOSPC(t *testing.T) {
	const n = 3000
	for _, backend := range testBackends(t) {
		t.Run(backend, func(t *testing.T) {
			e, s := newEnv(t, backend, true, Options{})
			ctx := testCtx(t)
			s.Register("mlp.up", n)
			g := [][]float32{grads(1, n), grads(2, n), grads(3, n), grads(4, n)}
			full := faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC}

			// Flush reports, a second Flush after space returns writes again.
			e.inj.Add(full)
			if err := s.Accumulate(ctx, "mlp.up", g[0]); err != nil {
				t.Fatal(err) // the write is behind: nothing to report yet
			}
			err := s.Flush(ctx)
			if !errors.Is(err, aio.ErrNoSpace) || !strings.Contains(err.Error(), "mlp.up") {
				t.Fatalf("Flush on a full disk: %v", err)
			}
			if p := s.Stats().PinnedBytes; p == 0 {
				t.Fatal("the pinned copy was given back before its write succeeded")
			}
			e.inj.Clear()
			if err := s.Flush(ctx); err != nil {
				t.Fatalf("Flush after space returned: %v", err)
			}
			if st := s.Stats(); st.Retries != 1 || st.PinnedBytes != 0 {
				t.Errorf("stats %+v", st)
			}

			// The next Accumulate reports, without adding its gradient.
			e.inj.Add(full)
			if err := s.Accumulate(ctx, "mlp.up", g[1]); err != nil {
				t.Fatal(err)
			}
			err = s.Accumulate(ctx, "mlp.up", g[2])
			if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "mlp.up") {
				t.Fatalf("Accumulate after a failed write-behind: %v", err)
			}
			e.inj.Clear()
			if err := s.Accumulate(ctx, "mlp.up", g[2]); err != nil { // the retry
				t.Fatal(err)
			}
			if err := s.Flush(ctx); err != nil { // before the disk fills again
				t.Fatal(err)
			}

			// Read reports a failure it waits for, then serves the sum.
			e.inj.Add(full)
			if err := s.Accumulate(ctx, "mlp.up", g[3]); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, n)
			if err := s.Read(ctx, "mlp.up", got); !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("Read after a failed write-behind: %v", err)
			}
			e.inj.Clear()
			if err := s.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Read(ctx, "mlp.up", got); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "sum after recovery", got, reference(g...))
			if p := s.Stats().PinnedBytes; p != 0 {
				t.Errorf("%d pinned bytes held after a successful Flush", p)
			}
		})
	}
}

// TestReadAsyncAndConcurrency: many gradients accumulated from several
// goroutines at once, read back through the read-ahead API.
func TestReadAsyncAndConcurrency(t *testing.T) {
	const tensors, n, micro = 16, 1500, 3
	_, s := newEnv(t, testBackends(t)[len(testBackends(t))-1], true, Options{KeepInCPUBytes: 4 * n * 3})
	ctx := testCtx(t)
	for i := range tensors {
		if err := s.Register(fmt.Sprintf("g%d", i), n); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, tensors)
	for i := range tensors {
		wg.Go(func() {
			for m := range micro {
				if err := s.Accumulate(ctx, fmt.Sprintf("g%d", i), grads(uint64(i*10+m), n)); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	// Read-ahead: start every read, then consume in order.
	dsts := make([][]float32, tensors)
	ws := make([]Waiter, tensors)
	for i := range tensors {
		dsts[i] = make([]float32, n)
		w, err := s.ReadAsync(fmt.Sprintf("g%d", i), dsts[i])
		if err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	for i := range tensors {
		if err := ws[i].Wait(); err != nil {
			t.Fatal(err)
		}
		sameBits(t, fmt.Sprintf("g%d", i), dsts[i], reference(grads(uint64(i*10), n), grads(uint64(i*10+1), n), grads(uint64(i*10+2), n)))
	}
	if _, err := s.ReadAsync("g0", make([]float32, 3)); err == nil {
		t.Error("ReadAsync with a wrong length accepted")
	}
	if _, err := s.ReadAsync("nope", nil); !errors.Is(err, ErrUnknown) {
		t.Errorf("ReadAsync of an unknown name: %v", err)
	}
}

func TestOptionsAndClose(t *testing.T) {
	if _, err := New(Options{KeepInCPUBytes: -1}); err == nil || !strings.Contains(err.Error(), "Pool") || !strings.Contains(err.Error(), "KeepInCPUBytes") {
		t.Errorf("bad options: %v", err)
	}
	_, s := newEnv(t, aio.BackendPosix, true, Options{})
	ctx := testCtx(t)
	if err := s.Register("w", 100); err != nil {
		t.Fatal(err)
	}
	if err := s.Register("w", 100); err == nil {
		t.Error("duplicate accepted")
	}
	if err := s.Accumulate(ctx, "w", make([]float32, 99)); err == nil {
		t.Error("wrong length accepted")
	}
	if err := s.Accumulate(ctx, "w", grads(1, 100)); err != nil {
		t.Fatal(err)
	}
	// Close with a write behind in flight waits for it and frees it.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Accumulate(ctx, "w", grads(1, 100)); !errors.Is(err, ErrClosed) {
		t.Errorf("Accumulate after Close: %v", err)
	}
	if err := s.Flush(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close: %v", err)
	}
}
