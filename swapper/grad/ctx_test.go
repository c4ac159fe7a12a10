package grad

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
)

// TestBackgroundContextOps: operations called with a context that is
// never done (context.Background) use the swapper's own context: Close
// still ends one blocked on pinned memory, and a warm operation allocates
// no derived context.
func TestBackgroundContextOps(t *testing.T) {
	e, s := newEnv(t, aio.BackendPosix, true, Options{})
	const n = 4096
	if err := s.Register("w", n); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g := grads(1, n)
	if err := s.Accumulate(ctx, "w", g); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	dst := make([]float32, n)
	read := func() {
		if err := s.Read(ctx, "w", dst); err != nil {
			t.Fatal(err)
		}
	}
	read()
	allocs := testing.AllocsPerRun(20, read)
	t.Logf("%.1f allocations per Read with context.Background", allocs)
	if allocs > 6 {
		t.Errorf("%.1f allocations per Read with context.Background (a derived context costs about 5 more)", allocs)
	}
	// Hold the whole pool: the next Accumulate blocks on pinned memory
	// until Close ends it.
	var held []*buffers.Buffer
	for {
		b, ok := e.pool.TryAcquire(int(e.pool.MinBufferBytes()), buffers.PurposeGradients)
		if !ok {
			break
		}
		held = append(held, b)
	}
	defer func() {
		for _, b := range held {
			b.Release()
		}
	}()
	if err := s.Register("x", n); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Accumulate(ctx, "x", g) }()
	select {
	case err := <-done:
		t.Fatalf("Accumulate did not wait for memory: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-done:
		if err == nil || !(errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled)) {
			t.Fatalf("Accumulate blocked on memory ended by Close with %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not end an Accumulate blocked on memory under context.Background")
	}
	for _, b := range held {
		b.Release()
	}
	held = nil
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
