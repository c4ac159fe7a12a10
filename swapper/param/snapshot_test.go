package param

import (
	"errors"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/swapper"
)

// TestSnapshotCopyOnWrite: a snapshot keeps the values its partitions had
// while updates are committed (CPU tier: the same buffer, retained, not
// copied; GPU tier: a host copy), and gives its buffers back on Release.
func TestSnapshotCopyOnWrite(t *testing.T) {
	e := newEnv(t, envOpts{})
	dev, err := accel.NewSim(accel.SimOptions{CapacityBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s := e.swapper(t, Options{Device: dev, DType: swapper.BFloat16})
	ctx := testCtx(t)
	const n = 3000
	tiers := map[string]swapper.Tier{"cpu": swapper.TierCPU, "cpu2": swapper.TierCPU, "gpu": swapper.TierGPU, "nvme": swapper.TierNVMe}
	for nm, tier := range tiers {
		if err := s.Register(nm, n, tier); err != nil {
			t.Fatal(err)
		}
		if err := s.Init(ctx, nm, values(1, n)); err != nil {
			t.Fatal(err)
		}
	}
	base := e.pool.Stats().Outstanding
	snap, err := s.Snapshot(ctx, "cpu", "cpu2", "gpu")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.pool.Stats().Outstanding; got != base+1 {
		t.Fatalf("%d buffers outstanding after the snapshot, want %d (one host copy of the GPU partition, none of the CPU ones)", got, base+1)
	}
	s.mu.Lock()
	cur := s.tensors["cpu"].cur.buf.Bytes()
	s.mu.Unlock()
	if b, _ := snap.Bytes("cpu"); &b[0] != &cur[0] {
		t.Fatal("the CPU-tier partition was copied, not retained")
	}
	want := expect(swapper.BFloat16, values(1, n))
	check := func(label string) {
		t.Helper()
		for _, nm := range []string{"cpu", "cpu2", "gpu"} {
			got := make([]float32, n)
			if err := snap.ReadFloat32(nm, got); err != nil {
				t.Fatal(err)
			}
			sameBits(t, label+" "+nm, got, want)
		}
	}
	// Two committed updates (the second one would reuse a buffer written in
	// place if the tier were not copy-on-write), then Init.
	for v := uint64(2); v <= 3; v++ {
		for nm := range tiers {
			if _, err := s.StageUpdate(ctx, nm, values(v, n)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CommitUpdates(); err != nil {
			t.Fatal(err)
		}
		check("after update")
		sameBits(t, "current cpu", read(t, s, "cpu"), expect(swapper.BFloat16, values(v, n)))
	}
	if err := s.Init(ctx, "cpu", values(4, n)); err != nil {
		t.Fatal(err)
	}
	check("after Init")
	// The snapshot holds the replaced CPU buffers: two more than before.
	if got := e.pool.Stats().Outstanding; got != base+3 {
		t.Fatalf("%d buffers outstanding, want %d", got, base+3)
	}
	snap.Release()
	snap.Release() // idempotent
	if _, ok := snap.Bytes("cpu"); ok {
		t.Fatal("Bytes after Release")
	}
	if got := e.pool.Stats().Outstanding; got != base {
		t.Fatalf("%d buffers outstanding after Release, want %d", got, base)
	}

	// Every in-memory partition when no names are given; it outlives Close.
	all, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Names()) != 3 {
		t.Fatalf("snapshot of everything holds %v, want the CPU and GPU partitions", all.Names())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := all.ReadFloat32("cpu", got); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "after Close", got, expect(swapper.BFloat16, values(4, n)))
	all.Release()
	if _, err := s.Snapshot(ctx, "cpu"); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestSnapshotErrors: NVMe partitions, unknown and uninitialized names are
// refused and nothing is held.
func TestSnapshotErrors(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := e.swapper(t, Options{DType: swapper.Float32})
	ctx := testCtx(t)
	for _, nm := range []string{"a", "fresh"} {
		if err := s.Register(nm, 100, swapper.TierCPU); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Register("disk", 100, swapper.TierNVMe); err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx, "a", values(1, 100)); err != nil {
		t.Fatal(err)
	}
	base := e.pool.Stats().Outstanding
	for _, c := range []struct {
		name string
		err  error
	}{{"disk", ErrNotInMemory}, {"nope", ErrUnknown}, {"fresh", ErrNotInitialized}} {
		if _, err := s.Snapshot(ctx, "a", c.name); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
		if got := e.pool.Stats().Outstanding; got != base {
			t.Fatalf("%s: a failed snapshot holds %d buffers", c.name, got-base)
		}
	}
}
