package param

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper"
)

// turnSetup is a swapper on a 64 KiB pool (room for one of its two 64 KiB
// partitions, "a" then "b", initialized on NVMe) whose swap-in of "a" is
// held before its turn at the pool until the returned func is called: the
// goroutine of a swap-in requested first that the scheduler has not run
// yet. It fails the test with every goroutine's stack if a wait outlives
// the watchdog.
func turnSetup(t *testing.T) (s *Swapper, ctx context.Context, heldA <-chan struct{}, releaseA func()) {
	t.Helper()
	e := newEnv(t, envOpts{poolBytes: 64 << 10})
	s = e.swapper(t, Options{DType: swapper.Float32})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	for _, n := range []string{"a", "b"} {
		if err := s.Register(n, 16<<10, swapper.TierNVMe); err != nil {
			t.Fatal(err)
		}
		if err := s.Init(ctx, n, values(uint64(len(n)), 16<<10)); err != nil {
			t.Fatal(err)
		}
	}
	held, release := make(chan struct{}), make(chan struct{})
	beforeTurn = func(name string) {
		if name == "a" {
			close(held)
			<-release
		}
	}
	released := false
	releaseA = func() {
		if !released {
			released = true
			close(release)
		}
	}
	// Let a go and close the swapper (its cleanup) before the seam goes.
	t.Cleanup(func() { beforeTurn = nil })
	t.Cleanup(releaseA)
	return s, ctx, held, releaseA
}

// until polls cond (under s.mu) until it holds or ctx ends, then fails
// the test with every goroutine's stack and what.
func until(t *testing.T, ctx context.Context, s *Swapper, what string, cond func() bool) {
	t.Helper()
	for {
		s.mu.Lock()
		ok := cond()
		s.mu.Unlock()
		if ok {
			return
		}
		if ctx.Err() != nil {
			buf := make([]byte, 1<<20)
			t.Fatalf("watchdog: %s never happened; goroutines:\n%s", what, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSwapInsAskThePoolInOrder: "a" and "b" are prefetched in that order
// and "a"'s goroutine does not run; "b" waits for its turn instead of
// taking the pool's only room. Once "a" runs it gets the memory, a Wait
// for it needs no preemption, and "b" follows when "a" is released.
// Without the order, "b" took the room and was preempted (read twice).
func TestSwapInsAskThePoolInOrder(t *testing.T) {
	s, ctx, heldA, releaseA := turnSetup(t)
	before := s.Stats()
	if err := s.Prefetch("a", "b"); err != nil {
		t.Fatal(err)
	}
	<-heldA
	tb := s.tensors["b"]
	// "b" either waits for its turn or (out of order) takes the memory.
	until(t, ctx, s, `"b" waiting for its turn or taking the pool's room`, func() bool {
		return tb.flight == nil || tb.flight.stage != awaitingSlot || s.pool.Stats().InUseBytes != 0
	})
	s.mu.Lock()
	waiting := tb.flight != nil && tb.flight.stage == awaitingTurn
	s.mu.Unlock()
	if n := s.pool.Stats().InUseBytes; n != 0 || !waiting {
		t.Fatalf("%d bytes of pool memory in use (waiting for its turn: %v) while the first swap-in has not asked: the second went ahead", n, waiting)
	}
	releaseA()
	if err := s.Wait(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	s.Release("a")
	if err := s.Wait(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if p := st.PreemptedBytes - before.PreemptedBytes; p != 0 {
		t.Fatalf("%d bytes preempted: a swap-in took memory out of order", p)
	}
	if r := st.BytesRead - before.BytesRead; r != 2*(64<<10) {
		t.Fatalf("%d bytes read for two 64 KiB partitions", r)
	}
	s.Release("b")
}

// TestTurnWaitEndsWhenDropped: a swap-in waiting for its turn behind one
// that never asks is not stuck: releasing it (Release drops a swap-in in
// flight) ends its wait, and it lands back on NVMe.
func TestTurnWaitEndsWhenDropped(t *testing.T) {
	s, ctx, heldA, releaseA := turnSetup(t)
	if err := s.Prefetch("a", "b"); err != nil {
		t.Fatal(err)
	}
	<-heldA
	tb := s.tensors["b"]
	var fb *flight
	until(t, ctx, s, `"b" waiting for its turn`, func() bool {
		fb = tb.flight
		return fb != nil && fb.stage == awaitingTurn
	})
	s.Release("b")
	select {
	case <-fb.done:
	case <-ctx.Done():
		buf := make([]byte, 1<<20)
		t.Fatalf(`watchdog: the dropped swap-in of "b" still waits for its turn; goroutines:\n%s`, buf[:runtime.Stack(buf, true)])
	}
	if st := s.State("b"); st != OnNVMe {
		t.Fatalf(`"b" is %s after its swap-in was dropped`, st)
	}
	releaseA()
	if err := s.Wait(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	s.Release("a")
}
