package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestPrefetchBitForBit: a transaction that reads the first tensor's
// records ahead (StepTxn.Prefetch as it opens) and hands that tensor over
// last, after the others, equals the in-memory reference bit for bit at
// depths 0, 1 and 3, with one buffer set (nothing may be read ahead: the
// pipeline keeps a set for the tensors handed over first) and the
// default, in a roomy reservation and in one of exactly PinnedNeedBytes
// (which must not deadlock); the records were read once, and those read
// ahead were issued before the tensor's hand-over.
func TestPrefetchBitForBit(t *testing.T) {
	for _, depth := range []int{0, 1, 3} {
		for _, bufCount := range []int{1, 0} {
			for _, tight := range []bool{false, true} {
				t.Run(fmt.Sprintf("depth=%d/buffers=%d/tight=%v", depth, bufCount, tight), func(t *testing.T) {
					opts := optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth, BufferCount: bufCount, Hyper: hypers[depth%len(hypers)]}
					// Tight: the optimizer's region holds what PinnedNeedBytes
					// asks and no more, which may be fewer sets than
					// BufferCount; else a roomy region.
					reserve := int64(8 << 20)
					if tight {
						reserve = exactNeed(t, opts, mixed)
					}
					r := newRig(t, rigConfig{specs: mixed, seed: uint64(7 + depth), wholeSink: tight, reserve: reserve, opts: opts})
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					for step := 1; step <= 3; step++ {
						r.grads.set(r.md.grads(step))
						txn, err := r.opt.BeginStep(ctx)
						if err != nil {
							t.Fatal(err)
						}
						n, err := txn.Prefetch("embed")
						if err != nil {
							t.Fatal(err)
						}
						if again, err := txn.Prefetch("embed"); err != nil || again != 0 {
							t.Fatalf("second Prefetch = %d, %v; want 0, nil", again, err)
						}
						switch {
						case bufCount == 1 && n != 0:
							t.Fatalf("one buffer set: Prefetch read %d sub-groups ahead, want 0", n)
						case bufCount == 0 && !tight && n == 0:
							t.Fatal("Prefetch read nothing ahead with the default buffer sets")
						}
						for _, name := range []string{"ln", "w2", "b1", "w1"} {
							if err := txn.Tensor(name); err != nil {
								t.Fatal(err)
							}
							runtime.Gosched()
						}
						handOff := time.Now()
						if err := txn.Tensor("embed"); err != nil {
							t.Fatal(err)
						}
						if err := txn.Commit(ctx); err != nil {
							t.Fatal(err) // a deadlock ends here, at the timeout
						}
						r.md.refStep()
						r.check(fmt.Sprintf("step %d", step))
						st := r.opt.Stats().Last
						stateBytes := 12 * int64(r.md.elements())
						if st.Prefetched != n || st.BytesRead != stateBytes || st.BytesWritten != stateBytes {
							t.Fatalf("step %d: stats %+v: want %d prefetched, %d state bytes each way", step, st, n, stateBytes)
						}
						at := handOff.Sub(st.Start)
						ahead := 0
						for _, tm := range st.Timeline {
							if tm.Tensor == "embed" && tm.ReadIssued < at {
								ahead++
							}
						}
						if ahead < n {
							t.Fatalf("step %d: %d of embed's record reads issued before its hand-over at %v, want at least %d: %+v", step, ahead, at, n, st.Timeline)
						}
					}
					if in := r.pool.Stats().InUseBytes; in != 0 {
						t.Fatalf("%d pool bytes still in use after the steps", in)
					}
				})
			}
		}
	}
}

// TestPrefetchNotHandedOver: records read ahead of a tensor that is never
// handed over are used by Commit (which steps it) or, on Abort, given
// back; either way the states are the reference's and every buffer is
// back in the pool.
func TestPrefetchNotHandedOver(t *testing.T) {
	r := newRig(t, rigConfig{specs: mixed, seed: 3, reserve: 8 << 20, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
	r.grads.set(r.md.grads(1))
	txn, err := r.opt.BeginStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n, err := txn.Prefetch("w2")
	if err != nil || n == 0 {
		t.Fatalf("Prefetch = %d, %v", n, err)
	}
	txn.Abort()
	if in := r.pool.Stats().InUseBytes; in != 0 {
		t.Fatalf("%d pool bytes in use after Abort", in)
	}
	r.check("after Abort")
	if _, err := txn.Prefetch("w2"); !errors.Is(err, optimizer.ErrStepEnded) {
		t.Fatalf("Prefetch after Abort: %v, want ErrStepEnded", err)
	}

	r.prefetch = []string{"w2", "embed"}
	r.txnOrder = func() []string { return []string{"ln"} } // Commit steps the rest
	r.mustStep()
	r.check("prefetched, stepped by Commit")
	if st := r.opt.Stats().Last; st.Prefetched != r.prefetched || r.prefetched == 0 {
		t.Fatalf("Prefetched %d, Prefetch started %d", st.Prefetched, r.prefetched)
	}
	if in := r.pool.Stats().InUseBytes; in != 0 {
		t.Fatalf("%d pool bytes in use after Commit", in)
	}
}

// TestPrefetchReadFault: a failing read of a record read ahead fails the
// step at that sub-group with states, parameters and the step count
// unchanged; the retry equals the reference.
func TestPrefetchReadFault(t *testing.T) {
	for _, depth := range []int{0, 2} {
		t.Run(fmt.Sprintf("depth=%d", depth), func(t *testing.T) {
			r := newRig(t, rigConfig{specs: mixed, seed: 11, reserve: 8 << 20, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth}})
			r.prefetch = []string{"embed"}
			r.txnOrder = func() []string { return []string{"ln", "w2", "b1", "w1", "embed"} }
			r.mustStep()
			failedStep(t, r, context.Background(), aio.ErrIO, "read-ahead", func() {
				// The first read of the step is the prefetched embed record.
				r.inj.Add(faults.Rule{Kind: faults.Reads, Nth: 1, Err: syscall.EIO})
			}, r.inj.Clear)
			if r.prefetched == 0 {
				t.Fatal("nothing was read ahead")
			}
		})
	}
}

// TestPrefetchBadUse: an unknown name is refused with ErrNotRegistered
// (and leaves the transaction as it was); a tensor handed over already,
// a pool without a reservation for the optimizer and states in pinned
// memory read nothing ahead.
func TestPrefetchBadUse(t *testing.T) {
	r := newRig(t, rigConfig{specs: mixed, seed: 5, reserve: 8 << 20, opts: optimizer.Options{SubGroupSize: 1000}})
	r.grads.set(r.md.grads(1))
	txn, err := r.opt.BeginStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = txn.Prefetch("nope")
	var oe *optimizer.Error
	if !errors.Is(err, optimizer.ErrNotRegistered) || !errors.As(err, &oe) || oe.Op != "prefetch" || oe.Tensor != "nope" {
		t.Fatalf("Prefetch(unknown) = %v", err)
	}
	if err := txn.Tensor("w1"); err != nil {
		t.Fatal(err)
	}
	if n, err := txn.Prefetch("w1"); n != 0 || err != nil {
		t.Fatalf("Prefetch of a tensor handed over = %d, %v; want 0, nil", n, err)
	}
	if err := txn.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.md.refStep()
	r.check("after bad use")

	// Without a reservation of the optimizer's own, nothing is read ahead.
	shared := newRig(t, rigConfig{specs: mixed, seed: 5, opts: optimizer.Options{SubGroupSize: 1000}})
	shared.grads.set(shared.md.grads(1))
	stxn, err := shared.opt.BeginStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n, err := stxn.Prefetch("embed"); n != 0 || err != nil {
		t.Fatalf("Prefetch from the shared region = %d, %v; want 0, nil", n, err)
	}
	stxn.Abort()

	m := newRig(t, rigConfig{memory: true, specs: mixed, seed: 5, opts: optimizer.Options{SubGroupSize: 1000}})
	m.grads.set(m.md.grads(1))
	txn, err = m.opt.BeginStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	if n, err := txn.Prefetch("embed"); n != 0 || err != nil {
		t.Fatalf("Prefetch with states in pinned memory = %d, %v; want 0, nil", n, err)
	}
}
