package param_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/param"
)

// vals are n distinct values for seed.
func vals(seed, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Sin(float64(i*7+seed))) * 0.5
	}
	return v
}

// readBack reads name's partition and fails t unless it is want, bit for
// bit.
func readBack(t *testing.T, s *param.Swapper, name string, want []float32) {
	t.Helper()
	got := make([]float32, len(want))
	if err := s.ReadFloat32(context.Background(), name, got); err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], want[i])
		}
	}
}

// fragmented builds, on a 256 KiB pool of 4 KiB granules, the state in
// which make stress's seed 1795746247277799838 stalled: a previous layer
// (two partitions of 124 KiB, one in each 128 KiB half) was resident
// while the next layer's two 4 KiB partitions were prefetched — into the
// one free granule left at the end of each half — and then released. The
// pool has 248 KiB free but no free aligned 128 KiB block, which the next
// layer's 88 KiB partition needs (buffers.SpanBytes), until one of the
// small ones goes.
func fragmented(t *testing.T) (*param.Swapper, context.Context) {
	s, _, ctx := fragmentedWith(t, 0)
	return s, ctx
}

// fragmentedWith is fragmented with a CPU cache of maxInCPU bytes; it
// returns the pool too.
func fragmentedWith(t *testing.T, maxInCPU int64) (*param.Swapper, *buffers.Pool, context.Context) {
	t.Helper()
	s, pool, ctx := newSwapper(t, maxInCPU)
	if err := s.Wait(ctx, "prev.a", "prev.b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Prefetch("next.s1", "next.s2"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.State("next.s1") != param.Resident || s.State("next.s2") != param.Resident {
		if time.Now().After(deadline) {
			t.Fatalf("the small partitions were not prefetched: %s, %s", s.State("next.s1"), s.State("next.s2"))
		}
		time.Sleep(time.Millisecond)
	}
	s.Release("prev.a", "prev.b")
	return s, pool, ctx
}

// newSwapper is a swapper on a 256 KiB pool (4 KiB granules) with the
// partitions prev.a and prev.b (124 KiB each), next.s1 and next.s2 (4 KiB)
// and next.big (88 KiB) initialized on NVMe.
func newSwapper(t *testing.T, maxInCPU int64) (*param.Swapper, *buffers.Pool, context.Context) {
	t.Helper()
	// fp32 elements: 124 KiB, 4 KiB and 88 KiB.
	return swapperWith(t, param.Options{MaxInCPUBytes: maxInCPU},
		part{"prev.a", 31 << 10}, part{"prev.b", 31 << 10}, part{"next.s1", 1 << 10}, part{"next.s2", 1 << 10}, part{"next.big", 22 << 10})
}

// part is a partition swapperWith registers: name and fp32 elements.
type part struct {
	name  string
	elems int
}

// swapperWith is a swapper with options o (its Store, Pool and Logger
// filled in) on a 256 KiB unpinned pool and a posix engine, with parts
// registered and initialized on NVMe in order (values vals(len(name)+n, n)),
// everything closed when the test ends, and a context of a minute.
func swapperWith(t *testing.T, o param.Options, parts ...part) (*param.Swapper, *buffers.Pool, context.Context) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 256 << 10, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	eng, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	store, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	o.Store, o.Pool, o.Logger = store, pool, quiet
	s, err := param.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	for _, p := range parts {
		if err := s.Register(p.name, p.elems, swapper.TierNVMe); err != nil {
			t.Fatal(err)
		}
		if err := s.Init(ctx, p.name, vals(len(p.name)+p.elems, p.elems)); err != nil {
			t.Fatal(err)
		}
	}
	return s, pool, ctx
}

// TestWaitFragmentedRegion: a layer whose small partitions were
// prefetched into a fragmented region is still swapped in whole. Wait
// claimed its set one partition at a time, so the small ones stayed put
// and the largest waited for an aligned block that never came (until the
// pool's stall timeout, two minutes by default); now the set is claimed
// when all of it is resident and the small ones give way to the large one.
func TestWaitFragmentedRegion(t *testing.T) {
	s, ctx := fragmented(t)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	before := s.Stats()
	// The small ones first: the order a layer's tensors came in.
	if err := s.Wait(wctx, "next.s1", "next.s2", "next.big"); err != nil {
		t.Fatalf("Wait on a fragmented region: %v", err)
	}
	for _, n := range []string{"next.s1", "next.s2", "next.big"} {
		if st := s.State(n); st != param.Resident {
			t.Fatalf("%s is %s after Wait", n, st)
		}
		numel, _ := s.PartitionLen(n)
		readBack(t, s, n, vals(len(n)+numel, numel))
	}
	st := s.Stats()
	if p := st.Preemptions; p < 1 {
		t.Errorf("Preemptions = %d: the small partitions did not give way", p)
	}
	// Every byte Wait read beyond next.big is a preempted small partition
	// read again: PreemptedBytes accounts for it (4 KiB each).
	pre, read := st.PreemptedBytes-before.PreemptedBytes, st.BytesRead-before.BytesRead
	if pre != 4<<10*(st.Preemptions-before.Preemptions) || read != 88<<10+pre {
		t.Errorf("Wait read %d bytes with %d preempted (%d preemptions): want next.big's 88 KiB plus the preempted bytes, 4 KiB each",
			read, pre, st.Preemptions-before.Preemptions)
	}
	// Claimed now: a larger swap-in cannot take them back.
	s.Release("next.s1", "next.s2", "next.big")
}

// TestStageFragmentedRegion: a staged update needs an aligned block too;
// prefetched partitions nobody claimed give way to it instead of leaving
// it waiting on memory that only the next pass would release.
func TestStageFragmentedRegion(t *testing.T) {
	s, ctx := fragmented(t)
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	numel, _ := s.PartitionLen("next.big")
	want := vals(99, numel)
	w, err := s.StageUpdate(sctx, "next.big", want)
	if err != nil {
		t.Fatalf("StageUpdate on a fragmented region: %v", err)
	}
	if err := w.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitUpdates(); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(sctx, "next.big"); err != nil {
		t.Fatalf("Wait after the update: %v", err)
	}
	readBack(t, s, "next.big", want)
	s.Release("next.big")
}

// TestStageWaitKeepsReleasesOutOfCache: while a staged update waits for
// pool memory, partitions released go back to the pool, not into the CPU
// cache (max_in_cpu), which would keep them (scattered over the region)
// with nothing left to evict them: the step would wait for ever on the
// memory of the layers its own loop had just released.
func TestStageWaitKeepsReleasesOutOfCache(t *testing.T) {
	s, pool, ctx := newSwapper(t, 256<<10)
	// Both halves held whole but for their last granule, which the two
	// small partitions take: no room for the 88 KiB update.
	if err := s.Wait(ctx, "prev.a", "prev.b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, "next.s1", "next.s2"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	numel, _ := s.PartitionLen("next.big")
	want := vals(7, numel)
	staged := make(chan error, 1)
	go func() {
		w, err := s.StageUpdate(sctx, "next.big", want)
		if err == nil {
			err = w.Wait()
		}
		staged <- err
	}()
	for pool.Stats().Waiting == 0 {
		select {
		case err := <-staged:
			t.Fatalf("the update did not wait for memory: %v", err)
		case <-sctx.Done():
			t.Fatal("the update never waited")
		case <-time.After(time.Millisecond):
		}
	}
	s.Release("prev.a", "prev.b", "next.s1", "next.s2")
	if err := <-staged; err != nil {
		t.Fatalf("StageUpdate while the released partitions could go to the cache: %v", err)
	}
	if err := s.CommitUpdates(); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(sctx, "next.big"); err != nil {
		t.Fatal(err)
	}
	readBack(t, s, "next.big", want)
	s.Release("next.big")
}

// TestStageBehindPendingWait: a staged update that the pool cannot place
// sends back the smaller partitions a Wait in progress holds unclaimed.
// It is the interleaving of a step that overlaps the backward pass
// (zinf.Runtime.StepLayer): the optimizer stages layer l's update while
// the loop's BeginLayer(l-1) waits for its set. Two of the set's small
// partitions landed, one in each half of the region; the update (an
// 88 KiB buffer: a free 128 KiB half) queued in the pool; the set's last
// partition, which had no slot yet, queued behind it (the pool serves its
// waiters in turn); then the previous layer was released. 248 KiB free
// and no half free: the update waited for the Wait's partitions and the
// Wait for the update, until the pool's stall timeout (TestStateFourTimesPinned
// in contrib/gomlx, once under load: "fragmented: 24 KiB free but no free
// aligned 16 KiB block").
func TestStageBehindPendingWait(t *testing.T) {
	// Four slots: the previous layer's two and two of the next set's
	// three small partitions. fp32 elements: 124 KiB, 4 KiB and 88 KiB.
	sizes := map[string]int{"prev.a": 31 << 10, "prev.b": 31 << 10, "next.s1": 1 << 10, "next.s2": 1 << 10, "next.s3": 1 << 10, "other.big": 22 << 10}
	var parts []part
	for _, n := range []string{"prev.a", "prev.b", "next.s1", "next.s2", "next.s3", "other.big"} {
		parts = append(parts, part{n, sizes[n]})
	}
	s, pool, ctx := swapperWith(t, param.Options{BufferCount: 4}, parts...)
	if err := s.Wait(ctx, "prev.a", "prev.b"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	waited := make(chan error, 1)
	go func() { waited <- s.Wait(wctx, "next.s1", "next.s2", "next.s3") }()
	// Two of the set land, in the one free granule of each half; the
	// third waits for a slot.
	for s.State("next.s1") != param.Resident || s.State("next.s2") != param.Resident {
		select {
		case err := <-waited:
			t.Fatalf("Wait returned with the previous layer's slots held: %v", err)
		case <-wctx.Done():
			t.Fatalf("the small partitions did not land: %s, %s", s.State("next.s1"), s.State("next.s2"))
		case <-time.After(time.Millisecond):
		}
	}
	want := vals(5, sizes["other.big"])
	staged := make(chan error, 1)
	go func() {
		w, err := s.StageUpdate(wctx, "other.big", want)
		if err == nil {
			err = w.Wait()
		}
		staged <- err
	}()
	for pool.Stats().Waiting == 0 {
		select {
		case err := <-staged:
			t.Fatalf("the update did not wait for memory: %v", err)
		case <-wctx.Done():
			t.Fatal("the update never waited for memory")
		case <-time.After(time.Millisecond):
		}
	}
	s.Release("prev.a", "prev.b") // the previous layer ends
	if err := <-staged; err != nil {
		t.Fatalf("StageUpdate behind a Wait in progress: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("Wait behind a staged update: %v", err)
	}
	for _, n := range []string{"next.s1", "next.s2", "next.s3"} {
		readBack(t, s, n, vals(len(n)+sizes[n], sizes[n]))
	}
	s.Release("next.s1", "next.s2", "next.s3")
	if err := s.CommitUpdates(); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, "other.big"); err != nil {
		t.Fatal(err)
	}
	readBack(t, s, "other.big", want)
	s.Release("other.big")
}
