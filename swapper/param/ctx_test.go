package param

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// TestBackgroundContextOps: operations called with a context that is
// never done (context.Background) use the swapper's own context: Close
// still ends one blocked on pinned memory, and a warm read allocates no
// derived context.
func TestBackgroundContextOps(t *testing.T) {
	e := newEnv(t, envOpts{poolBytes: 64 << 10})
	s, err := New(Options{Store: e.store, Pool: e.pool, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 2000
	if err := s.Register("cpu", n, swapper.TierCPU); err != nil {
		t.Fatal(err)
	}
	if err := s.Register("nvme", n, swapper.TierNVMe); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cpu", "nvme"} {
		if err := s.Init(ctx, name, values(3, n)); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]byte, n*4)
	read := func() {
		if err := s.ReadBytes(ctx, "cpu", dst); err != nil {
			t.Fatal(err)
		}
	}
	read()
	allocs := testing.AllocsPerRun(20, read)
	t.Logf("%.1f allocations per ReadBytes with context.Background", allocs)
	if allocs > 2 {
		t.Errorf("%.1f allocations per ReadBytes with context.Background (a derived context costs about 5 more)", allocs)
	}
	// Hold the whole pool: a swap-in waits for pinned memory until Close
	// ends it.
	var held []*buffers.Buffer
	for {
		b, ok := e.pool.TryAcquire(e.pool.MinBufferBytes(), buffers.PurposeParams)
		if !ok {
			break
		}
		held = append(held, b)
	}
	done := make(chan error, 1)
	go func() { done <- s.SwapIn(ctx, "nvme") }()
	select {
	case err := <-done:
		t.Fatalf("SwapIn did not wait for memory: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-done:
		if err == nil || !(errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled)) {
			t.Fatalf("SwapIn blocked on memory ended by Close with %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not end a SwapIn blocked on memory under context.Background")
	}
	for _, b := range held {
		b.Release()
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
