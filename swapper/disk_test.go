package swapper_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// onDisk is what a store's run directory on each path really takes: the
// allocated blocks of the directory and every file in it.
func onDisk(t *testing.T, s *swapper.Store) []int64 {
	t.Helper()
	var out []int64
	for _, d := range s.Paths() {
		var total int64
		err := filepath.WalkDir(d, func(_ string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			total += info.Sys().(*syscall.Stat_t).Blocks * 512
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, total)
	}
	return out
}

// workload is one store's tensors, written the way a swapper writes them.
type workload struct {
	name  string
	sizes []int64
	// step writes one training step's new versions.
	step func(ctx context.Context, s *swapper.Store, bufs []*buffers.Buffer) error
}

// A model of 3 layers, width 300 (sizes off the alignment), one rank.
var (
	paramSizes = []int64{300 * 300 * 2, 300 * 2, 300 * 300 * 2, 300 * 2, 300 * 300 * 2, 300 * 2}
	gradSizes  = []int64{300 * 300 * 4, 300 * 4, 300 * 300 * 4, 300 * 4, 300 * 300 * 4, 300 * 4}
	// Optimizer records of sub-groups of at most 40000 elements: 12 bytes
	// (master, exp_avg, exp_avg_sq) per element.
	optimSizes = []int64{40000 * 12, 40000 * 12, 10000 * 12, 300 * 12, 40000 * 12, 40000 * 12, 10000 * 12, 300 * 12, 40000 * 12, 40000 * 12, 10000 * 12, 300 * 12}
)

func key(i int) string { return fmt.Sprint("t", i) }

// writeAll starts a write of every tensor under name(i), at most inFlight
// at once, and waits for them.
func writeAll(s *swapper.Store, sizes []int64, bufs []*buffers.Buffer, name func(int) string, inFlight int) error {
	var pend []*swapper.Pending
	for i, n := range sizes {
		if len(pend) == inFlight {
			if err := pend[0].Wait(); err != nil {
				return err
			}
			pend = pend[1:]
		}
		p, err := s.WriteAsync(name(i), bufs[i].Bytes()[:n])
		if err != nil {
			return err
		}
		pend = append(pend, p)
	}
	for _, p := range pend {
		if err := p.Wait(); err != nil {
			return err
		}
	}
	return nil
}

var workloads = []workload{
	{"params", paramSizes, func(ctx context.Context, s *swapper.Store, bufs []*buffers.Buffer) error {
		// param.StageUpdate for every tensor, then CommitUpdates' rename.
		if err := writeAll(s, paramSizes, bufs, func(i int) string { return key(i) + "@next.1" }, 4); err != nil {
			return err
		}
		var pairs [][2]string
		for i := range paramSizes {
			pairs = append(pairs, [2]string{key(i) + "@next.1", key(i)})
		}
		return s.Rename(pairs...)
	}},
	{"grads", gradSizes, func(ctx context.Context, s *swapper.Store, bufs []*buffers.Buffer) error {
		// Two micro-steps of write-behind, backward order.
		for range 2 {
			if err := writeAll(s, gradSizes, bufs, func(i int) string { return key(len(gradSizes) - 1 - i) }, 3); err != nil {
				return err
			}
		}
		return nil
	}},
	{"optimizer", optimSizes, func(ctx context.Context, s *swapper.Store, bufs []*buffers.Buffer) error {
		// Every sub-group's new record to "~staged", then the commit:
		// key -> ~prev, ~staged -> key, ~prev deleted.
		if err := writeAll(s, optimSizes, bufs, func(i int) string { return key(i) + "~staged" }, 2); err != nil {
			return err
		}
		var pairs [][2]string
		for i := range optimSizes {
			pairs = append(pairs, [2]string{key(i), key(i) + "~prev"}, [2]string{key(i) + "~staged", key(i)})
		}
		if err := s.Rename(pairs...); err != nil {
			return err
		}
		for i := range optimSizes {
			s.Delete(key(i) + "~prev")
		}
		return nil
	}},
}

// TestDiskBytesBoundsRealFiles runs a few steps of each swapper's write
// pattern and checks that DiskBytes is an upper bound on the disk the
// store's files really take, and, where every tensor has two versions at
// once (params staged until commit, optimizer records until the step
// commits), that it is over by no more than PathOverheadBytes per path.
func TestDiskBytesBoundsRealFiles(t *testing.T) {
	forEachWorkload(t, func(t *testing.T, r *rig, w workload, paths int, bufs []*buffers.Buffer) {
		ctx := t.Context()
		// The first version of every tensor, as registration writes it.
		if err := writeAll(r.store, w.sizes, bufs, key, 4); err != nil {
			t.Fatal(err)
		}
		predicted := r.store.DiskBytes(w.sizes, swapper.CopyOnWriteVersions)
		var fullest int64 // the most any path took at any step
		for step := range 4 {
			if err := w.step(ctx, r.store, bufs); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			for _, b := range onDisk(t, r.store) {
				fullest = max(fullest, b)
			}
		}
		st := r.store.Stats()
		t.Logf("predicted %d bytes per path, the fullest path took %d (extents span %d over all paths), live %d",
			predicted, fullest, st.FileBytes, st.LiveBytes)
		if fullest > predicted || st.FileBytes > predicted*int64(paths) {
			t.Fatalf("DiskBytes %d is below what the files took: %d on a path, %d spanned", predicted, fullest, st.FileBytes)
		}
		// The gradient store writes only a few tensors behind at a
		// time, so it stays nearer one copy: only the bound holds.
		if w.name != "grads" {
			if slack := predicted - fullest; slack > swapper.PathOverheadBytes {
				t.Fatalf("DiskBytes %d over-predicts by %d, more than the stated margin %d", predicted, slack, swapper.PathOverheadBytes)
			}
		}
		// Reading back still works after the steps.
		n, _ := r.store.Len(key(0))
		got := r.buf(t, int(n), 0)
		if err := r.store.Read(ctx, key(0), got.Bytes()[:n]); err != nil {
			t.Fatal(err)
		}
	})
}

// forEachWorkload runs f, as a subtest, for every workload on a fresh
// store of 1 and of 2 paths, with a buffer per tensor filled with its
// index + 1.
func forEachWorkload(t *testing.T, f func(t *testing.T, r *rig, w workload, paths int, bufs []*buffers.Buffer)) {
	for _, paths := range []int{1, 2} {
		for _, w := range workloads {
			t.Run(fmt.Sprintf("%s/paths=%d", w.name, paths), func(t *testing.T) {
				r := newRig(t, paths, true, aio.BackendAuto)
				bufs := make([]*buffers.Buffer, len(w.sizes))
				for i, n := range w.sizes {
					bufs[i] = r.buf(t, int(n), byte(i+1))
				}
				f(t, r, w, paths, bufs)
			})
		}
	}
}

// TestDiskBytesStriping checks the per-path figure against the striping
// rule: stripe k of a tensor goes to path k mod paths, and the fullest path
// decides.
func TestDiskBytesStriping(t *testing.T) {
	o := swapper.StoreOptions{Paths: []string{"a", "b"}, StripeBytes: 64 << 10}
	// 200000 bytes pad to 200704 = 3 stripes + 4096: path a gets stripes 0
	// and 2, path b stripe 1 and the 4096-byte tail.
	if got, want := o.DiskBytes([]int64{200_000}, 4096, 2), int64(2*2*65536+swapper.PathOverheadBytes); got != want {
		t.Fatalf("DiskBytes = %d, want %d", got, want)
	}
	if got, want := o.DiskBytes([]int64{200_000, 0, -5}, 4096, 3), int64(3*2*65536+swapper.PathOverheadBytes); got != want {
		t.Fatalf("3 versions: DiskBytes = %d, want %d", got, want)
	}
	one := swapper.StoreOptions{Paths: []string{"a"}, ReserveBytes: 10 << 20}
	if got, want := one.DiskBytes([]int64{1}, 0, 0), int64(10<<20+swapper.PathOverheadBytes); got != want {
		t.Fatalf("reserve: DiskBytes = %d, want %d", got, want)
	}
	if got, want := one.DiskBytes(nil, 512, 2), int64(10<<20+swapper.PathOverheadBytes); got != want {
		t.Fatalf("no tensors: DiskBytes = %d, want %d", got, want)
	}
}

func TestCheckFreeSpace(t *testing.T) {
	dir := t.TempDir()
	if err := swapper.CheckFreeSpace([]string{dir}, 1<<20); err != nil {
		t.Fatalf("1 MiB in %s: %v", dir, err)
	}
	err := swapper.CheckFreeSpace([]string{dir}, 1<<62)
	var se *swapper.SpaceError
	if !errors.As(err, &se) || !errors.Is(err, aio.ErrNoSpace) || se.Path != dir || se.NeedBytes != 1<<62 || se.FreeBytes <= 0 ||
		!strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), fmt.Sprint(int64(1<<62))) || !strings.Contains(err.Error(), fmt.Sprint(se.FreeBytes)) {
		t.Fatalf("want a SpaceError naming %s, the need and the free bytes: %v", dir, err)
	}
	if err := swapper.CheckFreeSpace([]string{filepath.Join(dir, "missing")}, 1); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing path: %v", err)
	}
}

// TestCheckFreeSpaceSmallFilesystem mounts a small tmpfs: paths sharing it
// add up their needs, a store whose DiskBytes fits runs its steps without
// running out of space, and ramfs, which reports no free space, is not
// held against.
func TestCheckFreeSpaceSmallFilesystem(t *testing.T) {
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, 0) })
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	os.Mkdir(a, 0o755)
	os.Mkdir(b, 0o755)
	if err := swapper.CheckFreeSpace([]string{a}, 5<<20); err != nil {
		t.Fatalf("5 MiB of 8: %v", err)
	}
	err := swapper.CheckFreeSpace([]string{a, b}, 5<<20)
	var se *swapper.SpaceError
	if !errors.As(err, &se) || se.NeedBytes != 10<<20 || se.FreeBytes != 8<<20 || len(se.Shared) != 1 || se.Shared[0] != b || !strings.Contains(err.Error(), b) {
		t.Fatalf("two paths on one 8 MiB filesystem needing 5 MiB each: %v", err)
	}
	if err := swapper.CheckSpace(swapper.SpaceNeed{Path: a, Bytes: 3 << 20}, swapper.SpaceNeed{Path: b, Bytes: 4 << 20}); err != nil {
		t.Fatalf("3 + 4 MiB of 8: %v", err)
	}

	// The optimizer workload needs two copies of its 3.1 MiB of records:
	// DiskBytes says it fits in 8 MiB, and its steps run there.
	w := workloads[2]
	need := swapper.StoreOptions{Paths: []string{a}}.DiskBytes(w.sizes, 0, 0)
	if err := swapper.CheckFreeSpace([]string{a}, need); err != nil {
		t.Fatalf("need %d: %v", need, err)
	}
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{a}, Engine: e, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 16 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	bufs := make([]*buffers.Buffer, len(w.sizes))
	for i, n := range w.sizes {
		if bufs[i], err = pool.Acquire(t.Context(), int(s.PaddedLen(n)), buffers.PurposeStaging); err != nil {
			t.Fatal(err)
		}
		defer bufs[i].Release()
	}
	if err := writeAll(s, w.sizes, bufs, key, 2); err != nil {
		t.Fatal(err)
	}
	for step := range 3 {
		if err := w.step(t.Context(), s, bufs); err != nil {
			t.Fatalf("step %d on a filesystem DiskBytes said was enough: %v", step, err)
		}
	}

	ram := t.TempDir()
	if err := syscall.Mount("ramfs", ram, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount ramfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(ram, 0) })
	if err := swapper.CheckFreeSpace([]string{ram}, 1<<40); err != nil {
		t.Fatalf("ramfs reports no free space; it must not be held against it: %v", err)
	}
}

// TestFileBytesBoundUnderRandomInterleaving writes tensors of mixed sizes
// in random order, each with at most one new version in flight beside its
// current one, and checks that the swap file never spans more than
// DiskBytes says for two versions: the allocator's bound, which first fit
// breaks on such patterns (holes between small tensors push large ones to
// the end).
func TestFileBytesBoundUnderRandomInterleaving(t *testing.T) {
	for seed := int64(1); seed <= 8; seed++ {
		rng := rand.New(rand.NewSource(seed))
		r := newRig(t, 1, false, aio.BackendPosix)
		align := r.store.Alignment()
		sizes := make([]int64, 2+rng.Intn(5))
		for i := range sizes {
			sizes[i] = align * int64(1+rng.Intn(16))
			if rng.Intn(3) == 0 {
				sizes[i] = 64 * align
			}
		}
		bufs := make([]*buffers.Buffer, len(sizes))
		for i, n := range sizes {
			bufs[i] = r.buf(t, int(n), byte(i))
		}
		if err := writeAll(r.store, sizes, bufs, key, 1); err != nil {
			t.Fatal(err)
		}
		pending := make([]*swapper.Pending, len(sizes))
		for range 300 {
			i := rng.Intn(len(sizes))
			if pending[i] == nil {
				p, err := r.store.WriteAsync(key(i), bufs[i].Bytes()[:sizes[i]])
				if err != nil {
					t.Fatal(err)
				}
				pending[i] = p
				continue
			}
			if err := pending[i].Wait(); err != nil {
				t.Fatal(err)
			}
			pending[i] = nil
		}
		for _, p := range pending {
			if p != nil {
				p.Wait()
			}
		}
		bound := r.store.DiskBytes(sizes, 2) - swapper.PathOverheadBytes
		if got := r.store.Stats().FileBytes; got > bound {
			t.Fatalf("seed %d, sizes %v: the swap file spans %d bytes, over the two-version bound %d", seed, sizes, got, bound)
		}
	}
}
