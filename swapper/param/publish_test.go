package param

import (
	"context"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

// readNow reads name's current values, swapping an NVMe partition in
// first.
func readNow(t *testing.T, s *Swapper, name string) []float32 {
	t.Helper()
	ctx := context.Background()
	if err := s.SwapIn(ctx, name); err != nil {
		t.Fatal(err)
	}
	defer s.Release(name)
	return read(t, s, name)
}

// TestPublishUpdate: on every tier, a published update is what reads see
// at once — a resident copy and the CPU cache's included — while the step
// is open; DiscardUpdates puts the committed version back everywhere, and
// CommitUpdates keeps the published one and forgets the old for good
// (its store key is gone).
func TestPublishUpdate(t *testing.T) {
	e := newDevEnv(t, devEnvOpts{})
	s := e.swapper(t, Options{MaxInCPUBytes: 1 << 20})
	ctx := testCtx(t)
	tiers := map[string]swapper.Tier{"nvme": swapper.TierNVMe, "cpu": swapper.TierCPU, "gpu": swapper.TierGPU}
	const n = 3001
	for name, tier := range tiers {
		if err := s.Register(name, n, tier); err != nil {
			t.Fatal(err)
		}
		if err := s.Init(ctx, name, values(1, n)); err != nil {
			t.Fatal(err)
		}
		sameBits(t, name, readNow(t, s, name), values(1, n)) // the NVMe one is cached now
	}
	// A resident copy held across the publish is swapped in again.
	if err := s.SwapIn(ctx, "nvme"); err != nil {
		t.Fatal(err)
	}
	for round, keep := range []bool{false, true} {
		v := uint64(2 + round)
		for name := range tiers {
			if _, err := s.StageUpdate(ctx, name, values(v, n)); err != nil {
				t.Fatal(err)
			}
			if err := s.PublishUpdate(name); err != nil {
				t.Fatal(err)
			}
			if err := s.PublishUpdate(name); err != nil { // nothing staged: as it is
				t.Fatal(err)
			}
		}
		if round == 0 {
			if err := s.Wait(ctx, "nvme"); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "nvme (held across the publish)", read(t, s, "nvme"), values(v, n))
			s.Release("nvme")
		}
		for name := range tiers {
			sameBits(t, name+" published", readNow(t, s, name), values(v, n))
		}
		if _, _, err := e.store.Locate(s.StoreKey("nvme")+prevMark, 0); err != nil {
			t.Fatalf("the committed version is not kept while the step is open: %v", err)
		}
		want := values(1, n)
		if keep {
			if err := s.CommitUpdates(); err != nil {
				t.Fatal(err)
			}
			want = values(v, n)
		} else {
			s.DiscardUpdates()
		}
		for name := range tiers {
			sameBits(t, name+" after the step", readNow(t, s, name), want)
		}
		if _, _, err := e.store.Locate(s.StoreKey("nvme")+prevMark, 0); err == nil {
			t.Fatal("the kept version outlived the step")
		}
	}
	st := s.Stats()
	if st.Published != 6 || st.Reverted != 3 || st.Staged != 0 {
		t.Fatalf("stats: published %d, reverted %d, staged %d; want 6, 3, 0", st.Published, st.Reverted, st.Staged)
	}
}

// TestPublishFailedWrite: a staged write that failed is not published,
// and nothing changes.
func TestPublishFailedWrite(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := e.swapper(t, Options{})
	ctx := testCtx(t)
	s.Register("w", 2000, swapper.TierNVMe)
	if err := s.Init(ctx, "w", values(1, 2000)); err != nil {
		t.Fatal(err)
	}
	e.inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC})
	if _, err := s.StageUpdate(ctx, "w", values(2, 2000)); err != nil {
		t.Fatal(err)
	}
	if err := s.PublishUpdate("w"); err == nil {
		t.Fatal("a failed staged write was published")
	}
	e.inj.Clear()
	s.DiscardUpdates()
	sameBits(t, "w", readNow(t, s, "w"), values(1, 2000))
	if err := s.PublishUpdate("nope"); err == nil {
		t.Fatal("PublishUpdate of an unknown tensor succeeded")
	}
}

// TestHoldPrefetch: a prefetch of a tensor whose update is coming waits
// for it and then reads the new version only (one read, not two); a
// Release drops a deferred prefetch; DiscardUpdates and CommitUpdates end
// every hold.
func TestHoldPrefetch(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := e.swapper(t, Options{})
	ctx := testCtx(t)
	const n = 2000
	for _, name := range []string{"a", "b", "c"} {
		s.Register(name, n, swapper.TierNVMe)
		if err := s.Init(ctx, name, values(1, n)); err != nil {
			t.Fatal(err)
		}
	}
	s.HoldPrefetch("a", "b", "c")
	if err := s.Prefetch("a", "b", "c"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.InFlight != 0 || st.SwapIns != 0 {
		t.Fatalf("held prefetches started: %d in flight, %d swap-ins", st.InFlight, st.SwapIns)
	}
	s.Release("c") // the pass changed: c's deferred prefetch goes
	if _, err := s.StageUpdate(ctx, "a", values(2, n)); err != nil {
		t.Fatal(err)
	}
	if err := s.PublishUpdate("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "a", read(t, s, "a"), values(2, n))
	s.Release("a")
	if st := s.Stats(); st.SwapIns != 1 {
		t.Fatalf("%d swap-ins for one prefetched, published tensor; want 1", st.SwapIns)
	}
	s.DiscardUpdates() // ends b's hold: its deferred prefetch starts now
	if err := s.Wait(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "b", read(t, s, "b"), values(1, n))
	s.Release("b")
	sameBits(t, "a after the discard", readNow(t, s, "a"), values(1, n))
	if st := s.Stats(); st.InFlight != 0 {
		t.Fatalf("%d swap-ins left in flight (c's dropped prefetch started?)", st.InFlight)
	}
}
