package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// snapStates reads every tensor's three states out of a snapshot.
func snapStates(t *testing.T, snap *optimizer.StateSnapshot, specs []spec) map[string]state {
	t.Helper()
	out := map[string]state{}
	for _, s := range specs {
		var st [3][]float32
		for k := range st {
			st[k] = make([]float32, s.n)
			if err := snap.Read(s.name, optimizer.StateKind(k), st[k]); err != nil {
				t.Fatal(err)
			}
		}
		out[s.name] = state{st[0], st[1], st[2]}
	}
	return out
}

// TestSnapshotStatesCopyOnWrite: a snapshot of in-memory states keeps the
// bytes it was taken with, without copying, while steps (plain and
// transactions, every depth) and LoadState change the states; a step that
// would write a held record gets a fresh buffer, which goes back to the
// pool once the snapshot is released. The optimizer still matches the
// reference bit for bit.
func TestSnapshotStatesCopyOnWrite(t *testing.T) {
	for _, depth := range []int{0, 2} {
		for _, txn := range []bool{false, true} {
			t.Run(fmt.Sprintf("depth=%d/txn=%v", depth, txn), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: true, specs: mixed, seed: 11,
					opts: optimizer.Options{SubGroupSize: 1000, PipelineDepth: depth}})
				if txn {
					r.txnOrder = func() []string { return names(mixed) }
				}
				base := 2 * int64(r.subGroups())
				r.mustStep()
				want := r.states()
				snap, err := r.opt.SnapshotStates()
				if err != nil {
					t.Fatal(err)
				}
				defer snap.Release() // idempotent: on failure too
				if snap.Step() != 1 {
					t.Fatalf("snapshot step %d, want 1", snap.Step())
				}
				if got := r.pool.Stats().Outstanding; got != base {
					t.Fatalf("taking the snapshot changed the pool: %d buffers outstanding, want %d", got, base)
				}
				for s := 2; s <= 4; s++ {
					r.mustStep()
					if !equalStates(snapStates(t, snap, mixed), want) {
						t.Fatalf("after step %d the snapshot no longer holds the states of step 1", s)
					}
					if equalStates(r.states(), want) {
						t.Fatalf("test broken: step %d changed nothing", s)
					}
					// The held records stay out of the pool's reach from
					// the second step on: one fresh buffer per sub-group.
					extra := int64(0)
					if s >= 3 {
						extra = int64(r.subGroups())
					}
					if got := r.pool.Stats().Outstanding; got != base+extra {
						t.Fatalf("after step %d: %d buffers outstanding, want %d", s, got, base+extra)
					}
				}
				// A snapshot taken while a transaction is open has the
				// states before it.
				before := r.states()
				r.grads.set(r.md.grads(r.opt.StepCount() + 1))
				tx, err := r.opt.BeginStep(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Tensor("w2"); err != nil {
					t.Fatal(err)
				}
				mid, err := r.opt.SnapshotStates("w2", "embed")
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(context.Background()); err != nil {
					t.Fatal(err)
				}
				r.md.refStep()
				for _, name := range []string{"w2", "embed"} {
					got := snapStates(t, mid, []spec{{name, len(before[name].p)}})[name]
					if !equalStates(map[string]state{name: got}, map[string]state{name: before[name]}) {
						t.Fatalf("snapshot taken during the transaction: %s is not as before it", name)
					}
				}
				if _, ok := mid.Segments("w1", optimizer.Master); ok {
					t.Fatal("Segments of a tensor not in the snapshot")
				}
				snap.Release()
				mid.Release()
				mid.Release() // idempotent
				if _, ok := snap.Segments("w1", optimizer.Master); ok {
					t.Fatal("Segments after Release")
				}
				r.check("after the snapshots were released")
				r.mustStep()
				r.mustStep()
				r.check("two more steps")
			})
		}
	}
}

// TestSnapshotStatesLoadState: LoadState does not overwrite a held record.
func TestSnapshotStatesLoadState(t *testing.T) {
	r := newRig(t, rigConfig{memory: true, specs: mixed, seed: 12, opts: optimizer.Options{SubGroupSize: 1000}})
	r.mustStep()
	want := r.states()
	snap, err := r.opt.SnapshotStates("w2")
	if err != nil {
		t.Fatal(err)
	}
	n := len(want["w2"].p)
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i)
	}
	if err := r.opt.LoadState(context.Background(), "w2", vals, vals, vals, 9); err != nil {
		t.Fatal(err)
	}
	if got := snapStates(t, snap, []spec{{"w2", n}}); !equalStates(got, map[string]state{"w2": want["w2"]}) {
		t.Fatal("LoadState changed the snapshot's bytes")
	}
	p, _, _, err := r.opt.ReadState(context.Background(), "w2")
	if err != nil {
		t.Fatal(err)
	}
	if firstDiff(p, vals) >= 0 {
		t.Fatal("LoadState did not take effect")
	}
	snap.Release()
	if got, want := r.pool.Stats().Outstanding, 2*int64(r.subGroups()); got != want {
		t.Fatalf("%d buffers outstanding after the release, want %d", got, want)
	}
}

// TestSnapshotStatesBackpressure: with no pool memory for a fresh record,
// the step that would write a held one waits for memory (never
// overwriting the held record), then completes with the reference's bits.
func TestSnapshotStatesBackpressure(t *testing.T) {
	specs := []spec{{"w", 1024}} // one sub-group of 12 KiB
	r := newRig(t, rigConfig{memory: true, specs: specs, seed: 13, poolBytes: 256 << 10,
		opts: optimizer.Options{SubGroupSize: 1 << 20, BufferCount: 1}})
	r.mustStep()
	want := r.states()
	snap, err := r.opt.SnapshotStates()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	// Take the pool down to less than a record's size class, leaving room
	// for the gradient (4 KiB).
	var blockers []*buffers.Buffer
	defer func() {
		for _, b := range blockers {
			b.Release()
		}
	}()
	for r.pool.Stats().LargestFreeBytes >= 12<<10 {
		b, ok := r.pool.TryAcquire(r.pool.MinBufferBytes(), buffers.PurposeStaging)
		if !ok {
			t.Fatal("pool exhausted before its largest free block shrank")
		}
		blockers = append(blockers, b)
	}
	r.mustStep() // writes the other record: no new buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.step(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for r.pool.Stats().Waiting == 0 {
		select {
		case err := <-done:
			t.Fatalf("the step did not wait for a record buffer: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the step never waited for pool memory")
		}
		time.Sleep(time.Millisecond)
	}
	if !equalStates(snapStates(t, snap, specs), want) {
		t.Fatal("the held record changed")
	}
	// The snapshot's release gives its record back; the blockers go too,
	// since the buddy allocator may need their granules to rebuild a
	// block of the record's size.
	snap.Release()
	for _, b := range blockers {
		b.Release()
	}
	blockers = nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.md.refStep()
	r.check("after the waiting step")
}

// TestSnapshotStatesErrors: unknown names, a store, a closed optimizer.
func TestSnapshotStatesErrors(t *testing.T) {
	r := newRig(t, rigConfig{memory: true, specs: mixed, seed: 14, opts: optimizer.Options{SubGroupSize: 1000}})
	if _, err := r.opt.SnapshotStates("w1", "nope"); !errors.Is(err, optimizer.ErrNotRegistered) {
		t.Fatalf("unknown name: %v", err)
	}
	if got, want := r.pool.Stats().Outstanding, 2*int64(r.subGroups()); got != want {
		t.Fatalf("a failed snapshot holds buffers: %d outstanding, want %d", got, want)
	}
	snap, err := r.opt.SnapshotStates("w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.opt.Close(); err != nil {
		t.Fatal(err)
	}
	// The snapshot outlives the optimizer; its release frees the rest.
	if got := snapStates(t, snap, []spec{{"w1", 1000}}); len(got["w1"].p) != 1000 {
		t.Fatal("snapshot unreadable after Close")
	}
	snap.Release()
	if got := r.pool.Stats().Outstanding; got != 0 {
		t.Fatalf("%d buffers outstanding after Close and Release", got)
	}
	if _, err := r.opt.SnapshotStates(); !errors.Is(err, optimizer.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	rs := newRig(t, rigConfig{specs: mixed, seed: 14, opts: optimizer.Options{SubGroupSize: 1000}})
	if _, err := rs.opt.SnapshotStates(); !errors.Is(err, optimizer.ErrNotInMemory) {
		t.Fatalf("states in a store: %v", err)
	}
}
