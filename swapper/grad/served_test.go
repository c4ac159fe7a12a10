package grad_test

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper/grad"
)

// TestReadServedWhileWriting: with Options.ServeWhileWriting, a gradient
// read while its write-behind is still in flight (the optimizer reading a
// layer just handed over) is copied from the pinned copy being written,
// without waiting for the write and without a store read: Read and
// ReadRange return the values well before the slowed write completes, and
// the pinned copy is given back once the write is done. A write that
// fails is still reported, by Flush (what the runtime's Step calls before
// it commits) when a read was served meanwhile, and the copy the failure
// keeps serves the reads after it until a write succeeds.
func TestReadServedWhileWriting(t *testing.T) {
	const n, delay = 10000, 2 * time.Second
	ctx := t.Context()
	s, _, inj := holdEnvWith(t, 1<<20, grad.Options{ServeWhileWriting: true})
	if err := s.Register("w", n); err != nil {
		t.Fatal(err)
	}
	g := holdGrads(5, n)
	inj.Add(faults.Rule{Kind: faults.Writes, Delay: delay, Times: 1})
	start := time.Now()
	if err := s.Accumulate(ctx, "w", g); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := s.Read(ctx, "w", got); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, s.RangeBufferBytes(100, 7000))
	part, err := s.ReadRange(ctx, "w", 100, 7000, dst)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	st := s.Stats()
	if took >= delay || st.Pending != 1 {
		t.Fatalf("the reads took %v with the write slowed by %v (%d writes in flight after them): they waited for the write", took, delay, st.Pending)
	}
	if !slices.Equal(got, g) || !slices.Equal(part, g[100:7000]) {
		t.Fatal("values served from the pinned copy differ from the gradient")
	}
	if st.ServedReads != 2 || st.ServedBytes != 4*(n+6900) || st.BytesRead != 0 {
		t.Fatalf("served %d reads / %d bytes, %d bytes read from the store; want 2 / %d / 0", st.ServedReads, st.ServedBytes, st.BytesRead, 4*(n+6900))
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.PinnedBytes != 0 || st.Writes != 1 {
		t.Fatalf("after the write: %d pinned bytes held (want 0), %d writes", st.PinnedBytes, st.Writes)
	}
	// Now on the store only: read from there, not served.
	if err := s.Read(ctx, "w", got); err != nil || !slices.Equal(got, g) {
		t.Fatalf("read from the store: %v", err)
	}
	if st := s.Stats(); st.ServedReads != 2 || st.BytesRead != 4*n {
		t.Fatalf("a settled gradient: %d served, %d bytes read from the store", st.ServedReads, st.BytesRead)
	}

	// A write that fails: the next read reports it; the copy it keeps
	// serves the read after.
	s.Zero()
	inj.Add(faults.Rule{Kind: faults.Writes, Delay: 100 * time.Millisecond, Err: syscall.EIO, Times: 1})
	if err := s.Accumulate(ctx, "w", g); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush after a failed write: %v, want EIO", err)
	}
	if _, err := s.ReadRange(ctx, "w", 0, n, make([]byte, s.RangeBufferBytes(0, n))); err != nil {
		t.Fatalf("read after the failure was reported: %v", err)
	}
	inj.Add(faults.Rule{Kind: faults.Writes, Delay: 100 * time.Millisecond, Err: syscall.EIO, Times: 1})
	if err := s.Accumulate(ctx, "w", g); err != nil { // adds g again: 2g, written behind, fails
		t.Fatal(err)
	}
	b := make([]byte, s.RangeBufferBytes(0, n))
	if _, err := s.ReadRange(ctx, "w", 0, n, b); err == nil {
		// Served before the failure came back; the failure then comes
		// with the next operation.
		if err := s.Flush(ctx); !errors.Is(err, syscall.EIO) {
			t.Fatalf("flush after a failed write: %v, want EIO", err)
		}
	} else if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read after a failed write: %v, want EIO or the values", err)
	}
	twice := make([]float32, n)
	for i := range g {
		twice[i] = g[i] + g[i]
	}
	if err := s.Read(ctx, "w", got); err != nil || !slices.Equal(got, twice) {
		t.Fatalf("after the failed write, the kept copy: %v", err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.PinnedBytes != 0 {
		t.Fatalf("%d pinned bytes held after a successful rewrite", st.PinnedBytes)
	}
}
