package buffers_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/buffers"
)

// noStall is a stall timeout no test reaches: a wait these tests see fail
// was failed by the wait-for check, not by the stall timer.
const noStall = time.Hour

func holderPool(t *testing.T) *buffers.Pool {
	t.Helper()
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 10, Pin: buffers.PinOff, StallTimeout: noStall})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// acquireAsync runs Acquire on its own goroutine; the channel gets its
// result. A result that does not come within a minute fails the test with
// what the pool holds (so a regression hangs for a minute, not an hour).
func acquireAsync(t *testing.T, p *buffers.Pool, ctx context.Context, size int) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		b, err := p.Acquire(ctx, size, buffers.PurposeOptimizer)
		if err == nil {
			b.Release()
		}
		done <- err
	}()
	return done
}

func result(t *testing.T, p *buffers.Pool, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("Acquire still waiting after a minute; the pool holds: %s", p.Holders())
		return nil
	}
}

// waitForWaiters waits until n Acquire calls are blocked in p.
func waitForWaiters(t *testing.T, p *buffers.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for p.Stats().Waiting != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting, want %d; the pool holds: %s", p.Stats().Waiting, n, p.Holders())
		}
		time.Sleep(time.Millisecond)
	}
}

// A holder that waits for memory only its own buffers could free fails at
// once, naming itself, what it holds and what it waits for; not after
// the stall timer.
func TestHolderWaitingOnItselfFailsAtOnce(t *testing.T) {
	p := holderPool(t)
	ctx := buffers.WithHolder(t.Context(), buffers.NewHolder("loop"))
	held, err := p.Acquire(ctx, 48<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	err = result(t, p, acquireAsync(t, p, ctx, 32<<10))
	if !errors.Is(err, buffers.ErrDeadlock) || !errors.Is(err, buffers.ErrStalled) {
		t.Fatalf("got %v, want ErrDeadlock (and ErrStalled)", err)
	}
	var de *buffers.DeadlockError
	if !errors.As(err, &de) {
		t.Fatalf("got %T, want a *DeadlockError", errors.Unwrap(err))
	}
	want := `"loop" holds 48 KiB (49152 bytes) in 1 buffer(s) of the shared region and waits for 32 KiB (32768 bytes) for optimizer`
	if de.Holders != want {
		t.Errorf("Holders = %q, want %q", de.Holders, want)
	}
	if !strings.Contains(err.Error(), "held: shared region") {
		t.Errorf("%q does not say what the pool holds", err)
	}
	st := p.Stats()
	if st.Deadlocks != 1 || st.Stalls != 0 || st.Waiting != 0 {
		t.Errorf("Deadlocks %d, Stalls %d, Waiting %d; want 1, 0, 0", st.Deadlocks, st.Stalls, st.Waiting)
	}
	held.Release()
	// The holder is usable again once it released what it held.
	b, err := p.Acquire(ctx, 32<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
}

// Two holders each holding half the region and each waiting for more: the
// second wait closes the cycle, and both fail, each error naming both.
func TestHoldersWaitingOnEachOtherFail(t *testing.T) {
	p := holderPool(t)
	a := buffers.WithHolder(t.Context(), buffers.NewHolder("worker a"))
	b := buffers.WithHolder(t.Context(), buffers.NewHolder("worker b"))
	ha, err := p.Acquire(a, 32<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Release()
	hb, err := p.Acquire(b, 32<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Release()
	da := acquireAsync(t, p, a, 48<<10)
	waitForWaiters(t, p, 1) // a waits on b, which can still release: no deadlock yet
	select {
	case err := <-da:
		t.Fatalf("a's wait ended while b could still release: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	db := acquireAsync(t, p, b, 16<<10)
	for name, done := range map[string]<-chan error{"a": da, "b": db} {
		err := result(t, p, done)
		if !errors.Is(err, buffers.ErrDeadlock) {
			t.Fatalf("%s: got %v, want ErrDeadlock", name, err)
		}
		for _, want := range []string{`"worker a" holds 32 KiB (32768 bytes) in 1 buffer(s) of the shared region and waits for 48 KiB`, `"worker b" holds 32 KiB (32768 bytes) in 1 buffer(s) of the shared region and waits for 16 KiB`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", name, err, want)
			}
		}
	}
}

// A wait is not reported while anything that could release is left: a
// buffer without a holder, or a holder that is not waiting. When that
// last one releases and the wait still does not fit, it fails then.
func TestDeadlockOnlyWhenNothingCanRelease(t *testing.T) {
	p := holderPool(t)
	loop := buffers.WithHolder(t.Context(), buffers.NewHolder("loop"))
	own, err := p.Acquire(loop, 32<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Release()
	anon, err := p.Acquire(t.Context(), 16<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	other := buffers.WithHolder(t.Context(), buffers.NewHolder("reader"))
	theirs, err := p.Acquire(other, 8<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(t, p, loop, 48<<10) // needs 48 KiB; 8 KiB free
	waitForWaiters(t, p, 1)
	anon.Release() // 24 KiB free; "reader" could still release
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the wait ended while \"reader\" could still release: %v", err)
	default:
	}
	theirs.Release() // 32 KiB free, the rest is the loop's own: never 48
	err = result(t, p, done)
	if !errors.Is(err, buffers.ErrDeadlock) || !strings.Contains(err.Error(), `"loop" holds 32 KiB`) {
		t.Fatalf("got %v, want ErrDeadlock naming \"loop\"", err)
	}
}

// A holder whose wait another holder's release serves is not a deadlock;
// and a wait without a holder behind a deadlocked one is not failed: it is
// served once the failed holder gives its buffers back.
func TestDeadlockSparesOthers(t *testing.T) {
	p := holderPool(t)
	a := buffers.WithHolder(t.Context(), buffers.NewHolder("a"))
	b := buffers.WithHolder(t.Context(), buffers.NewHolder("b"))
	hb, err := p.Acquire(b, 48<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	da := acquireAsync(t, p, a, 32<<10)
	waitForWaiters(t, p, 1)
	hb.Release() // b was not waiting: a is served
	if err := result(t, p, da); err != nil {
		t.Fatalf("a wait another holder's release served failed: %v", err)
	}

	ha, err := p.Acquire(a, 48<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	self := acquireAsync(t, p, a, 32<<10) // fails at once...
	if err := result(t, p, self); !errors.Is(err, buffers.ErrDeadlock) {
		t.Fatalf("got %v, want ErrDeadlock", err)
	}
	anon := acquireAsync(t, p, t.Context(), 32<<10) // ...a wait without a holder is not
	waitForWaiters(t, p, 1)
	ha.Release() // what a does after its error
	if err := result(t, p, anon); err != nil {
		t.Fatalf("the wait without a holder failed: %v", err)
	}
	if st := p.Stats(); st.Deadlocks != 1 {
		t.Errorf("Deadlocks = %d, want 1", st.Deadlocks)
	}
}

// Holders that each take up to k buffers of one granule in turn, in a
// pool of 16 granules: with 12 holders and k = 2 the waiting holders hold
// at most one each, so every wait can be served and none may be reported
// (they wait often); with 8 holders and k = 3 all of them can end up
// holding two and waiting for a third, which must be reported (never
// hang), and every failure must be ErrDeadlock.
func TestHoldersRandomized(t *testing.T) {
	for _, c := range []struct{ k, n int }{{2, 12}, {3, 8}} {
		k := c.k
		p := holderPool(t)
		errs := make(chan error, c.n)
		for g := range c.n {
			go func() {
				ctx := buffers.WithHolder(t.Context(), buffers.NewHolder(string(rune('a'+g))))
				var err error
				for i := 0; i < 100 && err == nil; i++ {
					var held []*buffers.Buffer
					for range k {
						var b *buffers.Buffer
						if b, err = p.Acquire(ctx, 4096, buffers.PurposeParams); err != nil {
							break
						}
						held = append(held, b)
						time.Sleep(50 * time.Microsecond) // let the others interleave
					}
					for _, b := range held {
						b.Release()
					}
					if errors.Is(err, buffers.ErrDeadlock) && k == 3 {
						err = nil // expected; go on
					}
				}
				errs <- err
			}()
		}
		for range c.n {
			select {
			case err := <-errs:
				if err != nil {
					t.Fatalf("k=%d: %v", k, err)
				}
			case <-time.After(2 * time.Minute):
				t.Fatalf("k=%d: holders still running after 2 minutes; the pool holds: %s", k, p.Holders())
			}
		}
		st := p.Stats()
		if st.Outstanding != 0 || st.Waiting != 0 {
			t.Fatalf("k=%d: %d outstanding, %d waiting at the end", k, st.Outstanding, st.Waiting)
		}
		t.Logf("k=%d: %d acquires, %d waits, %d deadlocks reported", k, st.Acquires, st.Waits, st.Deadlocks)
	}
}
