package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// mixed has tensors smaller than, equal to and larger than the sub-group
// sizes used below, including partial last sub-groups.
var mixed = []spec{{"embed", 2500}, {"w1", 1000}, {"b1", 37}, {"w2", 4097}, {"ln", 1}}

var hypers = []optimizer.Hyper{
	{}, // defaults
	{LR: 1e-2, WeightDecay: 0.01, AdamW: true},
	{LR: 3e-3, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.1},
}

// TestBitForBit runs N steps through the optimizer and through plain Adam on
// in-memory slices and compares every master, exp_avg and exp_avg_sq bit,
// over backends, depths, buffer counts, sub-group sizes and checksums.
func TestBitForBit(t *testing.T) {
	const steps = 3
	i := 0
	for _, backend := range []string{aio.BackendPosix, aio.BackendUring} {
		for _, depth := range []int{0, 1, 3} {
			for _, bufCount := range []int{1, 0} {
				for _, sgSize := range []int{1000, 1 << 20} {
					for _, sums := range []bool{false, true} {
						// Every third configuration stages whole tensors
						// (a plain ParamSink), the others sub-group ranges.
						cfg := rigConfig{backend: backend, checksums: sums, paths: 1 + i%2, specs: mixed, seed: uint64(i), wholeSink: i%3 == 0,
							opts: optimizer.Options{SubGroupSize: sgSize, PipelineDepth: depth, BufferCount: bufCount, Hyper: hypers[i%len(hypers)]}}
						i++
						name := fmt.Sprintf("%s/depth=%d/buffers=%d/subgroup=%d/checksums=%v", backend, depth, bufCount, sgSize, sums)
						t.Run(name, func(t *testing.T) {
							r := newRig(t, cfg)
							r.check("registered")
							for s := 1; s <= steps; s++ {
								r.mustStep()
								r.check(fmt.Sprintf("after step %d", s))
								st := r.opt.Stats()
								stateBytes := 12 * int64(r.md.elements())
								if st.Last.BytesRead != stateBytes || st.Last.BytesWritten != stateBytes || st.Last.SubGroups != r.subGroups() {
									t.Fatalf("step stats %+v: want %d bytes read and written, %d sub-groups", st.Last, stateBytes, r.subGroups())
								}
								if st.Last.GradBytes != 4*int64(r.md.elements()) || !st.Last.Committed {
									t.Fatalf("step stats %+v", st.Last)
								}
							}
							if st := r.opt.Stats(); st.Steps != steps || st.FailedSteps != 0 || st.StateBytes != 12*int64(r.md.elements()) {
								t.Fatalf("stats %+v", st)
							}
						})
					}
				}
			}
		}
	}
}

// TestBitForBitMemory is the same with states kept in pinned memory.
func TestBitForBitMemory(t *testing.T) {
	for i, depth := range []int{0, 1, 3} {
		for _, sgSize := range []int{1000, 1 << 20} {
			t.Run(fmt.Sprintf("depth=%d/subgroup=%d", depth, sgSize), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: true, specs: mixed, seed: 7, wholeSink: sgSize == 1000 && depth == 1,
					opts: optimizer.Options{SubGroupSize: sgSize, PipelineDepth: depth, BufferCount: 1, Hyper: hypers[i]}})
				for s := 1; s <= 3; s++ {
					r.mustStep()
					r.check(fmt.Sprintf("after step %d", s))
				}
				if st := r.opt.Stats().Last; st.BytesRead != 0 || st.BytesWritten != 0 {
					t.Fatalf("memory mode moved store bytes: %+v", st)
				}
			})
		}
	}
}

// TestStagedParams checks that the sink gets each tensor's whole new master
// exactly once per step, and that nothing is published before commit.
func TestStagedParams(t *testing.T) {
	r := newRig(t, rigConfig{specs: mixed, seed: 3, opts: optimizer.Options{SubGroupSize: 700, PipelineDepth: 2}})
	r.sink.stageErr = func(name string) error {
		if got := r.sink.snapshot(); len(got) != 0 {
			t.Errorf("params visible before the first commit: %d tensors", len(got))
		}
		return nil
	}
	r.mustStep()
	r.check("step 1")
	// Second step: count stage calls per tensor.
	r.sink.mu.Lock()
	r.sink.stageErr = nil
	r.sink.mu.Unlock()
	if err := r.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.md.refStep()
	r.sink.mu.Lock()
	calls := map[string]int{}
	for k, v := range r.sink.committed {
		calls[k] = len(v)
	}
	commits := r.sink.commits
	r.sink.mu.Unlock()
	if commits != 2 {
		t.Fatalf("%d commits, want 2", commits)
	}
	for _, s := range mixed {
		if calls[s.name] != s.n {
			t.Fatalf("tensor %s: committed %d values, want %d", s.name, calls[s.name], s.n)
		}
	}
	r.check("step 2")
}

// TestStageCalledOncePerTensor counts StageUpdate calls within one step
// (a plain ParamSink), and StageRange calls (once per sub-group) with a
// RangeSink.
func TestStageCalledOncePerTensor(t *testing.T) {
	for _, whole := range []bool{true, false} {
		const sgs = 300
		r := newRig(t, rigConfig{specs: mixed, seed: 4, wholeSink: whole, opts: optimizer.Options{SubGroupSize: sgs, PipelineDepth: 3}})
		counts := map[string]int{}
		r.sink.stageErr = func(name string) error { counts[name]++; return nil } // called on the update goroutine only
		r.mustStep()
		for _, s := range mixed {
			want := 1
			if !whole {
				want = (s.n + sgs - 1) / sgs
			}
			if counts[s.name] != want {
				t.Fatalf("whole=%v: %s staged %d times in one step, want %d", whole, s.name, counts[s.name], want)
			}
		}
		r.check("step 1")
	}
}

// TestScale: optimizer states four times the pinned pool, a pool small
// enough to make the pipeline wait.
func TestScale(t *testing.T) {
	specs := make([]spec, 8)
	for i := range specs {
		specs[i] = spec{fmt.Sprintf("layer%d", i), 43691}
	}
	const poolBytes = 1 << 20
	for _, backend := range []string{aio.BackendPosix, aio.BackendUring} {
		for _, depth := range []int{0, 3} {
			t.Run(fmt.Sprintf("%s/depth=%d", backend, depth), func(t *testing.T) {
				r := newRig(t, rigConfig{backend: backend, poolBytes: poolBytes, specs: specs, seed: 11, checksums: true,
					opts: optimizer.Options{SubGroupSize: 8192, PipelineDepth: depth, BufferCount: 7}})
				if sb := r.opt.Stats().StateBytes; sb < 4*poolBytes {
					t.Fatalf("states %d bytes are not 4x the pool (%d)", sb, poolBytes)
				}
				for s := 1; s <= 2; s++ {
					r.mustStep()
				}
				r.check("after 2 steps")
				ps := r.pool.Stats()
				t.Logf("pool peak %d of %d bytes, %d waits; states %d bytes", ps.PeakInUseBytes, ps.CapacityBytes, ps.Waits, r.opt.Stats().StateBytes)
				if depth > 0 && ps.Waits == 0 {
					t.Fatalf("a pool this small should have made the pipeline wait")
				}
			})
		}
	}
}

// TestSmallPoolBackpressure: a pool that holds only two records beside a
// tensor's gradient, at depth 3 with many buffer sets: the pipeline waits.
func TestSmallPoolBackpressure(t *testing.T) {
	specs := []spec{{"a", 6 * 1024}, {"b", 3 * 1024}}
	// Per step of a: grad 24 KiB + master 24 KiB + records of 12 KiB.
	r := newRig(t, rigConfig{poolBytes: 80 << 10, specs: specs, seed: 5,
		opts: optimizer.Options{SubGroupSize: 1024, PipelineDepth: 3, BufferCount: 16}})
	for s := 1; s <= 3; s++ {
		r.mustStep()
	}
	r.check("after 3 steps")
	if w := r.pool.Stats().Waits; w == 0 {
		t.Fatal("expected Acquire to wait")
	}
}

// TestResume: states read out and loaded into a fresh optimizer continue
// exactly as the original does.
func TestResume(t *testing.T) {
	for _, memory := range []bool{false, true} {
		t.Run(fmt.Sprintf("memory=%v", memory), func(t *testing.T) {
			cfg := rigConfig{memory: memory, specs: mixed, seed: 9, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}}
			a := newRig(t, cfg)
			a.mustStep()
			a.mustStep()
			saved := a.states()

			b := newRig(t, cfg) // registered with the initial masters
			for name, st := range saved {
				if err := b.opt.LoadState(context.Background(), name, st.p, st.m, st.v, a.opt.StepCount()); err != nil {
					t.Fatal(err)
				}
			}
			if b.opt.StepCount() != 2 {
				t.Fatalf("StepCount after load = %d", b.opt.StepCount())
			}
			b.md = a.md // the same reference
			a.mustStep()
			if err := b.step(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !equalStates(a.states(), b.states()) {
				t.Fatal("resumed optimizer diverged")
			}
			a.check("original")
		})
	}
}

func TestValidation(t *testing.T) {
	_, err := optimizer.New(optimizer.Options{SubGroupSize: -1, PipelineDepth: -2, Hyper: optimizer.Hyper{Beta1: 1.5, LR: -1},
		UpdateWorkers: optimizer.MaxUpdateWorkers + 1, Kernel: "sse9"})
	if err == nil {
		t.Fatal("New accepted bad options")
	}
	for _, want := range []string{"Options.Pool", "Options.Grads", "Options.SubGroupSize", "Options.PipelineDepth", "Hyper.Beta1", "Hyper.LR",
		"Options.UpdateWorkers = 1025", `Options.Kernel = "sse9"`, "allowed: auto, scalar"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}

	r := newRig(t, rigConfig{specs: []spec{{"x", 10}}, opts: optimizer.Options{SubGroupSize: 4}})
	if err := r.opt.Register("x", make([]float32, 3)); !errors.Is(err, optimizer.ErrRegistered) {
		t.Fatalf("duplicate Register: %v", err)
	}
	if _, _, _, err := r.opt.ReadState(context.Background(), "nope"); !errors.Is(err, optimizer.ErrNotRegistered) {
		t.Fatalf("ReadState unknown: %v", err)
	}
	if err := r.opt.LoadState(context.Background(), "x", make([]float32, 10), make([]float32, 9), make([]float32, 10), 1); !errors.Is(err, optimizer.ErrLength) {
		t.Fatalf("LoadState short: %v", err)
	}
	if got := r.opt.Names(); len(got) != 1 || got[0] != "x" {
		t.Fatalf("Names = %v", got)
	}
	// A sub-group whose record cannot fit the pool.
	big := newRig(t, rigConfig{poolBytes: 64 << 10, opts: optimizer.Options{SubGroupSize: 1 << 20}})
	err = big.opt.Register("huge", make([]float32, 100_000))
	if !errors.Is(err, optimizer.ErrPoolTooSmall) || !strings.Contains(err.Error(), "huge") {
		t.Fatalf("Register too large: %v", err)
	}
	// In memory, two copies of the states must fit.
	mem := newRig(t, rigConfig{memory: true, poolBytes: 64 << 10, opts: optimizer.Options{SubGroupSize: 1024}})
	if err := mem.opt.Register("m", make([]float32, 3000)); !errors.Is(err, optimizer.ErrPoolTooSmall) {
		t.Fatalf("Register in memory beyond the pool: %v", err)
	}
	if got := mem.pool.Stats().Outstanding; got != 0 {
		t.Fatalf("failed Register left %d buffers", got)
	}
}

func TestClose(t *testing.T) {
	for _, memory := range []bool{false, true} {
		r := newRig(t, rigConfig{memory: memory, specs: mixed, opts: optimizer.Options{SubGroupSize: 1000}})
		r.mustStep()
		if err := r.opt.Close(); err != nil {
			t.Fatal(err)
		}
		if err := r.opt.Close(); !errors.Is(err, optimizer.ErrClosed) {
			t.Fatalf("second Close: %v", err)
		}
		if err := r.step(context.Background()); !errors.Is(err, optimizer.ErrClosed) {
			t.Fatalf("Step after Close: %v", err)
		}
		if r.store != nil && len(r.store.Names()) != 0 {
			t.Fatalf("store still holds %v", r.store.Names())
		}
		if got := r.pool.Stats().Outstanding; got != 0 {
			t.Fatalf("%d buffers outstanding after Close", got)
		}
	}
}

// TestPinnedPoolBound: with a store, nothing is held between steps, and the
// peak during a step, taken by Step or as a transaction, stays within the
// documented bound.
func TestPinnedPoolBound(t *testing.T) {
	specs := []spec{{"a", 4096}, {"b", 4096}, {"c", 4096}}
	const sg = 512
	for _, txn := range []bool{false, true} {
		r := newRig(t, rigConfig{specs: specs, seed: 2, opts: optimizer.Options{SubGroupSize: sg, PipelineDepth: 2, BufferCount: 3}})
		if txn {
			r.txnOrder = func() []string { return []string{"c", "b", "a"} }
		}
		r.mustStep()
		r.check("step 1")
		// BufferCount records, plus gradient and new master of at most two
		// tensors (the one finishing and the one being read ahead), each
		// rounded up to the pool's granule.
		granule := int64(r.pool.MinBufferBytes())
		up := func(n int64) int64 { return (n + granule - 1) / granule * granule }
		bound := 3*up(12*sg) + 2*2*up(4*4096)
		if peak := r.pool.Stats().PeakInUseBytes; peak > bound {
			t.Fatalf("txn=%v: peak pinned use %d bytes exceeds %d", txn, peak, bound)
		}
	}
}

// ownWaiter is a sink's own named waiter type, as swapper/param declares.
type ownWaiter interface{ Wait() error }

// ownSink is a ParamSink in all but the name of StageUpdate's result type.
type ownSink struct{ inner *fakeSink }

func (s ownSink) StageUpdate(ctx context.Context, name string, values []float32) (ownWaiter, error) {
	w, err := s.inner.StageUpdate(ctx, name, values)
	if err != nil {
		return nil, err
	}
	return w, nil
}
func (s ownSink) CommitUpdates() error { return s.inner.CommitUpdates() }
func (s ownSink) DiscardUpdates()      { s.inner.DiscardUpdates() }

// TestSinkOf runs steps through a sink adapted with SinkOf.
func TestSinkOf(t *testing.T) {
	r := newRig(t, rigConfig{specs: mixed, seed: 17, noParams: true, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
	sink := newFakeSink()
	opt, err := optimizer.New(optimizer.Options{Store: r.store, Pool: r.pool, Grads: r.grads, Prefix: "adapted",
		Params: optimizer.SinkOf[ownWaiter](ownSink{sink}), SubGroupSize: 1000, PipelineDepth: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Close()
	for _, s := range mixed {
		if err := opt.Register(s.name, r.md.p[s.name]); err != nil {
			t.Fatal(err)
		}
	}
	r.grads.set(r.md.grads(1))
	if err := opt.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.mustStep()
	got := sink.snapshot()
	for _, s := range mixed {
		if i := firstDiff(got[s.name], r.md.p[s.name]); i >= 0 {
			t.Fatalf("adapted sink: %s differs at %d", s.name, i)
		}
	}
}
