package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/zinfio/zinf/swapper/optimizer"
)

// watchdog returns a context that is cancelled after d, failing the test
// with the pool's stats, so a step that waits forever on the pool shows
// where the memory went instead of hanging the test binary.
func watchdog(t *testing.T, pool *buffers.Pool, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	timer := time.AfterFunc(d, func() {
		t.Errorf("watchdog: no progress after %v; pool stats %+v", d, pool.Stats())
		cancel()
	})
	t.Cleanup(func() { timer.Stop(); cancel() })
	return ctx
}

// TestPinnedNeedExactPool: for random tensor shapes (empty partitions
// included) and options, a pool of exactly optimizer.PinnedNeedBytes lets
// steps (plain and transactions) through, bit for bit, and its peak use
// stays within that figure.
func TestPinnedNeedExactPool(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	sgSizes := []int{16, 64, 333, 1000, 4096}
	for i := range 12 {
		specs := make([]spec, 1+rng.IntN(5))
		for j := range specs {
			n := rng.IntN(3000)
			if rng.IntN(5) == 0 {
				n = 0
			}
			specs[j] = spec{fmt.Sprintf("t%d", j), n}
		}
		cfg := rigConfig{memory: rng.IntN(3) == 0, checksums: rng.IntN(2) == 0, paths: 1 + rng.IntN(2),
			wholeSink: rng.IntN(4) == 0, exactPool: true, specs: specs, seed: uint64(i),
			opts: optimizer.Options{SubGroupSize: sgSizes[rng.IntN(len(sgSizes))], PipelineDepth: rng.IntN(4), BufferCount: rng.IntN(8)}}
		txn := rng.IntN(2) == 0
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			r := newRig(t, cfg)
			if txn {
				r.txnOrder = func() []string {
					n := names(specs)
					rng.Shuffle(len(n), func(a, b int) { n[a], n[b] = n[b], n[a] })
					return n
				}
			}
			ctx := watchdog(t, r.pool, 30*time.Second)
			for s := 1; s <= 2; s++ {
				if err := r.step(ctx); err != nil {
					t.Fatalf("config %+v: step %d in a pool of exactly %d bytes: %v (pool %+v)", cfg, s, cfg.poolBytes, err, r.pool.Stats())
				}
				r.md.refStep()
			}
			r.check("after 2 steps")
			if ps := r.pool.Stats(); ps.PeakInUseBytes > ps.CapacityBytes {
				t.Fatalf("peak %d beyond the need %d", ps.PeakInUseBytes, ps.CapacityBytes)
			}
		})
	}
}

// TestPinnedNeedIndependentOfLargestTensor: the need grows with the
// sub-group size and the pipeline, not with the tensors.
func TestPinnedNeedIndependentOfLargestTensor(t *testing.T) {
	r := newRig(t, rigConfig{})
	opts := optimizer.Options{Store: r.store, Pool: r.pool, Grads: r.grads, SubGroupSize: 1000, PipelineDepth: 2, BufferCount: 5}
	small := optimizer.PinnedNeedBytes(opts, []int{1000, 1000, 1000, 1000, 1000}, nil)
	huge := optimizer.PinnedNeedBytes(opts, []int{1000, 10_000_000, 3, 0}, nil)
	if small != huge || small == 0 {
		t.Fatalf("need with 1000-element tensors %d, with a 10M-element tensor %d: want equal", small, huge)
	}
	opts.PipelineDepth = 0
	if one := optimizer.PinnedNeedBytes(opts, []int{10_000_000}, nil); one*5 != huge {
		t.Fatalf("need at depth 0 %d, at depth 2 with 5 buffers %d: want a fifth", one, huge)
	}
	if n := optimizer.PinnedNeedBytes(opts, []int{0, 0}, nil); n != 0 {
		t.Fatalf("empty partitions need %d bytes", n)
	}
	// Without a store the records themselves live in the pool.
	opts.Store = nil
	if a, b := optimizer.PinnedNeedBytes(opts, []int{1000}, nil), optimizer.PinnedNeedBytes(opts, []int{1000, 1000}, nil); b <= a {
		t.Fatalf("in memory, a second tensor's records add nothing: %d then %d", a, b)
	}
}

// gradRun is an optimizer fed by a real grad swapper, both on stores and
// one pool, as the runtime wires them.
type gradRun struct {
	pool  *buffers.Pool
	grads *grad.Swapper
	opt   *optimizer.Optimizer
	sink  *rangeSink
	md    *model
}

func newGradRun(t *testing.T, poolBytes int64, opts optimizer.Options, specs []spec, seed uint64) *gradRun {
	t.Helper()
	eng, err := aio.New(aio.Options{Backend: aio.BackendPosix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	open := func(name string) *swapper.Store {
		st, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	optStore, gradStore := open("optim"), open("grad")
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: poolBytes, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Close(); err != nil {
			t.Errorf("pool: %v", err)
		}
	})
	g, err := grad.New(grad.Options{Store: gradStore, Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	run := &gradRun{pool: pool, grads: g, sink: newRangeSink(newFakeSink()), md: newModel(specs, opts.Hyper, seed)}
	opts.Store, opts.Pool, opts.Grads, opts.Params, opts.Logger = optStore, pool, g, run.sink, slog.New(slog.DiscardHandler)
	if run.opt, err = optimizer.New(opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.opt.Close() })
	for _, s := range specs {
		if err := g.Register(s.name, s.n); err != nil {
			t.Fatal(err)
		}
		if err := run.opt.Register(s.name, run.md.p[s.name]); err != nil {
			t.Fatal(err)
		}
	}
	return run
}

// step accumulates two micro-steps' gradients (their sum is the step's
// gradient in the reference too), flushes, steps and zeroes.
func (run *gradRun) step(t *testing.T, ctx context.Context) {
	t.Helper()
	g := run.md.grads(run.md.step + 1)
	for _, s := range run.md.specs {
		half := make([]float32, s.n)
		for i, x := range g[s.name] {
			half[i] = x / 2 // exact: a power of two
		}
		for range 2 {
			if err := run.grads.Accumulate(ctx, s.name, half); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := run.grads.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := run.opt.Step(ctx); err != nil {
		t.Fatalf("step %d: %v (pool %+v)", run.md.step+1, err, run.pool.Stats())
	}
	run.grads.Zero()
	run.md.refStep()
}

func (run *gradRun) check(t *testing.T) {
	t.Helper()
	committed := run.sink.snapshot()
	for _, s := range run.md.specs {
		p, m, v, err := run.opt.ReadState(context.Background(), s.name)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			what      string
			got, want []float32
		}{{"master", p, run.md.p[s.name]}, {"exp_avg", m, run.md.m[s.name]}, {"exp_avg_sq", v, run.md.v[s.name]}, {"param", committed[s.name], run.md.p[s.name]}} {
			if len(c.want) == 0 && len(c.got) == 0 {
				continue
			}
			if i := firstDiff(c.got, c.want); i >= 0 {
				t.Fatalf("%s of %s differs at %d", c.what, s.name, i)
			}
		}
	}
	if errs := run.sink.rangeErrors(); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// TestLargestTensorEightSubGroups: a model whose largest tensor is 8x the
// sub-group trains, bit for bit, with the gradient swapper on a store, in
// a pool of the optimizer's and the gradient swapper's PinnedNeedBytes,
// which is below 3x that tensor (before, a step held the tensor's
// gradient, its new master and the gradient read's staging copy at once).
func TestLargestTensorEightSubGroups(t *testing.T) {
	// 16000 elements make a sub-group's record and gradient slice (with
	// the store's alignment slack) fill one 256 KiB pool block.
	const sg = 16000
	specs := []spec{{"big", 8 * sg}, {"mid", 3*sg + 5}, {"bias", 7}, {"empty", 0}}
	opts := optimizer.Options{SubGroupSize: sg, PipelineDepth: 1, BufferCount: 3}
	largest := int64(4 * 8 * sg)

	// Size the pool with stand-ins sharing the real ones' alignment.
	probe := newGradRun(t, 8<<20, opts, specs[:1], 1)
	parts := []int{}
	for _, s := range specs {
		parts = append(parts, s.n)
	}
	po := probe.opt.Options()
	optNeed := optimizer.PinnedNeedBytes(po, parts, nil)
	gradNeed := grad.PinnedNeedBytes(grad.Options{Store: gradStoreOf(t, probe), Pool: probe.pool}, parts, nil)
	poolBytes := optNeed + gradNeed
	t.Logf("largest tensor %d bytes; pool %d bytes (optimizer %d + gradients %d) = %.2fx the largest tensor",
		largest, poolBytes, optNeed, gradNeed, float64(poolBytes)/float64(largest))
	if poolBytes >= 3*largest {
		t.Fatalf("pool %d bytes is not below 3x the largest tensor (%d)", poolBytes, 3*largest)
	}

	run := newGradRun(t, poolBytes, opts, specs, 2)
	ctx := watchdog(t, run.pool, 60*time.Second)
	for range 3 {
		run.step(t, ctx)
	}
	run.check(t)
	ps := run.pool.Stats()
	t.Logf("pool peak %d of %d bytes (%.2fx the largest tensor)", ps.PeakInUseBytes, ps.CapacityBytes, float64(ps.PeakInUseBytes)/float64(largest))
}

// gradStoreOf returns a store aligned like the grad swapper's of run, for
// sizing only.
func gradStoreOf(t *testing.T, run *gradRun) *swapper.Store {
	t.Helper()
	eng, err := aio.New(aio.Options{Backend: aio.BackendPosix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	st, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: "size"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestSmallPoolLargeTensorRegression: 4 MiB of pinned memory and
// sub-groups of 16384 elements with a 400000-element tensor. Register used
// to accept it and Step then waited forever (the gradient read's own
// staging buffer was not counted); now the step needs no tensor-sized
// buffer and completes.
func TestSmallPoolLargeTensorRegression(t *testing.T) {
	for _, depth := range []int{0, 2} {
		t.Run(fmt.Sprintf("depth=%d", depth), func(t *testing.T) {
			run := newGradRun(t, 4<<20, optimizer.Options{SubGroupSize: 16384, PipelineDepth: depth}, []spec{{"w", 400_000}}, 3)
			ctx := watchdog(t, run.pool, 60*time.Second)
			for range 2 {
				run.step(t, ctx)
			}
			run.check(t)
		})
	}
}

// TestEmptyPartition: a rank whose partition of a tensor is empty (world
// 4, a 5-element tensor on rank 3) registers it at no cost, and steps,
// ReadState, StateRecords and snapshots treat it as empty.
func TestEmptyPartition(t *testing.T) {
	for _, memory := range []bool{false, true} {
		t.Run(fmt.Sprintf("memory=%v", memory), func(t *testing.T) {
			specs := []spec{{"w", 1500}, {"tiny", 0}, {"b", 3}}
			r := newRig(t, rigConfig{memory: memory, specs: specs, seed: 31, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
			if st := r.opt.Stats(); st.Tensors != 3 || st.SubGroups != 3 || st.Elements != 1503 {
				t.Fatalf("stats %+v", st)
			}
			r.mustStep()
			r.mustStep()
			r.check("after 2 steps")
			p, m, v, err := r.opt.ReadState(context.Background(), "tiny")
			if err != nil || len(p) != 0 || len(m) != 0 || len(v) != 0 {
				t.Fatalf("ReadState of an empty partition: %d %d %d %v", len(p), len(m), len(v), err)
			}
			if err := r.opt.LoadState(context.Background(), "tiny", nil, nil, nil, 2); err != nil {
				t.Fatalf("LoadState of an empty partition: %v", err)
			}
			recs, ok := r.opt.StateRecords("tiny")
			if memory {
				snap, err := r.opt.SnapshotStates("tiny")
				if err != nil {
					t.Fatal(err)
				}
				defer snap.Release()
				if n, ok := snap.Len("tiny"); !ok || n != 0 {
					t.Fatalf("snapshot Len = %d, %v", n, ok)
				}
				if err := snap.Read("tiny", optimizer.Master, nil); err != nil {
					t.Fatalf("snapshot Read: %v", err)
				}
			} else if !ok || len(recs) != 0 {
				t.Fatalf("StateRecords of an empty partition: %v, %v", recs, ok)
			}
			r.rsink.mu.Lock()
			calls := r.rsink.stageCalls["tiny"]
			r.rsink.mu.Unlock()
			if calls != 0 {
				t.Fatalf("an empty partition was staged %d times", calls)
			}
		})
	}
}

// TestRegisterAllOrNothing: a Register that fails, because a store write
// runs out of space or the pool is too small, leaves nothing of the
// tensor behind, and registering it again works.
func TestRegisterAllOrNothing(t *testing.T) {
	r := newRig(t, rigConfig{specs: []spec{{"a", 100}}, seed: 41, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: 1}})
	r.mustStep()
	keysBefore := strings.Join(r.store.Names(), ",")
	master := make([]float32, 3500) // 4 sub-groups; the third write fails
	for i := range master {
		master[i] = float32(i) / 7
	}
	r.inj.Add(faults.Rule{Kind: faults.Writes, Nth: 3, Err: syscall.ENOSPC})
	err := r.opt.Register("late", master)
	if !errors.Is(err, aio.ErrNoSpace) {
		t.Fatalf("Register with a full disk: %v", err)
	}
	r.inj.Clear()
	if got := strings.Join(r.store.Names(), ","); got != keysBefore {
		t.Fatalf("a failed Register left store keys: %s (before: %s)", got, keysBefore)
	}
	if got := r.opt.Names(); len(got) != 1 {
		t.Fatalf("a failed Register is listed: %v", got)
	}
	if st := r.opt.Stats(); st.Tensors != 1 || st.Elements != 100 {
		t.Fatalf("a failed Register is counted: %+v", st)
	}
	if got := r.pool.Stats().Outstanding; got != 0 {
		t.Fatalf("a failed Register holds %d buffers", got)
	}
	if err := r.opt.Register("late", master); err != nil {
		t.Fatalf("Register again: %v", err)
	}
	p, _, _, err := r.opt.ReadState(context.Background(), "late")
	if err != nil || firstDiff(p, master) >= 0 {
		t.Fatalf("re-registered master differs: %v", err)
	}

	// A pool too small: refused before anything is written.
	small := newRig(t, rigConfig{poolBytes: 64 << 10, opts: optimizer.Options{SubGroupSize: 1 << 20}})
	if err := small.opt.Register("huge", make([]float32, 100_000)); !errors.Is(err, optimizer.ErrPoolTooSmall) {
		t.Fatalf("Register beyond the pool: %v", err)
	}
	if n := len(small.store.Names()); n != 0 || len(small.opt.Names()) != 0 {
		t.Fatalf("a refused Register left %d store keys, names %v", n, small.opt.Names())
	}
	if err := small.opt.Register("huge", make([]float32, 1000)); err != nil {
		t.Fatalf("Register of the name with a size that fits: %v", err)
	}
}

// TestAutoPipelineDepth: the depth that keeps a number of bytes of
// sub-group buffers in flight each way is those bytes over the largest
// sub-group's block, rounded up, between 1 and MaxPipelineDepth; tensors
// larger than a sub-group count as one sub-group, and a step at that
// depth and its buffer sets runs in a pool of exactly PinnedNeedBytes.
func TestAutoPipelineDepth(t *testing.T) {
	r := newRig(t, rigConfig{})
	opts := optimizer.Options{Store: r.store, Pool: r.pool, Grads: r.grads, SubGroupSize: 1000}
	parts := []int{1000, 3, 250_000, 0}
	block := optimizer.PinnedNeedBytes(opts, parts, nil) // depth 0: one slot's block
	if block <= 0 {
		t.Fatalf("a slot's block is %d bytes", block)
	}
	for _, tc := range []struct {
		bytes int64
		want  int
	}{
		{0, 1}, {1, 1}, {block, 1}, {block + 1, 2}, {5 * block, 5}, {5*block + 1, 6},
		{int64(optimizer.MaxPipelineDepth) * block, optimizer.MaxPipelineDepth}, {1000 * block, optimizer.MaxPipelineDepth},
	} {
		if d := optimizer.AutoPipelineDepth(opts, parts, nil, tc.bytes); d != tc.want {
			t.Errorf("%d bytes in flight (block %d): depth %d, want %d", tc.bytes, block, d, tc.want)
		}
	}
	if d := optimizer.AutoPipelineDepth(opts, []int{0, 0}, nil, 1<<30); d != 1 {
		t.Errorf("empty partitions: depth %d, want 1", d)
	}
	// Larger sub-groups take a shallower pipeline for the same bytes.
	big := opts
	big.SubGroupSize = 100_000
	if a, b := optimizer.AutoPipelineDepth(opts, parts, nil, 8*block), optimizer.AutoPipelineDepth(big, parts, nil, 8*block); b >= a || b != 1 {
		t.Errorf("8 small blocks in flight: depth %d with sub-groups of 1000, %d with 100000 (want fewer, 1)", a, b)
	}

	// A step at the auto depth, with the buffer sets it wants, in a pool
	// of exactly the need.
	specs := []spec{{"a", 2500}, {"b", 1000}, {"c", 7}}
	d := optimizer.AutoPipelineDepth(opts, []int{2500, 1000, 7}, nil, 3*block)
	if d != 3 {
		t.Fatalf("depth %d, want 3", d)
	}
	cfg := rigConfig{exactPool: true, specs: specs, opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: d, BufferCount: 2*d + 1}}
	rr := newRig(t, cfg)
	ctx := watchdog(t, rr.pool, 30*time.Second)
	for s := 1; s <= 2; s++ {
		if err := rr.step(ctx); err != nil {
			t.Fatalf("step %d at depth %d in a pool of exactly its need: %v (pool %+v)", s, d, err, rr.pool.Stats())
		}
		rr.md.refStep()
	}
	rr.check("after 2 steps at the auto depth")
}
