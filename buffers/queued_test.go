package buffers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zinfio/zinf/buffers"
)

// TestWithQueued: Acquire calls the WithQueued func once the request
// holds its place: at once when the memory is free, and, when it is not,
// while the request is still waiting (so a second request let go from it
// queues behind the first); never for a request refused at once.
func TestWithQueued(t *testing.T) {
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 10, MinBufferBytes: 4096, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var calls atomic.Int32
	count := buffers.WithQueued(ctx, func() { calls.Add(1) })

	first, err := pool.Acquire(count, 64<<10, buffers.PurposeParams)
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("granted at once: the func ran %d times, want 1", n)
	}

	queued := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		b, err := pool.Acquire(buffers.WithQueued(ctx, func() { close(queued) }), 64<<10, buffers.PurposeParams)
		if err == nil {
			b.Release()
		}
		got <- err
	}()
	select {
	case <-queued:
	case <-ctx.Done():
		t.Fatal("watchdog: the waiting request never reported its place")
	}
	select {
	case err := <-got:
		t.Fatalf("the request reported its place only after it returned (%v)", err)
	default:
	}
	if w := pool.Stats().Waiting; w != 1 {
		t.Fatalf("%d waiters when the func ran; want the request queued (1)", w)
	}
	first.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}

	if _, err := pool.Acquire(count, 1<<30, buffers.PurposeParams); err == nil {
		t.Fatal("a request larger than the pool was served")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("a request refused at once ran the func (%d calls)", n)
	}
}
