package grad_test

import (
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
	eng, err := aio.New(aio.Options{Backend: aio.BackendPosix, Faults: inj, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	st, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: "async", Checksums: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pool := newPool(t, 8<<20)
	g, err := grad.New(grad.Options{Store: st, Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
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
