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
	retries := s.Stats().Retries
	if _, err := s.ReadRange(ctx, "w", 0, n, b); err != nil {
		t.Fatalf("read after a failed write: %v, want the values", err)
	}
	// Served before the failure came back, the failure comes with the next
	// operation; read after it, the kept copy was written again first and
	// there is nothing to report.
	if rewrote := s.Stats().Retries > retries; rewrote {
		if err := s.Flush(ctx); err != nil {
			t.Fatalf("flush after the read wrote the failed gradient again: %v", err)
		}
	} else if err := s.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush after a failed write: %v, want EIO", err)
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

// TestReadRewritesFailedWrite: a read of a gradient whose write-behind
// failed (its sum kept in pinned memory) writes it again before reading:
// a failure that does not recur is never seen, whatever the pool's room
// (with a single buffer the next Accumulate short of memory used to be
// the one to write it again). A failure that recurs is reported.
func TestReadRewritesFailedWrite(t *testing.T) {
	const n = 10000
	ctx := t.Context()
	g := holdGrads(7, n)
	got := make([]float32, n)
	for _, serve := range []bool{false, true} {
		s, _, inj := holdEnvWith(t, 1<<20, grad.Options{ServeWhileWriting: serve})
		if err := s.Register("w", n); err != nil {
			t.Fatal(err)
		}
		inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC, Times: 1})
		if err := s.Accumulate(ctx, "w", g); err != nil {
			t.Fatal(err)
		}
		waitFailed(t, s, 1)
		if err := s.Read(ctx, "w", got); err != nil || !slices.Equal(got, g) {
			t.Fatalf("serve %v: read after a write that failed once: %v", serve, err)
		}
		if st := s.Stats(); st.Retries != 1 {
			t.Fatalf("serve %v: %d rewrites, want 1", serve, st.Retries)
		}
		if err := s.Flush(ctx); err != nil {
			t.Fatalf("serve %v: flush: %v", serve, err)
		}
		if st := s.Stats(); st.PinnedBytes != 0 || st.Writes != 1 {
			t.Fatalf("serve %v: after the rewrite: %d pinned bytes held, %d writes done; want 0, 1", serve, st.PinnedBytes, st.Writes)
		}
	}

	// Failing again (a read that waits for the rewrite): the read reports
	// it, and the kept copy serves the next read until a write succeeds.
	s, _, inj := holdEnvWith(t, 1<<20, grad.Options{})
	if err := s.Register("w", n); err != nil {
		t.Fatal(err)
	}
	inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC, Times: 2})
	if err := s.Accumulate(ctx, "w", g); err != nil {
		t.Fatal(err)
	}
	waitFailed(t, s, 1)
	if err := s.Read(ctx, "w", got); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("read when the rewrite fails too: %v, want ENOSPC", err)
	}
	if err := s.Read(ctx, "w", got); err != nil || !slices.Equal(got, g) {
		t.Fatalf("the kept copy after the failures: %v", err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("flush once the disk has room: %v", err)
	}
}

// TestAccumulateWaitsPastAnotherWrite: with room for two gradient buffers,
// one holding a sum whose write failed and one whose write is in flight,
// an Accumulate of a third gradient waits for the write in flight and
// takes its memory; the other's failure is not its to report (it used to
// be, once more than one write-behind could be in flight).
func TestAccumulateWaitsPastAnotherWrite(t *testing.T) {
	const n = 1000
	ctx := t.Context()
	probe, _, _ := holdEnvWith(t, 1<<20, grad.Options{})
	if err := probe.Register("x", n); err != nil {
		t.Fatal(err)
	}
	if err := probe.Accumulate(ctx, "x", holdGrads(1, n)); err != nil {
		t.Fatal(err)
	}
	buf := probe.Stats().PinnedBytes // one gradient's buffer
	s, _, inj := holdEnvWith(t, 2*buf, grad.Options{ServeWhileWriting: true})
	for _, name := range []string{"a", "b", "c"} {
		if err := s.Register(name, n); err != nil {
			t.Fatal(err)
		}
	}
	inj.Add(faults.Rule{Kind: faults.Writes, Nth: 1, Err: syscall.EIO})
	inj.Add(faults.Rule{Kind: faults.Writes, Nth: 2, Delay: 300 * time.Millisecond})
	if err := s.Accumulate(ctx, "a", holdGrads(2, n)); err != nil {
		t.Fatal(err)
	}
	waitFailed(t, s, 1)
	if err := s.Accumulate(ctx, "b", holdGrads(3, n)); err != nil {
		t.Fatal(err)
	}
	if err := s.Accumulate(ctx, "c", holdGrads(4, n)); err != nil {
		t.Fatalf("a third gradient while one write failed and one is in flight: %v", err)
	}
	if err := s.Flush(ctx); err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("the failed gradient written again: %v", err)
	}
	for i, name := range []string{"a", "b", "c"} {
		got := make([]float32, n)
		if err := s.Read(ctx, name, got); err != nil || !slices.Equal(got, holdGrads(uint64(2+i), n)) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// waitFailed waits (at most 10 s) until s counts n failed writes.
func waitFailed(t *testing.T, s *grad.Swapper, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().WriteErrors < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d failed writes after 10 s, want %d: %+v", s.Stats().WriteErrors, n, s.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}
