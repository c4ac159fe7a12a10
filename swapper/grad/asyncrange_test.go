package grad_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
)

// TestReadRangeAsync: reads of several gradients started together all
// return the accumulated sums; until Wait the gradient's operation lock
// is held (an Accumulate on it waits for the read, one on another
// gradient does not); Wait may be called again; an I/O error is reported
// by Wait, naming the gradient, and leaves the gradient usable.
func TestReadRangeAsync(t *testing.T) {
	ctx := t.Context()
	inj := faults.New(3)
	g, pool := storeSwapper(t, "async", inj)
	rng := rand.New(rand.NewPCG(4, 4))
	names := []string{"a", "b", "c"}
	want := map[string][]float32{}
	for _, n := range names {
		if err := g.Register(n, 20000); err != nil {
			t.Fatal(err)
		}
		want[n] = randGrad(rng, 20000)
		if err := g.Accumulate(ctx, n, want[n]); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	type inflight struct {
		name   string
		lo, hi int
		b      *buffers.Buffer
		r      grad.RangeRead
	}
	var reads []inflight
	for i, n := range names {
		lo, hi := 1000*i+3, 15000+i
		b, err := pool.Acquire(ctx, g.RangeBufferBytes(lo, hi), buffers.PurposeOptimizer)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		r, err := g.ReadRangeAsync(ctx, n, lo, hi, b.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		reads = append(reads, inflight{n, lo, hi, b, r})
	}
	// An Accumulate on "a" waits for a's read; one on a gradient with no
	// read in flight does not.
	if err := g.Register("d", 10); err != nil {
		t.Fatal(err)
	}
	if err := g.Accumulate(ctx, "d", make([]float32, 10)); err != nil {
		t.Fatalf("an Accumulate on another gradient: %v", err)
	}
	acc := make(chan error, 1)
	go func() { acc <- g.Accumulate(ctx, "a", make([]float32, 20000)) }()
	select {
	case err := <-acc:
		t.Fatalf("an Accumulate on a gradient being read returned before the read's Wait: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	for _, rd := range reads {
		got, err := rd.r.Wait()
		if err != nil {
			t.Fatalf("%s: %v", rd.name, err)
		}
		if len(got) != rd.hi-rd.lo {
			t.Fatalf("%s: %d values, want %d", rd.name, len(got), rd.hi-rd.lo)
		}
		for i, v := range got {
			if math.Float32bits(v) != math.Float32bits(want[rd.name][rd.lo+i]) {
				t.Fatalf("%s: element %d is %v, want %v", rd.name, rd.lo+i, v, want[rd.name][rd.lo+i])
			}
		}
		again, err2 := rd.r.Wait()
		if err2 != nil || len(again) != len(got) || &again[0] != &got[0] {
			t.Fatalf("%s: a second Wait returned %d values, %v", rd.name, len(again), err2)
		}
	}
	select {
	case err := <-acc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Accumulate waiting for the read did not finish after Wait")
	}
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// An I/O error comes back from Wait, naming the gradient.
	inj.Add(faults.Rule{Kind: faults.Reads, Nth: 1, Err: syscall.EIO})
	b := reads[1].b
	r, err := g.ReadRangeAsync(ctx, "b", 0, 100, b.Bytes())
	if err != nil {
		t.Fatalf("the read failed before it was issued: %v", err)
	}
	if _, err := r.Wait(); !errors.Is(err, syscall.EIO) || !errors.Is(err, aio.ErrIO) {
		t.Fatalf("Wait after an EIO: %v", err)
	} else if te := (*swapper.TensorError)(nil); !errors.As(err, &te) || !strings.HasSuffix(te.Tensor, "b") {
		t.Fatalf("the error does not name the gradient: %v", err)
	}
	inj.Clear()
	got, err := g.ReadRange(ctx, "b", 0, 100, b.Bytes())
	if err != nil || math.Float32bits(got[5]) != math.Float32bits(want["b"][5]) {
		t.Fatalf("reading after the failure: %v", err)
	}
	// Arguments are checked at once.
	if _, err := g.ReadRangeAsync(ctx, "a", 5, 4, b.Bytes()); err == nil {
		t.Fatal("an inverted range was accepted")
	}
	if _, err := g.ReadRangeAsync(ctx, "nope", 0, 1, b.Bytes()); !errors.Is(err, grad.ErrUnknown) {
		t.Fatalf("an unknown gradient: %v", err)
	}
}

// TestReadRangeAsyncSameGradient: ranges of one gradient on the store
// are read side by side (an optimizer step's read-ahead of a tensor's
// sub-groups): each ReadRangeAsync returns while the earlier ones are in
// flight; an Accumulate or a Zero of the gradient waits until the last
// of them is waited for; every range reads the sum. A read served from
// pinned memory is over when ReadRangeAsync returns: nothing waits for
// its Wait.
func TestReadRangeAsyncSameGradient(t *testing.T) {
	ctx := t.Context()
	g, pool := storeSwapper(t, "same", nil)
	const n = 40000
	want := randGrad(rand.New(rand.NewPCG(5, 5)), n)
	if err := g.Register("a", n); err != nil {
		t.Fatal(err)
	}
	if err := g.Accumulate(ctx, "a", want); err != nil {
		t.Fatal(err)
	}
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// within runs f under a watchdog: a call that blocks fails the test.
	within := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s blocked for 10 s (pool %+v)", what, pool.Stats())
		}
	}
	type inflight struct {
		lo, hi int
		r      grad.RangeRead
	}
	var reads []inflight
	for i := range 4 {
		lo, hi := i*10000+7*i, (i+1)*10000
		b, err := pool.Acquire(ctx, g.RangeBufferBytes(lo, hi), buffers.PurposeOptimizer)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		// A read waiting for the others would fail at the deadline.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := g.ReadRangeAsync(wctx, "a", lo, hi, b.Bytes())
		if err != nil {
			for _, rd := range reads {
				_, _ = rd.r.Wait() // so that Close does not wait for them
			}
			t.Fatalf("range read %d beside the gradient's %d other reads in flight: %v", i, len(reads), err)
		}
		reads = append(reads, inflight{lo, hi, r})
	}
	acc := make(chan error, 1)
	go func() { acc <- g.Accumulate(ctx, "a", make([]float32, n)) }()
	zero := make(chan struct{})
	for i, rd := range reads {
		select {
		case err := <-acc:
			t.Fatalf("an Accumulate returned with %d range reads of its gradient not waited for: %v", len(reads)-i, err)
		case <-time.After(30 * time.Millisecond):
		}
		got, err := rd.r.Wait()
		if err != nil {
			t.Fatalf("range [%d, %d): %v", rd.lo, rd.hi, err)
		}
		for j, v := range got {
			if math.Float32bits(v) != math.Float32bits(want[rd.lo+j]) {
				t.Fatalf("range [%d, %d): element %d is %v, want %v", rd.lo, rd.hi, rd.lo+j, v, want[rd.lo+j])
			}
		}
	}
	select {
	case err := <-acc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Accumulate did not finish after the reads' Waits")
	}
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Zero waits for a read in flight too.
	b, err := pool.Acquire(ctx, g.RangeBufferBytes(0, 100), buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	r, err := g.ReadRangeAsync(ctx, "a", 0, 100, b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	go func() { g.Zero(); close(zero) }()
	select {
	case <-zero:
		t.Fatal("Zero returned with a range read of the gradient not waited for")
	case <-time.After(50 * time.Millisecond):
	}
	if got, err := r.Wait(); err != nil || math.Float32bits(got[3]) != math.Float32bits(want[3]) {
		t.Fatalf("the read beside Zero: %v", err)
	}
	select {
	case <-zero:
	case <-time.After(10 * time.Second):
		t.Fatal("Zero did not finish after the read's Wait")
	}

	// In pinned memory (no store) a read is a copy, over at once.
	mem, err := grad.New(grad.Options{Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if err := mem.Register("m", 1000); err != nil {
		t.Fatal(err)
	}
	if err := mem.Accumulate(ctx, "m", want[:1000]); err != nil {
		t.Fatal(err)
	}
	pending, err := mem.ReadRangeAsync(ctx, "m", 10, 20, b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	within("an Accumulate after a pinned read not waited for", func() error { return mem.Accumulate(ctx, "m", want[:1000]) })
	if got, err := pending.Wait(); err != nil || math.Float32bits(got[0]) != math.Float32bits(want[10]) {
		t.Fatalf("the pinned read: %v %v", got, err)
	}
}

// storeSwapper is a gradient swapper on a store of its own (posix engine,
// checksums, the given fault injector or none) with an 8 MiB pool, all
// closed at the test's end.
func storeSwapper(t *testing.T, name string, inj *faults.Injector) (*grad.Swapper, *buffers.Pool) {
	t.Helper()
	opts := aio.Options{Backend: aio.BackendPosix, Logger: slog.New(slog.DiscardHandler)}
	if inj != nil {
		opts.Faults = inj
	}
	eng, err := aio.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	st, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: name, Checksums: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pool := newPool(t, 8<<20)
	g, err := grad.New(grad.Options{Store: st, Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g, pool
}
