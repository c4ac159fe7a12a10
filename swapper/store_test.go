package swapper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type rig struct {
	store *swapper.Store
	pool  *buffers.Pool
	inj   *faults.Injector
	eng   aio.Engine
}

func newRig(t *testing.T, paths int, checksums bool, backend string) *rig {
	t.Helper()
	inj := faults.New(1)
	e, err := aio.New(aio.Options{Backend: backend, BlockSizeBytes: 256 << 10, QueueDepth: 8, Faults: inj, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	// As the runtime does: io_uring moves the pool's buffers as registered
	// buffers; other backends say they have none and carry on.
	if err := pool.Register(e); err != nil && e.Name() == aio.BackendUring {
		t.Fatalf("registering the pool: %v", err)
	}
	var dirs []string
	for i := 0; i < paths; i++ {
		dirs = append(dirs, t.TempDir())
	}
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: dirs, Engine: e, Checksums: checksums, StripeBytes: 64 << 10, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &rig{store: s, pool: pool, inj: inj, eng: e}
}

func (r *rig) buf(t *testing.T, n int, fill byte) *buffers.Buffer {
	t.Helper()
	b, err := r.pool.Acquire(context.Background(), int(r.store.PaddedLen(int64(n))), buffers.PurposeStaging)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Release)
	data := b.Bytes()[:n]
	for i := range data {
		data[i] = fill + byte(i*13+i>>9)
	}
	return b
}

func TestStoreRoundTrip(t *testing.T) {
	for _, paths := range []int{1, 2, 3} {
		for _, sums := range []bool{false, true} {
			t.Run(fmt.Sprintf("paths=%d/checksums=%v", paths, sums), func(t *testing.T) {
				r := newRig(t, paths, sums, aio.BackendAuto)
				sizes := []int{1, 511, 4096, 65536 + 7, 1 << 20, 3<<20 + 123}
				for i, n := range sizes {
					b := r.buf(t, n, byte(i))
					if err := r.store.Write(context.Background(), fmt.Sprint("t", i), b.Bytes()[:n]); err != nil {
						t.Fatal(err)
					}
				}
				for i, n := range sizes {
					want := r.buf(t, n, byte(i)).Bytes()[:n]
					got := r.buf(t, n, 0xEE).Bytes()[:n]
					if err := r.store.Read(context.Background(), fmt.Sprint("t", i), got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("tensor %d (%d bytes) differs", i, n)
					}
				}
				// Overwrite with a different size class, then delete: space is reused.
				live := r.store.Stats().LiveBytes
				for i := range sizes {
					r.store.Delete(fmt.Sprint("t", i))
				}
				if st := r.store.Stats(); st.LiveBytes != 0 || live == 0 {
					t.Fatalf("live bytes after delete: %d (before %d)", st.LiveBytes, live)
				}
			})
		}
	}
}

func TestStoreENOSPCKeepsOldVersion(t *testing.T) {
	r := newRig(t, 2, true, aio.BackendPosix)
	ctx := context.Background()
	old := r.buf(t, 300_000, 1)
	if err := r.store.Write(ctx, "w", old.Bytes()[:300_000]); err != nil {
		t.Fatal(err)
	}
	r.inj.Add(faults.Rule{Kind: faults.Writes, Nth: 2, Err: syscall.ENOSPC})
	nw := r.buf(t, 300_000, 2)
	before := bytes.Clone(nw.Bytes()[:300_000])
	err := r.store.Write(ctx, "w", nw.Bytes()[:300_000])
	var te *swapper.TensorError
	if !errors.Is(err, aio.ErrNoSpace) || !errors.As(err, &te) || te.Tensor != "w" {
		t.Fatalf("want ENOSPC naming tensor w, got %v", err)
	}
	if !bytes.Equal(before, nw.Bytes()[:300_000]) {
		t.Fatal("source changed by failed write")
	}
	got := r.buf(t, 300_000, 0)
	if err := r.store.Read(ctx, "w", got.Bytes()[:300_000]); err != nil || !bytes.Equal(got.Bytes()[:300_000], old.Bytes()[:300_000]) {
		t.Fatalf("old version lost after failed write: %v", err)
	}
	r.inj.Clear()
	if err := r.store.Write(ctx, "w", nw.Bytes()[:300_000]); err != nil {
		t.Fatal(err)
	}
	if err := r.store.Read(ctx, "w", got.Bytes()[:300_000]); err != nil || !bytes.Equal(got.Bytes()[:300_000], before) {
		t.Fatalf("new version after recovery: %v", err)
	}
}

func TestStoreChecksumCatchesCorruption(t *testing.T) {
	r := newRig(t, 2, true, aio.BackendPosix)
	ctx := context.Background()
	b := r.buf(t, 200_000, 3)
	if err := r.store.Write(ctx, "layer7.weight", b.Bytes()[:200_000]); err != nil {
		t.Fatal(err)
	}
	path, off, err := r.store.Locate("layer7.weight", 150_001)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	one := []byte{0}
	f.ReadAt(one, off)
	one[0] ^= 0x40
	f.WriteAt(one, off)
	f.Close()
	got := r.buf(t, 200_000, 0)
	err = r.store.Read(ctx, "layer7.weight", got.Bytes()[:200_000])
	if !errors.Is(err, swapper.ErrChecksum) || !bytes.Contains([]byte(err.Error()), []byte("layer7.weight")) {
		t.Fatalf("corruption not caught with the tensor's name: %v", err)
	}
}

// TestStoreEIONamesTensor, with checksums off and on (then the I/O is
// waited for, and checksummed, by a goroutine of its own): an I/O error on
// a read or a write names the tensor, and a failed write leaves the
// previous version readable.
func TestStoreEIONamesTensor(t *testing.T) {
	for _, sums := range []bool{false, true} {
		t.Run(fmt.Sprintf("checksums=%v", sums), func(t *testing.T) {
			r := newRig(t, 1, sums, aio.BackendPosix)
			ctx := context.Background()
			b := r.buf(t, 8192, 3)
			if err := r.store.Write(ctx, "layer2.bias", b.Bytes()[:8192]); err != nil {
				t.Fatal(err)
			}
			r.inj.Add(faults.Rule{Kind: faults.Reads, Err: syscall.EIO, Times: 1})
			err := r.store.Read(ctx, "layer2.bias", b.Bytes()[:8192])
			if !errors.Is(err, aio.ErrIO) || !bytes.Contains([]byte(err.Error()), []byte(`"layer2.bias"`)) {
				t.Fatalf("read EIO without tensor name: %v", err)
			}
			r.inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.EIO, Times: 1})
			other := r.buf(t, 8192, 9)
			err = r.store.Write(ctx, "layer2.bias", other.Bytes()[:8192])
			if !errors.Is(err, aio.ErrIO) || !bytes.Contains([]byte(err.Error()), []byte(`"layer2.bias"`)) {
				t.Fatalf("write EIO without tensor name: %v", err)
			}
			got, want := r.buf(t, 8192, 0), r.buf(t, 8192, 3)
			if err := r.store.Read(ctx, "layer2.bias", got.Bytes()[:8192]); err != nil || !bytes.Equal(got.Bytes()[:8192], want.Bytes()[:8192]) {
				t.Fatalf("the version before the failed write: %v", err)
			}
		})
	}
}

func TestStoreRenameAtomic(t *testing.T) {
	r := newRig(t, 1, false, aio.BackendPosix)
	ctx := context.Background()
	a, b := r.buf(t, 5000, 1), r.buf(t, 5000, 2)
	r.store.Write(ctx, "a", a.Bytes()[:5000])
	r.store.Write(ctx, "a@next", b.Bytes()[:5000])
	if err := r.store.Rename([2]string{"a@next", "a"}, [2]string{"missing", "x"}); !errors.Is(err, swapper.ErrNotFound) {
		t.Fatalf("rename with a missing source: %v", err)
	}
	got := r.buf(t, 5000, 0)
	r.store.Read(ctx, "a", got.Bytes()[:5000])
	if !bytes.Equal(got.Bytes()[:5000], a.Bytes()[:5000]) {
		t.Fatal("failed rename changed a")
	}
	if err := r.store.Rename([2]string{"a@next", "a"}); err != nil {
		t.Fatal(err)
	}
	r.store.Read(ctx, "a", got.Bytes()[:5000])
	if !bytes.Equal(got.Bytes()[:5000], b.Bytes()[:5000]) {
		t.Fatal("rename not applied")
	}
	if _, ok := r.store.Len("a@next"); ok {
		t.Fatal("staging name survived rename")
	}
}

func TestStoreBadPaths(t *testing.T) {
	e, _ := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	defer e.Close()
	if _, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{"/nonexistent/nvme0"}, Engine: e}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("does not exist")) {
		t.Fatalf("missing path: %v", err)
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if _, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{file}, Engine: e}); err == nil {
		t.Fatal("file as NVMe path accepted")
	}
	// A read-only mount refuses writes even for root.
	ro := t.TempDir()
	if err := syscall.Mount("tmpfs", ro, "tmpfs", syscall.MS_RDONLY, ""); err == nil {
		defer syscall.Unmount(ro, 0)
		_, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{ro}, Engine: e})
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte("not writable")) {
			t.Fatalf("read-only path: %v", err)
		}
	} else {
		t.Logf("cannot mount a read-only tmpfs here (%v); read-only check not exercised", err)
	}
}

func TestStoreCloseRemovesScratch(t *testing.T) {
	dir := t.TempDir()
	e, _ := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	defer e.Close()
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("scratch dir not created: %v", ents)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("scratch left after Close: %v", ents)
	}
}

// TestStoreOnFilesystemWithoutDirect: with the optional O_DIRECT policy a
// swap store works on a filesystem that refuses O_DIRECT (ramfs, mounted
// here), and with the required policy it fails saying why, leaving nothing.
func TestStoreOnFilesystemWithoutDirect(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount ramfs here: %v", err)
	}
	defer syscall.Unmount(dir, 0)
	for _, policy := range []aio.DirectPolicy{aio.DirectOptional, aio.DirectRequired} {
		e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Direct: policy, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Checksums: true, Logger: quiet})
		if policy == aio.DirectRequired {
			if !errors.Is(err, aio.ErrNoDirect) {
				t.Fatalf("required on ramfs: want ErrNoDirect, got %v", err)
			}
		} else {
			if err != nil {
				t.Fatalf("optional on ramfs: %v", err)
			}
			data := []byte("seventeen bytes!!")
			pool, _ := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Logger: quiet})
			b, _ := pool.Acquire(context.Background(), 4096, buffers.PurposeStaging)
			copy(b.Bytes(), data)
			if err := s.Write(context.Background(), "t", b.Bytes()[:len(data)]); err != nil {
				t.Fatal(err)
			}
			clear(b.Bytes())
			if err := s.Read(context.Background(), "t", b.Bytes()[:len(data)]); err != nil || !bytes.Equal(b.Bytes()[:len(data)], data) {
				t.Fatalf("round trip on ramfs: %v", err)
			}
			b.Release()
			s.Close()
			pool.Close()
		}
		e.Close()
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("policy %s left %d entries", policy, len(ents))
		}
	}
}

// TestStoreCompletedAt: a finished operation says when its I/O completed,
// between its start and the return of Wait; nothing before Wait.
func TestStoreCompletedAt(t *testing.T) {
	r := newRig(t, 2, true, aio.BackendAuto)
	b := r.buf(t, 3<<20+5, 1)
	start := time.Now()
	p, err := r.store.WriteAsync("x", b.Bytes()[:3<<20+5])
	if err != nil {
		t.Fatal(err)
	}
	if !p.CompletedAt().IsZero() {
		t.Fatal("CompletedAt is set before Wait")
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	if at := p.CompletedAt(); at.Before(start) || at.After(end) {
		t.Fatalf("write completed at %v, outside [%v, %v]", at, start, end)
	}
	start = time.Now()
	p, err = r.store.ReadAsync("x", b.Bytes()[:3<<20+5])
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the read completes well before Wait
	waitAt := time.Now()
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if at := p.CompletedAt(); at.Before(start) || at.After(time.Now()) {
		t.Fatalf("read completed at %v, outside its span", at)
	} else if at.After(waitAt) {
		t.Logf("the read completed only after Wait began (%v later): a slow disk", at.Sub(waitAt))
	}
	if r.eng.Name() == aio.BackendUring && r.eng.Stats().FixedBufferPieces == 0 {
		t.Fatal("io_uring moved no piece of the registered pool's buffers as a registered buffer")
	}
}
