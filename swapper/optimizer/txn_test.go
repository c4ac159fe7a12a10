package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// names returns the tensor names of specs, in registration order.
func names(specs []spec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.name
	}
	return out
}

// orderModes are the hand-over orders of a transaction: what a backward
// pass does (last layer first), any order, and some tensors left for
// Commit.
var orderModes = []string{"reverse", "random", "partial", "none"}

func order(mode string, specs []spec, rng *rand.Rand) []string {
	all := names(specs)
	switch mode {
	case "reverse":
		slices.Reverse(all)
		return all
	case "random":
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		return all
	case "partial":
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		return all[:rng.IntN(len(all))]
	}
	return nil
}

// TestTxnBitForBit: steps taken as transactions, tensors handed over in
// reverse, in random order, partly or not at all, equal the in-memory Adam
// reference bit for bit, at depths 0, 1 and 3 with one buffer set or the
// default, with states on a store or in pinned memory, and with a pool
// small enough to make the pipeline wait.
func TestTxnBitForBit(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	tight := []spec{{"a", 6 * 1024}, {"b", 3 * 1024}, {"c", 1000}, {"d", 1}}
	type variant struct {
		name      string
		memory    bool
		poolBytes int64
		specs     []spec
		sgSize    int
	}
	variants := []variant{
		{name: "nvme", specs: mixed, sgSize: 1000},
		{name: "memory", memory: true, specs: mixed, sgSize: 1000},
		// Per step of a: grad 24 KiB + master 24 KiB + 12 KiB records.
		{name: "tight-pool", poolBytes: 80 << 10, specs: tight, sgSize: 1024},
	}
	i := 0
	for _, v := range variants {
		for _, depth := range []int{0, 1, 3} {
			for _, bufCount := range []int{1, 0} {
				i++
				cfg := rigConfig{memory: v.memory, poolBytes: v.poolBytes, specs: v.specs, seed: seed + uint64(i),
					opts: optimizer.Options{SubGroupSize: v.sgSize, PipelineDepth: depth, BufferCount: bufCount, Hyper: hypers[i%len(hypers)]}}
				t.Run(fmt.Sprintf("%s/depth=%d/buffers=%d", v.name, depth, bufCount), func(t *testing.T) {
					r := newRig(t, cfg)
					rng := rand.New(rand.NewPCG(cfg.seed, 2))
					for s, mode := range orderModes {
						ord := order(mode, cfg.specs, rng)
						r.txnOrder = func() []string { return ord }
						r.mustStep()
						r.check(fmt.Sprintf("seed %d: step %d (%s %v)", seed, s+1, mode, ord))
						st := r.opt.Stats().Last
						stateBytes := 12 * int64(r.md.elements())
						if v.memory {
							stateBytes = 0
						}
						if !st.Committed || st.SubGroups != r.subGroups() || st.HandedOver != len(ord) ||
							st.BytesRead != stateBytes || st.BytesWritten != stateBytes || st.GradBytes != 4*int64(r.md.elements()) {
							t.Fatalf("step %d stats %+v: want %d sub-groups, %d handed over, %d state bytes each way",
								s+1, st, r.subGroups(), len(ord), stateBytes)
						}
						if st.Idle > st.Elapsed || st.Drain > st.Elapsed {
							t.Fatalf("step %d stats %+v: idle or drain beyond elapsed", s+1, st)
						}
					}
					// Step still works between transactions, and matches.
					r.txnOrder = nil
					r.mustStep()
					r.check("after a plain Step")
					if st := r.opt.Stats(); st.Steps != int64(len(orderModes)+1) || st.FailedSteps != 0 || st.AbortedSteps != 0 {
						t.Fatalf("stats %+v", st)
					}
				})
			}
		}
	}
}

// TestTxnWriteNoSpace: a full disk on a write-behind during a transaction
// makes Commit return ENOSPC naming a tensor, with states, parameters and
// the step count unchanged; the retry after the fault clears equals the
// reference.
func TestTxnWriteNoSpace(t *testing.T) {
	for _, depth := range []int{0, 1, 3} {
		for _, bufCount := range []int{1, 0} {
			for _, nth := range []int{1, 5, 11} { // 11 sub-groups: first, middle, last write
				t.Run(fmt.Sprintf("depth=%d/buffers=%d/nth=%d", depth, bufCount, nth), func(t *testing.T) {
					r := newRig(t, rigConfig{specs: mixed, seed: uint64(nth),
						opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth, BufferCount: bufCount}})
					rng := rand.New(rand.NewPCG(uint64(nth), uint64(depth)))
					mode := orderModes[(nth+depth)%len(orderModes)]
					r.txnOrder = func() []string { return order(mode, mixed, rng) }
					r.mustStep()
					failedStep(t, r, context.Background(), aio.ErrNoSpace, "write-behind", func() {
						r.inj.Add(faults.Rule{Kind: faults.Writes, Nth: nth, Err: syscall.ENOSPC})
					}, r.inj.Clear)
					if h := r.inj.Hits(); h != 1 {
						t.Fatalf("fault fired %d times", h)
					}
				})
			}
		}
	}
}

// TestTxnReadIOError: the same for a failing state read.
func TestTxnReadIOError(t *testing.T) {
	for _, depth := range []int{0, 3} {
		r := newRig(t, rigConfig{specs: mixed, seed: 21,
			opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth, BufferCount: 2}})
		r.txnOrder = func() []string { return []string{"w2", "ln"} }
		r.mustStep()
		failedStep(t, r, context.Background(), aio.ErrIO, "read-ahead", func() {
			r.inj.Add(faults.Rule{Kind: faults.Reads, Nth: 3, Err: syscall.EIO})
		}, r.inj.Clear)
	}
}

// TestTxnEarlyFailure: once a handed-over tensor failed in the background,
// Tensor returns that failure, and Commit returns it too.
func TestTxnEarlyFailure(t *testing.T) {
	for _, depth := range []int{0, 2} {
		r := newRig(t, rigConfig{specs: mixed, seed: 3, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth}})
		r.mustStep()
		before := r.states()
		r.inj.Add(faults.Rule{Kind: faults.Writes, Nth: 1, Err: syscall.ENOSPC})
		r.grads.set(r.md.grads(2))
		txn, err := r.opt.BeginStep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Tensor("ln"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			err = txn.Tensor("ln")
			if !errors.Is(err, optimizer.ErrHandedOver) || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		var oe *optimizer.Error
		if !errors.Is(err, aio.ErrNoSpace) || !errors.As(err, &oe) || oe.Tensor != "ln" || oe.Op != "write-behind" {
			t.Fatalf("Tensor after a background failure: %v", err)
		}
		if cerr := txn.Commit(context.Background()); !errors.Is(cerr, aio.ErrNoSpace) || cerr.Error() != err.Error() {
			t.Fatalf("Commit: %v, want %v", cerr, err)
		}
		r.inj.Clear()
		if !equalStates(before, r.states()) || r.opt.StepCount() != 1 {
			t.Fatal("a failed transaction changed the states")
		}
		r.checkStoreClean("after the failed transaction")
		r.mustStep()
		r.check("after the retry")
	}
}

// TestTxnCommitCancel: cancelling Commit's context while it waits fails
// the step (naming the tensor in progress) and changes nothing.
func TestTxnCommitCancel(t *testing.T) {
	r := newRig(t, rigConfig{specs: mixed, seed: 6, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
	r.mustStep()
	before := r.states()
	r.grads.set(r.md.grads(2))
	entered := make(chan struct{})
	r.grads.hook = func(ctx context.Context, name string) error {
		if name == "w2" {
			close(entered)
			<-ctx.Done() // the gradient never comes
			return ctx.Err()
		}
		return nil
	}
	txn, err := r.opt.BeginStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Tensor("ln"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-entered // Commit queued w2 and waits for it
		cancel()
	}()
	err = txn.Commit(ctx)
	var oe *optimizer.Error
	if !errors.Is(err, context.Canceled) || !errors.As(err, &oe) || oe.Tensor != "w2" || oe.Op != "grad" {
		t.Fatalf("Commit with a cancelled context: %v", err)
	}
	r.grads.hook = nil
	if !equalStates(before, r.states()) || r.opt.StepCount() != 1 {
		t.Fatal("a cancelled transaction changed the states")
	}
	r.checkStoreClean("after the cancelled transaction")
	r.mustStep()
	r.check("after the retry")
}

// TestTxnMisuse: refused calls and what an open transaction refuses.
func TestTxnMisuse(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, rigConfig{specs: mixed, seed: 10, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 2}})
	r.mustStep()
	before := r.states()
	r.grads.set(r.md.grads(2))
	txn, err := r.opt.BeginStep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if txn.Step() != 2 {
		t.Fatalf("transaction step %d, want 2", txn.Step())
	}
	if err := txn.Tensor("w1"); err != nil {
		t.Fatal(err)
	}
	var oe *optimizer.Error
	if err := txn.Tensor("w1"); !errors.Is(err, optimizer.ErrHandedOver) || !errors.As(err, &oe) || oe.Tensor != "w1" {
		t.Fatalf("Tensor twice: %v", err)
	}
	if err := txn.Tensor("nope"); !errors.Is(err, optimizer.ErrNotRegistered) || !errors.As(err, &oe) || oe.Tensor != "nope" {
		t.Fatalf("Tensor unknown: %v", err)
	}
	if _, err := r.opt.BeginStep(ctx); !errors.Is(err, optimizer.ErrStepOpen) {
		t.Fatalf("BeginStep while open: %v", err)
	}
	if err := r.opt.Step(ctx); !errors.Is(err, optimizer.ErrStepOpen) {
		t.Fatalf("Step while open: %v", err)
	}
	if err := r.opt.Register("new", make([]float32, 3)); !errors.Is(err, optimizer.ErrStepOpen) {
		t.Fatalf("Register while open: %v", err)
	}
	st := before["b1"]
	if err := r.opt.LoadState(ctx, "b1", st.p, st.m, st.v, 1); !errors.Is(err, optimizer.ErrStepOpen) {
		t.Fatalf("LoadState while open: %v", err)
	}
	// ReadState works meanwhile and shows the committed step.
	if !equalStates(before, r.states()) {
		t.Fatal("ReadState during a transaction does not show the committed states")
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatalf("Commit after refused calls: %v", err)
	}
	r.md.refStep()
	r.check("after the commit")
	if err := txn.Commit(ctx); !errors.Is(err, optimizer.ErrStepEnded) {
		t.Fatalf("Commit twice: %v", err)
	}
	if err := txn.Tensor("b1"); !errors.Is(err, optimizer.ErrStepEnded) {
		t.Fatalf("Tensor after Commit: %v", err)
	}
	txn.Abort() // no-op
	r.check("after Abort of a committed transaction")
	if st := r.opt.Stats(); st.Steps != 2 || st.FailedSteps != 0 || st.AbortedSteps != 0 || st.Last.HandedOver != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTxnAbort: Abort, with nothing, some or all tensors handed over,
// leaves states, parameters and the step count unchanged, holds no buffer
// or staged record afterwards, and the next transaction works.
func TestTxnAbort(t *testing.T) {
	for _, memory := range []bool{false, true} {
		for _, depth := range []int{0, 3} {
			t.Run(fmt.Sprintf("memory=%v/depth=%d", memory, depth), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: memory, specs: mixed, seed: 12,
					opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth, BufferCount: 1}})
				r.mustStep()
				ctx := context.Background()
				for i, handed := range [][]string{nil, {"ln", "w2"}, names(mixed)} {
					before := r.states()
					params := r.sink.snapshot()
					r.grads.set(r.md.grads(r.opt.StepCount() + 1))
					txn, err := r.opt.BeginStep(ctx)
					if err != nil {
						t.Fatal(err)
					}
					for _, name := range handed {
						if err := txn.Tensor(name); err != nil {
							t.Fatal(err)
						}
					}
					txn.Abort()
					txn.Abort()
					if err := txn.Commit(ctx); !errors.Is(err, optimizer.ErrStepEnded) {
						t.Fatalf("Commit after Abort: %v", err)
					}
					if !equalStates(before, r.states()) || r.opt.StepCount() != 1 {
						t.Fatal("Abort changed the states")
					}
					after := r.sink.snapshot()
					for k, v := range params {
						if firstDiff(v, after[k]) >= 0 {
							t.Fatalf("Abort changed committed param %s", k)
						}
					}
					r.checkStoreClean("after Abort")
					if st := r.opt.Stats(); st.AbortedSteps != int64(i+1) || st.Last.Committed || st.FailedSteps != 0 {
						t.Fatalf("stats after Abort: %+v", st)
					}
				}
				r.txnOrder = func() []string { return []string{"w1", "embed"} }
				r.mustStep()
				r.check("after the next transaction")
			})
		}
	}
}

// TestTxnClose: Close aborts an open transaction (its Commit then fails
// with ErrClosed), whether Commit has not been called yet or is waiting
// for the pipeline, and leaves no record or buffer behind.
func TestTxnClose(t *testing.T) {
	for _, memory := range []bool{false, true} {
		for _, waiting := range []bool{false, true} {
			t.Run(fmt.Sprintf("memory=%v/commit-waiting=%v", memory, waiting), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: memory, specs: mixed, seed: 19,
					opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 2}})
				r.mustStep()
				r.grads.set(r.md.grads(2))
				entered := make(chan struct{})
				var once sync.Once
				r.grads.hook = func(ctx context.Context, name string) error {
					if name == "w2" && waiting {
						once.Do(func() { close(entered) })
						<-ctx.Done() // held until Close stops the step
						return ctx.Err()
					}
					return nil
				}
				txn, err := r.opt.BeginStep(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if err := txn.Tensor("b1"); err != nil {
					t.Fatal(err)
				}
				commitErr := make(chan error, 1)
				if waiting {
					go func() { commitErr <- txn.Commit(context.Background()) }()
					<-entered
				}
				if err := r.opt.Close(); err != nil {
					t.Fatalf("Close with an open transaction: %v", err)
				}
				if !waiting {
					commitErr <- txn.Commit(context.Background())
				}
				if err := <-commitErr; !errors.Is(err, optimizer.ErrClosed) {
					t.Fatalf("Commit of a transaction Close aborted: %v", err)
				}
				if err := txn.Tensor("w1"); err == nil {
					t.Fatal("Tensor after Close succeeded")
				}
				txn.Abort()
				if r.store != nil && len(r.store.Names()) != 0 {
					t.Fatalf("store still holds %v", r.store.Names())
				}
				if got := r.pool.Stats().Outstanding; got != 0 {
					t.Fatalf("%d buffers outstanding after Close", got)
				}
				if r.opt.StepCount() != 1 || r.opt.Stats().AbortedSteps != 1 {
					t.Fatalf("after Close: step %d, stats %+v", r.opt.StepCount(), r.opt.Stats())
				}
				if _, err := r.opt.BeginStep(context.Background()); !errors.Is(err, optimizer.ErrClosed) {
					t.Fatalf("BeginStep after Close: %v", err)
				}
			})
		}
	}
}

// TestTxnOverlap: handed-over tensors are stepped before Commit is called
// (their gradients read in the background), hand-overs may come from
// several goroutines at once, and the wait for hand-overs is counted as
// Idle.
func TestTxnOverlap(t *testing.T) {
	r := newRig(t, rigConfig{specs: mixed, seed: 23, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
	r.grads.set(r.md.grads(1))
	txn, err := r.opt.BeginStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	time.Sleep(10 * time.Millisecond) // the backward pass of the last layers
	var wg sync.WaitGroup
	for _, name := range names(mixed) {
		wg.Go(func() {
			if err := txn.Tensor(name); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.grads.mu.Lock()
		reads := r.grads.reads
		r.grads.mu.Unlock()
		if reads == r.subGroups() { // one ranged read per sub-group
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d gradient slices read before Commit", reads, r.subGroups())
		}
		time.Sleep(time.Millisecond)
	}
	if err := txn.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.md.refStep()
	r.check("after the overlapped step")
	st := r.opt.Stats().Last
	if st.HandedOver != len(mixed) || st.Idle <= 0 || st.Idle > st.Elapsed || st.Drain > st.Elapsed {
		t.Fatalf("stats %+v", st)
	}
}
