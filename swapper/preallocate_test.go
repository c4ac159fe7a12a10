package swapper_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// swapFileSizes is the length of the swap file in each of a store's run
// directories.
func swapFileSizes(t *testing.T, s *swapper.Store) []int64 {
	t.Helper()
	var out []int64
	for _, d := range s.Paths() {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var n int64 = -1
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "swap.") {
				fi, err := os.Stat(filepath.Join(d, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				n = fi.Size()
			}
		}
		if n < 0 {
			t.Fatalf("no swap file in %s", d)
		}
		out = append(out, n)
	}
	return out
}

// TestPreallocate: a store preallocated for its tensors' two versions
// takes that space at once and never grows past it: every write of the
// first version and of four steps' staged copies lands in reserved space
// (the files keep their length and their blocks), and the bytes read back.
func TestPreallocate(t *testing.T) {
	forEachWorkload(t, func(t *testing.T, r *rig, w workload, paths int, bufs []*buffers.Buffer) {
		ctx := t.Context()
		bound := r.store.DiskBytes(w.sizes, swapper.CopyOnWriteVersions) - swapper.PathOverheadBytes
		if err := r.store.Preallocate(w.sizes, swapper.CopyOnWriteVersions); err != nil {
			t.Fatal(err)
		}
		sizes0, disk0 := swapFileSizes(t, r.store), onDisk(t, r.store)
		var longest, total int64
		for i := range sizes0 {
			longest = max(longest, sizes0[i])
			total += sizes0[i]
			if disk0[i] < sizes0[i] {
				t.Errorf("path %d: the file is %d bytes long but only %d are allocated", i, sizes0[i], disk0[i])
			}
		}
		if longest != bound {
			t.Fatalf("the longest preallocated file is %d bytes, want the fullest path's bound %d (files %v)", longest, bound, sizes0)
		}
		var logical int64
		for _, n := range w.sizes {
			logical += n
		}
		if total < 2*logical {
			t.Fatalf("%d bytes preallocated over %d paths for two versions of %d bytes", total, paths, logical)
		}
		// Again: nothing changes.
		if err := r.store.Preallocate(w.sizes, swapper.CopyOnWriteVersions); err != nil {
			t.Fatal(err)
		}
		if err := writeAll(r.store, w.sizes, bufs, key, 4); err != nil {
			t.Fatal(err)
		}
		for step := range 4 {
			if err := w.step(ctx, r.store, bufs); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
		sizes1, disk1 := swapFileSizes(t, r.store), onDisk(t, r.store)
		for i := range sizes0 {
			if sizes1[i] != sizes0[i] {
				t.Errorf("path %d: the file grew from %d to %d bytes", i, sizes0[i], sizes1[i])
			}
			// The run directory's own entries (the lock file) may take a
			// block more; the swap file no more blocks.
			if disk1[i] > disk0[i]+swapper.PathOverheadBytes {
				t.Errorf("path %d: %d bytes allocated after the steps, %d after Preallocate", i, disk1[i], disk0[i])
			}
		}
		for i := range w.sizes {
			// The gradient steps write key(i) from the buffer at the
			// other end (backward order).
			src := bufs[i]
			if w.name == "grads" {
				src = bufs[len(bufs)-1-i]
			}
			n, _ := r.store.Len(key(i))
			got := r.buf(t, int(n), 0)
			if err := r.store.Read(ctx, key(i), got.Bytes()[:n]); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes()[:n], src.Bytes()[:n]) {
				t.Fatalf("%s reads back other bytes than were written", key(i))
			}
		}
	})
}

// TestPreallocateClosed: a closed store says so.
func TestPreallocateClosed(t *testing.T) {
	r := newRig(t, 1, true, aio.BackendAuto)
	r.store.Close()
	if err := r.store.Preallocate([]int64{1 << 20}, 2); !errors.Is(err, swapper.ErrClosed) {
		t.Fatalf("Preallocate on a closed store: %v, want ErrClosed", err)
	}
}
