package param

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testBackends are the aio backends the tests run on: posix everywhere,
// uring where the kernel allows it.
func testBackends(t *testing.T) []string {
	out := []string{aio.BackendPosix}
	if err := aio.Available(aio.BackendUring); err == nil {
		out = append(out, aio.BackendUring)
	} else {
		t.Logf("uring unavailable here: %v", err)
	}
	return out
}

// env is a real pool, aio engine and store on a temporary directory, with
// a fault injector in the engine. Cleanup closes them in order and fails
// the test if a pool buffer leaked.
type env struct {
	pool  *buffers.Pool
	eng   aio.Engine
	store *swapper.Store
	inj   *faults.Injector
	hook  *gateHook
}

type envOpts struct {
	backend     string
	poolBytes   int64
	checksums   bool
	parallelism int
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	if o.backend == "" {
		o.backend = aio.BackendPosix
	}
	if o.poolBytes == 0 {
		o.poolBytes = 8 << 20
	}
	e := &env{inj: faults.New(1)}
	e.hook = &gateHook{inner: e.inj}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: o.poolBytes, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.pool = pool
	eng, err := aio.New(aio.Options{Backend: o.backend, Faults: e.hook, Logger: quiet, IntraOpParallelism: max(o.parallelism, 1), BlockSizeBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	e.eng = eng
	st, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: "paramtest", Checksums: o.checksums, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine close: %v", err)
		}
		if n := pool.Stats().Outstanding; n != 0 {
			t.Errorf("%d pool buffers outstanding after the swappers closed", n)
		}
		if err := pool.Close(); err != nil {
			t.Errorf("pool close: %v", err)
		}
	})
	return e
}

// swapper returns a param.Swapper on the env, closed at cleanup (before
// the env's own cleanup, which checks for leaks).
func (e *env) swapper(t *testing.T, o Options) *Swapper {
	t.Helper()
	if o.Store == nil {
		o.Store = e.store
	}
	if o.Pool == nil {
		o.Pool = e.pool
	}
	if o.Logger == nil {
		o.Logger = quiet
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("swapper close: %v", err)
		}
	})
	return s
}

// gateHook is the engine's fault hook: it consults the injector, and
// holds back every piece whose file offset lies in [lo, hi) until open is
// called, so a test can keep one tensor's read in flight for as long as it
// likes, deterministically (no sleeps).
type gateHook struct {
	inner *faults.Injector

	mu      sync.Mutex
	lo, hi  int64
	release chan struct{}
	held    chan struct{} // closed when the first piece is held
}

func (h *gateHook) Before(p aio.PieceInfo) aio.Fault {
	h.mu.Lock()
	rel := h.release
	hit := rel != nil && p.Op == aio.OpRead && p.Offset >= h.lo && p.Offset < h.hi
	if hit && h.held != nil {
		close(h.held)
		h.held = nil
	}
	h.mu.Unlock()
	if hit {
		<-rel
	}
	return h.inner.Before(p)
}

// hold starts holding reads of [lo, hi); it returns a channel closed when
// the first one arrives and a function that lets them go.
func (h *gateHook) hold(lo, hi int64) (arrived <-chan struct{}, open func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lo, h.hi = lo, hi
	rel := make(chan struct{})
	h.release = rel
	h.held = make(chan struct{})
	var once sync.Once
	return h.held, func() {
		once.Do(func() {
			h.mu.Lock()
			h.release = nil
			h.mu.Unlock()
			close(rel)
		})
	}
}

// values returns deterministic test values for a partition: mixed signs,
// magnitudes and a few specials that every dtype can hold.
func values(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 0xfeed))
	v := make([]float32, n)
	for i := range v {
		switch i % 7 {
		case 0:
			v[i] = float32(r.NormFloat64())
		case 1:
			v[i] = float32(r.NormFloat64() * 1e-3)
		case 2:
			v[i] = float32(r.NormFloat64() * 300)
		case 3:
			v[i] = 0
		default:
			v[i] = float32(r.Float64()*2 - 1)
		}
	}
	return v
}

// expect returns what reading v back after storing it as dt must give.
func expect(dt swapper.DType, v []float32) []float32 {
	out := make([]float32, len(v))
	for i, f := range v {
		switch dt {
		case swapper.BFloat16:
			out[i] = buffers.BFloat16FromFloat32(f).Float32()
		case swapper.Float16:
			out[i] = buffers.Float16FromFloat32(f).Float32()
		default:
			out[i] = f
		}
	}
	return out
}

// sameBits fails unless got and want are bit-for-bit equal.
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

// read reads name's partition into a new slice.
func read(t testing.TB, s *Swapper, name string) []float32 {
	t.Helper()
	n, err := s.PartitionLen(name)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]float32, n)
	if err := s.ReadFloat32(context.Background(), name, dst); err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return dst
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func name(i int) string { return fmt.Sprintf("layer%02d.weight", i) }
