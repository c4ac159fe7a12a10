package param

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

func TestPartition(t *testing.T) {
	cases := []struct{ numel, rank, world, lo, hi int }{
		{10, 0, 1, 0, 10},
		{10, 0, 4, 0, 3},
		{10, 3, 4, 9, 10},
		{8, 3, 4, 6, 8},
		{3, 3, 4, 3, 3}, // more ranks than elements: an empty partition
		{1, 1, 2, 1, 1},
	}
	for _, c := range cases {
		lo, hi := Partition(c.numel, c.rank, c.world)
		if lo != c.lo || hi != c.hi {
			t.Errorf("Partition(%d, %d, %d) = [%d, %d), want [%d, %d)", c.numel, c.rank, c.world, lo, hi, c.lo, c.hi)
		}
	}
	// Every element is owned by exactly one rank.
	for numel := 1; numel < 70; numel++ {
		for world := 1; world <= 9; world++ {
			next := 0
			for r := range world {
				lo, hi := Partition(numel, r, world)
				if lo != next || hi < lo {
					t.Fatalf("numel %d world %d rank %d: [%d, %d), want it to start at %d", numel, world, r, lo, hi, next)
				}
				next = hi
			}
			if next != numel {
				t.Fatalf("numel %d world %d: partitions end at %d", numel, world, next)
			}
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = New(Options{Rank: 4, WorldSize: 4, DType: 9, MaxInCPUBytes: -1, BufferCount: -2})
	if err == nil {
		t.Fatal("bad options accepted")
	}
	for _, want := range []string{"Pool", "Rank", "DType", "MaxInCPUBytes", "BufferCount"} {
		if !strings.Contains(err.Error(), "Options."+want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	if _, err := New(Options{Pool: pool, MaxInCPUBytes: 2 << 20}); err == nil || !strings.Contains(err.Error(), "pool's memory for parameters") {
		t.Errorf("cache larger than the pool: %v", err)
	}
	s, err := New(Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Register("w", 10, swapper.TierNVMe); err == nil {
		t.Error("NVMe tensor registered without a store")
	}
	if err := s.Register("w", 10, swapper.TierGPU); err == nil {
		t.Error("GPU tensor registered without a device")
	}
	if err := s.Register("w", 1<<20, swapper.TierCPU); err == nil {
		t.Error("a partition larger than the pool's largest buffer was accepted")
	}
	if err := s.Register("w", 10, swapper.TierCPU); err != nil {
		t.Fatal(err)
	}
	if err := s.Register("w", 10, swapper.TierCPU); err == nil {
		t.Error("duplicate registration accepted")
	}
	if err := s.Prefetch("nope"); !errors.Is(err, ErrUnknown) {
		t.Errorf("Prefetch of an unknown name: %v", err)
	}
	if err := s.ReadFloat32(context.Background(), "w", make([]float32, 10)); !errors.Is(err, ErrNotInitialized) {
		t.Errorf("read before Init: %v", err)
	}
	if err := s.Init(context.Background(), "w", make([]float32, 9)); err == nil {
		t.Error("Init with the wrong length accepted")
	}
}

// TestRoundTrip stores a tensor on every tier in every dtype, on world
// sizes 1 and 4, and reads every rank's partition back: fp32 exactly, bf16
// and fp16 as the conversion of the input, and the partitions put together
// cover the tensor exactly.
func TestRoundTrip(t *testing.T) {
	for _, backend := range testBackends(t) {
		for _, dt := range []swapper.DType{swapper.Float32, swapper.BFloat16, swapper.Float16} {
			for _, world := range []int{1, 4} {
				t.Run(fmt.Sprintf("%s/%s/world%d", backend, dt, world), func(t *testing.T) {
					testRoundTrip(t, backend, dt, world)
				})
			}
		}
	}
}

func testRoundTrip(t *testing.T, backend string, dt swapper.DType, world int) {
	e := newEnv(t, envOpts{backend: backend})
	dev, err := accel.NewSim(accel.SimOptions{CapacityBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ctx := testCtx(t)
	// Sizes: tiny, not a multiple of world, not a multiple of the
	// alignment, several blocks.
	numels := []int{1, 7, 1001, 40_003}
	tiers := []swapper.Tier{swapper.TierNVMe, swapper.TierCPU, swapper.TierGPU}
	full := map[string][]float32{}
	ranks := make([]*Swapper, world)
	for r := range world {
		ranks[r] = e.swapper(t, Options{Device: dev, Rank: r, WorldSize: world, DType: dt, KeyPrefix: fmt.Sprintf("rank%d/", r)})
	}
	for i, numel := range numels {
		for _, tier := range tiers {
			n := fmt.Sprintf("%s-%d", tier, i)
			full[n] = values(uint64(i*10+int(tier)), numel)
			for r, s := range ranks {
				if err := s.Register(n, numel, tier); err != nil {
					t.Fatal(err)
				}
				lo, hi := Partition(numel, r, world)
				if err := s.Init(ctx, n, full[n][lo:hi]); err != nil {
					t.Fatalf("rank %d init %s: %v", r, n, err)
				}
			}
		}
	}
	for n, want := range full {
		var got []float32
		for r, s := range ranks {
			if err := s.SwapIn(ctx, n); err != nil {
				t.Fatalf("rank %d swap-in %s: %v", r, n, err)
			}
			if st := s.State(n); st != Resident {
				t.Fatalf("rank %d %s: state %v after SwapIn", r, n, st)
			}
			part := read(t, s, n)
			got = append(got, part...)
			readAsMatches(t, s, n, part)
			s.Release(n)
		}
		sameBits(t, n, got, expect(dt, want))
	}
	if dev.UsedBytes() == 0 {
		t.Error("nothing was allocated on the device")
	}
	for _, s := range ranks {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if used := dev.UsedBytes(); used != 0 {
		t.Errorf("%d device bytes still allocated after Close", used)
	}
}

// readAsMatches checks ReadAs into every dtype against the fp32 read
// encoded in that dtype, and that it allocates no partition-sized buffer.
func readAsMatches(t *testing.T, s *Swapper, name string, part []float32) {
	t.Helper()
	ctx := context.Background()
	for _, to := range []swapper.DType{swapper.Float32, swapper.BFloat16, swapper.Float16} {
		want := make([]byte, len(part)*to.Size())
		buffers.Encode(to, want, part)
		got := make([]byte, len(want))
		if err := s.ReadAs(ctx, name, to, got); err != nil {
			t.Fatalf("%s: ReadAs %s: %v", name, to, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: ReadAs %s differs from the fp32 read encoded as %s", name, to, to)
		}
		if err := s.ReadAs(ctx, name, to, got[:len(got)/2]); len(part) > 1 && err == nil {
			t.Fatalf("%s: ReadAs %s into half a buffer succeeded", name, to)
		}
		// The partition is resident: only fixed bookkeeping may allocate,
		// never a buffer proportional to the partition.
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for range 10 {
			if err := s.ReadAs(ctx, name, to, got); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&ms1)
		if per := (ms1.TotalAlloc - ms0.TotalAlloc) / 10; len(part) >= 1000 && per >= uint64(len(part)) {
			t.Errorf("%s: ReadAs %s allocated %d bytes per call for %d elements", name, to, per, len(part))
		}
	}
}

// TestPrefetchPipeline streams many tensors through a small BufferCount
// and a tiny pool the way a forward pass does (prefetch ahead, wait, use,
// release), and through a queue of prefetches far deeper than the budget,
// consumed in the opposite order: exhaustion (of BufferCount, or with
// BufferCount 0 of the pool) waits, it never fails or deadlocks.
func TestPrefetchPipeline(t *testing.T) {
	const tensors, numel = 24, 3000 // 12000-byte partitions: 3 pages each
	for _, backend := range testBackends(t) {
		for _, bufferCount := range []int{0, 1, 2} {
			t.Run(fmt.Sprintf("%s/buffers%d", backend, bufferCount), func(t *testing.T) {
				// Room for three partitions, so the pool and the gate both
				// make swap-ins wait.
				e := newEnv(t, envOpts{backend: backend, poolBytes: 3 * 12288})
				s := e.swapper(t, Options{BufferCount: bufferCount})
				ctx := testCtx(t)
				for i := range tensors {
					if err := s.Register(name(i), numel, swapper.TierNVMe); err != nil {
						t.Fatal(err)
					}
					if err := s.Init(ctx, name(i), values(uint64(i), numel)); err != nil {
						t.Fatal(err)
					}
				}
				// Look-ahead pipeline.
				const ahead = 3
				if err := s.Prefetch(name(0), name(1), name(2)); err != nil {
					t.Fatal(err)
				}
				for i := range tensors {
					if i+ahead < tensors {
						if err := s.Prefetch(name(i + ahead)); err != nil {
							t.Fatal(err)
						}
					}
					if err := s.Wait(ctx, name(i)); err != nil {
						t.Fatal(err)
					}
					if st := s.Stats(); bufferCount > 0 && st.SlotsInUse > bufferCount {
						t.Fatalf("%d partitions swapped in, BufferCount %d", st.SlotsInUse, bufferCount)
					}
					sameBits(t, name(i), read(t, s, name(i)), values(uint64(i), numel))
					s.Release(name(i))
				}
				// Everything prefetched at once, consumed in reverse order:
				// each Wait is served ahead of the queued prefetches.
				all := make([]string, tensors)
				for i := range all {
					all[i] = name(i)
				}
				if err := s.Prefetch(all...); err != nil {
					t.Fatal(err)
				}
				for i := tensors - 1; i >= 0; i-- {
					if err := s.Wait(ctx, name(i)); err != nil {
						t.Fatal(err)
					}
					sameBits(t, name(i), read(t, s, name(i)), values(uint64(i), numel))
					s.Release(name(i))
				}
				st := s.Stats()
				if st.SwapIns < 2*tensors || st.SwapInErrors != 0 {
					t.Errorf("stats %+v", st)
				}
				t.Logf("stats: %+v", st)
			})
		}
	}
}

// TestConcurrentUsers has goroutines swap disjoint and shared tensors in
// and out at once through BufferCount 2, a tiny pool and a CPU cache.
func TestConcurrentUsers(t *testing.T) {
	const tensors, numel, workers, rounds = 12, 2000, 4, 25
	e := newEnv(t, envOpts{backend: testBackends(t)[len(testBackends(t))-1], poolBytes: 6 * 8192, parallelism: 2})
	s := e.swapper(t, Options{BufferCount: 2, MaxInCPUBytes: 3 * 8192, DType: swapper.BFloat16})
	ctx := testCtx(t)
	for i := range tensors {
		if err := s.Register(name(i), numel, swapper.TierNVMe); err != nil {
			t.Fatal(err)
		}
		if err := s.Init(ctx, name(i), values(uint64(i), numel)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			dst := make([]float32, numel)
			for r := range rounds {
				// Each worker owns the tensors i with i%workers == w, so
				// swap-in and release of one tensor never race.
				i := w + workers*(r%(tensors/workers))
				if err := s.SwapIn(ctx, name(i)); err != nil {
					errs <- err
					return
				}
				if err := s.ReadFloat32(ctx, name(i), dst); err != nil {
					errs <- err
					return
				}
				want := expect(swapper.BFloat16, values(uint64(i), numel))
				for k := range dst {
					if dst[k] != want[k] {
						errs <- fmt.Errorf("%s[%d] = %v, want %v", name(i), k, dst[k], want[k])
						return
					}
				}
				s.Release(name(i))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", s.Stats())
}

// TestWaitIsPerSet holds one tensor's read in the engine and checks that
// Wait for other tensors returns while it is still in flight.
func TestWaitIsPerSet(t *testing.T) {
	for _, backend := range testBackends(t) {
		t.Run(backend, func(t *testing.T) {
			// Two engine workers: the held read blocks only its own.
			e := newEnv(t, envOpts{backend: backend, parallelism: 2})
			s := e.swapper(t, Options{})
			ctx := testCtx(t)
			for _, n := range []string{"slow", "fast"} {
				if err := s.Register(n, 5000, swapper.TierNVMe); err != nil {
					t.Fatal(err)
				}
				if err := s.Init(ctx, n, values(7, 5000)); err != nil {
					t.Fatal(err)
				}
			}
			_, off, err := e.store.Locate(s.StoreKey("slow"), 0)
			if err != nil {
				t.Fatal(err)
			}
			arrived, open := e.hook.hold(off, off+e.store.PaddedLen(5000*4))
			defer open()
			if err := s.Prefetch("slow", "fast"); err != nil {
				t.Fatal(err)
			}
			<-arrived // the slow read is in the engine, held
			if err := s.Wait(ctx, "fast"); err != nil {
				t.Fatal(err)
			}
			if st := s.State("slow"); st != InFlight {
				t.Fatalf("slow is %v while its read is held; Wait(fast) must not have waited for it", st)
			}
			if st := s.State("fast"); st != Resident {
				t.Fatalf("fast is %v after Wait", st)
			}
			open()
			if err := s.Wait(ctx, "slow"); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "slow", read(t, s, "slow"), values(7, 5000))
		})
	}
}

// TestDemandMiss: Wait on a tensor nobody prefetched fetches it itself.
func TestDemandMiss(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := e.swapper(t, Options{BufferCount: 1})
	ctx := testCtx(t)
	for i := range 3 {
		s.Register(name(i), 100, swapper.TierNVMe)
		if err := s.Init(ctx, name(i), values(uint64(i), 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Wait(ctx, name(1)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.DemandMisses != 1 {
		t.Errorf("DemandMisses = %d, want 1", st.DemandMisses)
	}
	// With the only slot held, another swap-in waits, here until ctx ends:
	// no error for exhaustion before that, no assert.
	short, cancel := context.WithCancel(ctx)
	if err := s.Prefetch(name(2)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := s.Wait(short, name(2)); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), name(2)) {
		t.Fatalf("Wait with the budget held and ctx done: %v", err)
	}
	s.Release(name(1))
	if err := s.Wait(ctx, name(2)); err != nil {
		t.Fatal(err)
	}
	sameBits(t, name(2), read(t, s, name(2)), values(2, 100))
}

// TestReleaseWritesNothing: params are read-only between steps.
func TestReleaseWritesNothing(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := e.swapper(t, Options{})
	ctx := testCtx(t)
	s.Register("w", 4096, swapper.TierNVMe)
	if err := s.Init(ctx, "w", values(1, 4096)); err != nil {
		t.Fatal(err)
	}
	before := e.store.Stats()
	for range 3 {
		if err := s.SwapIn(ctx, "w"); err != nil {
			t.Fatal(err)
		}
		s.Release("w")
		if st := s.State("w"); st != OnNVMe {
			t.Fatalf("state after Release: %v", st)
		}
	}
	after := e.store.Stats()
	if after.Writes != before.Writes || after.BytesWritten != before.BytesWritten {
		t.Errorf("Release wrote: %d writes / %d bytes before, %d / %d after", before.Writes, before.BytesWritten, after.Writes, after.BytesWritten)
	}
	if after.Reads != before.Reads+3 {
		t.Errorf("reads %d -> %d, want 3 swap-ins", before.Reads, after.Reads)
	}
	if err := s.ReadFloat32(ctx, "w", make([]float32, 4096)); !errors.Is(err, ErrNotResident) {
		t.Errorf("read after Release without a cache: %v", err)
	}
}

// TestCPUCache: a released partition stays in pinned memory, and swapping
// it in again reads nothing from the store.
func TestCPUCache(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := e.swapper(t, Options{MaxInCPUBytes: 1 << 20, DType: swapper.Float16})
	ctx := testCtx(t)
	s.Register("w", 5000, swapper.TierNVMe)
	s.Register("v", 300, swapper.TierNVMe)
	want := expect(swapper.Float16, values(3, 5000))
	if err := s.Init(ctx, "w", values(3, 5000)); err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx, "v", values(4, 300)); err != nil {
		t.Fatal(err)
	}
	if err := s.SwapIn(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	s.Release("w")
	s.cache.Wait() // let ristretto apply the Set
	reads := e.store.Stats().Reads
	if err := s.SwapIn(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "w", read(t, s, "w"), want)
	s.Release("w")
	s.cache.Wait()
	// A cached partition can be read without swapping it in.
	sameBits(t, "w (cached)", read(t, s, "w"), want)
	if got := e.store.Stats().Reads; got != reads {
		t.Errorf("store reads %d -> %d: the cache hit did I/O", reads, got)
	}
	st := s.Stats()
	if st.CacheHits != 1 || st.CacheMisses != 1 || st.CachedBytes == 0 {
		t.Errorf("stats: %+v", st)
	}
	// A miss still reads.
	if err := s.SwapIn(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if got := e.store.Stats().Reads; got != reads+1 {
		t.Errorf("store reads %d -> %d after a miss", reads, got)
	}
}

// TestCacheEvictionKeepsReaders: an eviction drops only the cache's
// reference; a reader's buffer stays valid until it lets go.
func TestCacheEvictionKeepsReaders(t *testing.T) {
	e := newEnv(t, envOpts{})
	// The cache holds one 8 KiB partition; a second evicts or is rejected.
	s := e.swapper(t, Options{MaxInCPUBytes: 8192})
	ctx := testCtx(t)
	for i := range 6 {
		s.Register(name(i), 2000, swapper.TierNVMe)
		if err := s.Init(ctx, name(i), values(uint64(i), 2000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SwapIn(ctx, name(0)); err != nil {
		t.Fatal(err)
	}
	s.Release(name(0))
	s.cache.Wait()
	s.mu.Lock()
	tn := s.tensors[name(0)]
	s.mu.Unlock()
	blk, _, ok := s.cacheLookup(tn) // a reader's reference
	if !ok {
		t.Fatal("released partition not cached")
	}
	s.cache.Del(name(0))
	for i := 1; i < 6; i++ {
		if err := s.SwapIn(ctx, name(i)); err != nil {
			t.Fatal(err)
		}
		s.Release(name(i))
		s.cache.Wait()
	}
	if blk.buf.Bytes() == nil {
		t.Fatal("evicted buffer freed under its reader")
	}
	got := make([]float32, 2000)
	buffers.Decode(swapper.Float32, got, blk.buf.Bytes()[:8000])
	sameBits(t, "reader's copy", got, values(0, 2000))
	buf := blk.buf
	blk.release()
	if buf.Bytes() != nil {
		t.Error("buffer still held after the reader's release")
	}
	if c := s.Stats().CachedBytes; c > 8192 {
		t.Errorf("CachedBytes %d above MaxInCPUBytes", c)
	}
}

// TestCacheGivesWayToSwapIns: when the pool is dry, cached partitions are
// evicted rather than a swap-in waiting forever.
func TestCacheGivesWayToSwapIns(t *testing.T) {
	e := newEnv(t, envOpts{poolBytes: 4 * 8192})
	s := e.swapper(t, Options{MaxInCPUBytes: 4 * 8192})
	ctx := testCtx(t)
	for i := range 8 {
		s.Register(name(i), 2000, swapper.TierNVMe)
		if err := s.Init(ctx, name(i), values(uint64(i), 2000)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 {
		if err := s.SwapIn(ctx, name(i)); err != nil {
			t.Fatal(err)
		}
		sameBits(t, name(i), read(t, s, name(i)), values(uint64(i), 2000))
		s.Release(name(i))
		s.cache.Wait()
	}
}

// TestUpdates: a staged update is invisible until CommitUpdates, and
// DiscardUpdates leaves the current values, on every tier; resident copies
// and cache entries never serve the old values after a commit.
func TestUpdates(t *testing.T) {
	for _, backend := range testBackends(t) {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, envOpts{backend: backend})
			dev, err := accel.NewSim(accel.SimOptions{CapacityBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			s := e.swapper(t, Options{Device: dev, DType: swapper.BFloat16, MaxInCPUBytes: 1 << 20})
			ctx := testCtx(t)
			const n = 3000
			names := map[string]swapper.Tier{"nvme": swapper.TierNVMe, "cached": swapper.TierNVMe, "resident": swapper.TierNVMe, "cpu": swapper.TierCPU, "gpu": swapper.TierGPU}
			for nm, tier := range names {
				if err := s.Register(nm, n, tier); err != nil {
					t.Fatal(err)
				}
				if err := s.Init(ctx, nm, values(1, n)); err != nil {
					t.Fatal(err)
				}
			}
			check := func(version uint64) {
				t.Helper()
				want := expect(swapper.BFloat16, values(version, n))
				for nm := range names {
					if err := s.SwapIn(ctx, nm); err != nil {
						t.Fatal(err)
					}
					sameBits(t, fmt.Sprintf("%s v%d", nm, version), read(t, s, nm), want)
				}
				s.Release("nvme", "cached")
				s.cache.Wait()
			}
			check(1)
			// "cached" is in the cache, "resident" stays swapped in.
			writes := e.store.Stats().Writes
			stage := func(version uint64) {
				t.Helper()
				for nm := range names {
					w, err := s.StageUpdate(ctx, nm, values(version, n))
					if err != nil {
						t.Fatal(err)
					}
					if err := w.Wait(); err != nil {
						t.Fatal(err)
					}
				}
			}
			stage(2)
			if st := s.Stats(); st.Staged != len(names) {
				t.Errorf("Staged = %d", st.Staged)
			}
			check(1) // staged: invisible
			if err := s.CommitUpdates(); err != nil {
				t.Fatal(err)
			}
			if got := e.store.Stats().Writes - writes; got != 3 {
				t.Errorf("%d store writes for 3 NVMe updates", got)
			}
			check(2)
			stage(3)
			s.DiscardUpdates()
			check(2)
			if err := s.CommitUpdates(); err != nil { // nothing staged
				t.Fatal(err)
			}
			check(2)
			for _, k := range e.store.Names() {
				if strings.Contains(k, stagingMark) {
					t.Errorf("staging key %q left in the store", k)
				}
			}
		})
	}
}

// TestStageENOSPC: a full disk during the staged writes fails the step;
// nothing changes; once space returns the step succeeds.
func TestStageENOSPC(t *testing.T) {
	for _, backend := range testBackends(t) {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, envOpts{backend: backend})
			s := e.swapper(t, Options{DType: swapper.Float16})
			ctx := testCtx(t)
			for i := range 3 {
				s.Register(name(i), 3000, swapper.TierNVMe)
				if err := s.Init(ctx, name(i), values(1, 3000)); err != nil {
					t.Fatal(err)
				}
			}
			e.inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC})
			var failed error
			for i := range 3 {
				w, err := s.StageUpdate(ctx, name(i), values(2, 3000))
				if err == nil {
					err = w.Wait()
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			if !errors.Is(failed, syscall.ENOSPC) || !errors.Is(failed, aio.ErrNoSpace) || !strings.Contains(failed.Error(), name(0)) {
				t.Fatalf("staged write on a full disk: %v", failed)
			}
			err := s.CommitUpdates()
			if !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("commit after failed writes: %v", err)
			}
			s.DiscardUpdates()
			want1 := expect(swapper.Float16, values(1, 3000))
			for i := range 3 {
				if err := s.SwapIn(ctx, name(i)); err != nil {
					t.Fatal(err)
				}
				sameBits(t, name(i), read(t, s, name(i)), want1)
				s.Release(name(i))
			}
			e.inj.Clear() // space returns
			for i := range 3 {
				if _, err := s.StageUpdate(ctx, name(i), values(2, 3000)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.CommitUpdates(); err != nil {
				t.Fatal(err)
			}
			want2 := expect(swapper.Float16, values(2, 3000))
			for i := range 3 {
				if err := s.SwapIn(ctx, name(i)); err != nil {
					t.Fatal(err)
				}
				sameBits(t, name(i), read(t, s, name(i)), want2)
				s.Release(name(i))
			}
		})
	}
}

// TestReadEIO: a device error on swap-in names the tensor; the partition
// goes back to OnNVMe and a later Wait retries it.
func TestReadEIO(t *testing.T) {
	for _, backend := range testBackends(t) {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, envOpts{backend: backend})
			s := e.swapper(t, Options{})
			ctx := testCtx(t)
			s.Register("blocks.3.attn.qkv", 2500, swapper.TierNVMe)
			if err := s.Init(ctx, "blocks.3.attn.qkv", values(5, 2500)); err != nil {
				t.Fatal(err)
			}
			e.inj.Add(faults.Rule{Kind: faults.Reads, Err: syscall.EIO})
			err := s.SwapIn(ctx, "blocks.3.attn.qkv")
			if !errors.Is(err, aio.ErrIO) || !strings.Contains(err.Error(), `"blocks.3.attn.qkv"`) {
				t.Fatalf("swap-in with EIO: %v", err)
			}
			if st := s.State("blocks.3.attn.qkv"); st != OnNVMe {
				t.Fatalf("state after a failed swap-in: %v", st)
			}
			e.inj.Clear()
			if err := s.Wait(ctx, "blocks.3.attn.qkv"); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "after retry", read(t, s, "blocks.3.attn.qkv"), values(5, 2500))
			if st := s.Stats(); st.SwapInErrors != 1 || st.SwapIns != 1 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestChecksumCorruption flips one byte of the swap file under a stored
// partition; the swap-in fails with swapper.ErrChecksum naming the tensor.
func TestChecksumCorruption(t *testing.T) {
	for _, backend := range testBackends(t) {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, envOpts{backend: backend, checksums: true})
			s := e.swapper(t, Options{DType: swapper.BFloat16})
			ctx := testCtx(t)
			s.Register("emb", 6000, swapper.TierNVMe)
			if err := s.Init(ctx, "emb", values(9, 6000)); err != nil {
				t.Fatal(err)
			}
			path, off, err := e.store.Locate(s.StoreKey("emb"), 4321)
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 1)
			if _, err := f.ReadAt(b, off); err != nil {
				t.Fatal(err)
			}
			b[0] ^= 0x40
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			err = s.SwapIn(ctx, "emb")
			if !errors.Is(err, swapper.ErrChecksum) || !strings.Contains(err.Error(), "emb") {
				t.Fatalf("swap-in of a corrupted partition: %v", err)
			}
			if st := s.State("emb"); st != OnNVMe {
				t.Fatalf("state: %v", st)
			}
		})
	}
}

// TestCommitRefreshesInFlight: a commit while a swap-in of the old version
// is in flight never lets the old bytes become resident.
func TestCommitRefreshesInFlight(t *testing.T) {
	e := newEnv(t, envOpts{parallelism: 2})
	s := e.swapper(t, Options{MaxInCPUBytes: 1 << 20})
	ctx := testCtx(t)
	s.Register("w", 3000, swapper.TierNVMe)
	if err := s.Init(ctx, "w", values(1, 3000)); err != nil {
		t.Fatal(err)
	}
	_, off, err := e.store.Locate(s.StoreKey("w"), 0)
	if err != nil {
		t.Fatal(err)
	}
	arrived, open := e.hook.hold(off, off+e.store.PaddedLen(12000))
	defer open()
	if err := s.Prefetch("w"); err != nil {
		t.Fatal(err)
	}
	<-arrived // reading version 1
	if _, err := s.StageUpdate(ctx, "w", values(2, 3000)); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitUpdates(); err != nil {
		t.Fatal(err)
	}
	open()
	if err := s.Wait(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "w", read(t, s, "w"), values(2, 3000))
	s.Release("w")
	s.cache.Wait()
	sameBits(t, "w (cache)", read(t, s, "w"), values(2, 3000))
}

// TestClose: Close with swap-ins queued and in flight and updates staged
// returns every buffer; later calls fail with ErrClosed.
func TestClose(t *testing.T) {
	e := newEnv(t, envOpts{poolBytes: 2 * 8192})
	s, err := New(Options{Store: e.store, Pool: e.pool, BufferCount: 1, MaxInCPUBytes: 8192, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for i := range 5 {
		s.Register(name(i), 2000, swapper.TierNVMe)
		if err := s.Init(ctx, name(i), values(uint64(i), 2000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SwapIn(ctx, name(0)); err != nil {
		t.Fatal(err)
	}
	s.Prefetch(name(1), name(2), name(3))
	if _, err := s.StageUpdate(ctx, name(4), values(9, 2000)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, name(1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close: %v", err)
	}
	if n := e.pool.Stats().Outstanding; n != 0 {
		t.Errorf("%d buffers outstanding after Close", n)
	}
	for _, k := range e.store.Names() {
		if strings.Contains(k, stagingMark) {
			t.Errorf("staging key %q left after Close", k)
		}
	}
}

// TestEmptyPartition: with more ranks than elements a rank's partition is
// empty; every operation on it is a cheap no-op.
func TestEmptyPartition(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := e.swapper(t, Options{Rank: 3, WorldSize: 4})
	ctx := testCtx(t)
	if err := s.Register("tiny", 3, swapper.TierNVMe); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.PartitionLen("tiny"); n != 0 {
		t.Fatalf("PartitionLen = %d", n)
	}
	if lo, hi, _ := s.PartitionRange("tiny"); lo != 3 || hi != 3 {
		t.Fatalf("PartitionRange = [%d, %d)", lo, hi)
	}
	if err := s.Init(ctx, "tiny", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SwapIn(ctx, "tiny"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReadFloat32(ctx, "tiny", nil); err != nil {
		t.Fatal(err)
	}
	w, err := s.StageUpdate(ctx, "tiny", []float32{})
	if err != nil || w.Wait() != nil {
		t.Fatal(err)
	}
	if err := s.CommitUpdates(); err != nil {
		t.Fatal(err)
	}
	s.Release("tiny")
	if st := s.State("tiny"); st != Resident || st.String() != "resident" || State(99).String() != "unknown" {
		t.Errorf("state %v", st)
	}
	if len(e.store.Names()) != 0 {
		t.Errorf("an empty partition reached the store: %v", e.store.Names())
	}
}

// TestGPUStageOutOfMemory: an update that does not fit on the device
// fails at StageUpdate and changes nothing.
func TestGPUStageOutOfMemory(t *testing.T) {
	e := newEnv(t, envOpts{})
	const n = 1000 // 4000 bytes
	dev, err := accel.NewSim(accel.SimOptions{CapacityBytes: 6000})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s := e.swapper(t, Options{Device: dev})
	ctx := testCtx(t)
	s.Register("w", n, swapper.TierGPU)
	if err := s.Init(ctx, "w", values(1, n)); err != nil {
		t.Fatal(err)
	}
	_, err = s.StageUpdate(ctx, "w", values(2, n))
	if !errors.Is(err, accel.ErrOutOfMemory) || !strings.Contains(err.Error(), `"w"`) {
		t.Fatalf("staging beyond device memory: %v", err)
	}
	if err := s.CommitUpdates(); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "w", read(t, s, "w"), values(1, n))
	if used := dev.UsedBytes(); used != 4000 {
		t.Errorf("device holds %d bytes, want 4000", used)
	}
}
