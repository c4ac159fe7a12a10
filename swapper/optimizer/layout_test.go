package optimizer_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestLayoutFor checks the record layouts: small sub-groups back to back
// (12 bytes per element), large ones staggered so that the three states
// and a page-aligned gradient slice are pairwise distinct modulo every
// power of two from 256 bytes to 1 TiB, with the padding at most 2.1% of the
// record.
func TestLayoutFor(t *testing.T) {
	sizes := []int{0, 1, 5, 1000, optimizer.StaggerMinElems - 1, optimizer.StaggerMinElems, optimizer.StaggerMinElems + 1,
		100_003, 1 << 20, 1<<20 + 1, 16 << 20, 64 << 20, 64<<20 - 1, 1e9}
	for n := optimizer.StaggerMinElems; n < optimizer.StaggerMinElems+4096; n += 97 {
		sizes = append(sizes, n)
	}
	for _, n := range sizes {
		l := optimizer.LayoutFor(n)
		seg := 4 * int64(n)
		if l.Elems != n {
			t.Fatalf("LayoutFor(%d).Elems = %d", n, l.Elems)
		}
		// In order, inside the record, not overlapping.
		end := int64(0)
		for k, off := range l.Offsets {
			if off < end || off%4 != 0 {
				t.Fatalf("n=%d: state %d at %d overlaps the previous one (ending at %d) or is not float-aligned", n, k, off, end)
			}
			end = off + seg
		}
		if end != l.Bytes {
			t.Fatalf("n=%d: the record is %d bytes, its last state ends at %d", n, l.Bytes, end)
		}
		if n < optimizer.StaggerMinElems {
			if l.Offsets != [3]int64{0, seg, 2 * seg} {
				t.Fatalf("n=%d below the stagger threshold: offsets %v, want back to back", n, l.Offsets)
			}
			continue
		}
		if pad := float64(l.Bytes-3*seg) / float64(l.Bytes); pad > 0.021 || n >= 16<<20 && pad > 0.0001 {
			t.Errorf("n=%d: padding is %.2f%% of the record", n, 100*pad)
		}
		// The gradient slice starts page-aligned: offset 0 modulo a page.
		starts := []int64{l.Offsets[0], l.Offsets[1], l.Offsets[2], 0}
		for a := range starts {
			for b := a + 1; b < len(starts); b++ {
				d := starts[b] - starts[a]
				for sh := 8; sh <= 40; sh++ {
					if d%(1<<sh) == 0 {
						t.Fatalf("n=%d: operands %d and %d start %d bytes apart, a multiple of 2^%d", n, a, b, d, sh)
					}
				}
			}
		}
		for k, off := range l.Offsets {
			if off%64 != 0 {
				t.Errorf("n=%d: state %d at %d does not start a cache line", n, k, off)
			}
		}
	}
}

// TestStaggeredRecords steps tensors with staggered sub-group records
// (and small ones beside them), with states on NVMe and in pinned memory,
// a pipeline and several update workers, in a pool of exactly
// PinnedNeedBytes: the result is the reference's bit for bit, the records
// in the store hold the states at their layout's offsets with zero
// padding, StateRecords reports the layouts, and snapshots serve the
// states.
func TestStaggeredRecords(t *testing.T) {
	// Sub-groups of two update chunks (so that 3 workers split them), one
	// just above the stagger threshold, small ones.
	sg := 1 << 17
	specs := []spec{{"big", 3*sg + 5}, {"mid", optimizer.StaggerMinElems + 1000}, {"small", 777}}
	for _, memory := range []bool{false, true} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("memory=%v/workers=%d", memory, workers), func(t *testing.T) {
				r := newRig(t, rigConfig{memory: memory, exactPool: true, specs: specs, seed: 21, checksums: true,
					opts: optimizer.Options{SubGroupSize: sg, PipelineDepth: 2, UpdateWorkers: workers,
						Hyper: optimizer.Hyper{LR: 1e-2, WeightDecay: 0.01, AdamW: true}}})
				for s := 1; s <= 3; s++ {
					r.mustStep()
					r.check(fmt.Sprintf("step %d", s))
				}
				st := r.opt.Stats()
				wantRec := int64(0)
				for _, s := range specs {
					for off := 0; off < s.n; off += sg {
						wantRec += optimizer.LayoutFor(min(sg, s.n-off)).Bytes
					}
				}
				if st.RecordBytes != wantRec || st.StateBytes != 12*int64(r.md.elements()) {
					t.Fatalf("Stats: RecordBytes %d StateBytes %d, want %d and %d", st.RecordBytes, st.StateBytes, wantRec, 12*r.md.elements())
				}
				if !memory && st.Total.BytesRead != 3*wantRec {
					t.Fatalf("3 steps read %d bytes of records, want %d", st.Total.BytesRead, 3*wantRec)
				}
				states := r.states()
				if memory {
					snap, err := r.opt.SnapshotStates()
					if err != nil {
						t.Fatal(err)
					}
					defer snap.Release()
					if !equalStates(snapStates(t, snap, specs), states) {
						t.Fatal("the snapshot's states differ from ReadState's")
					}
					return
				}
				checkStoredRecords(t, r, specs, states)
			})
		}
	}
}

// checkStoredRecords reads every record of specs from r's store and checks
// it against the layout StateRecords reports and the states ReadState
// returned: each state at its offset, zeros in between.
func checkStoredRecords(t *testing.T, r *rig, specs []spec, states map[string]state) {
	t.Helper()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 8 << 20, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	staggered := 0
	for _, s := range specs {
		recs, ok := r.opt.StateRecords(s.name)
		if !ok {
			t.Fatalf("StateRecords(%s): not stored", s.name)
		}
		want := states[s.name]
		off := 0
		for _, rec := range recs {
			if rec.Layout != optimizer.LayoutFor(rec.Elems) {
				t.Fatalf("%s: layout %+v, want LayoutFor(%d) = %+v", rec.Key, rec.Layout, rec.Elems, optimizer.LayoutFor(rec.Elems))
			}
			if l, ok := r.store.Len(rec.Key); !ok || l != rec.Layout.Bytes {
				t.Fatalf("%s: %d bytes in the store (%v), layout says %d", rec.Key, l, ok, rec.Layout.Bytes)
			}
			if rec.Layout.Offsets[0] != 0 {
				staggered++
			}
			b, err := pool.Acquire(context.Background(), int(r.store.PaddedLen(rec.Layout.Bytes)), buffers.PurposeStaging)
			if err != nil {
				t.Fatal(err)
			}
			raw := b.Bytes()[:rec.Layout.Bytes]
			if err := r.store.Read(context.Background(), rec.Key, raw); err != nil {
				b.Release()
				t.Fatal(err)
			}
			vals := buffers.Float32Bytes(raw)
			inState := make([]bool, len(vals))
			for k, w := range [][]float32{want.p, want.m, want.v} {
				lo := int(rec.Layout.Offsets[k] / 4)
				got := vals[lo : lo+rec.Elems]
				if i := firstDiff(got, w[off:off+rec.Elems]); i >= 0 {
					t.Fatalf("%s: state %d element %d is %v in the record, ReadState says %v", rec.Key, k, i, got[i], w[off+i])
				}
				for i := lo; i < lo+rec.Elems; i++ {
					inState[i] = true
				}
			}
			for i, v := range vals {
				if !inState[i] && math.Float32bits(v) != 0 {
					t.Fatalf("%s: padding at byte %d is %08x, want zero", rec.Key, 4*i, math.Float32bits(v))
				}
			}
			b.Release()
			off += rec.Elems
		}
	}
	if staggered == 0 {
		t.Fatal("no record was staggered: the test does not test the stagger")
	}
}
