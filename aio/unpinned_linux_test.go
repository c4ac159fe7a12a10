package aio_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/testenv"
)

const unpinnedChildEnv = "ZINF_AIO_UNPINNED_CHILD"

// TestRegisteredMemoryUnpinned runs TestRegisteredMemoryUnpinnedChild in a
// copy of this test binary as an unprivileged user (uid nobody when we are
// root: root's CAP_IPC_LOCK ignores RLIMIT_MEMLOCK), where the memlock
// limit is too small both for mlock and for io_uring's registered
// buffers. It checks the real fallbacks end to end: the pool runs unpinned,
// Pool.Register reports why io_uring would not register the arena, the
// engine says so once, and every byte still moves correctly.
func TestRegisteredMemoryUnpinned(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a subprocess")
	}
	testenv.SkipUnavailable(t, aio.BackendUring, aio.Available(aio.BackendUring))
	cmd, err := testenv.Unprivileged(t, t.Context(), "^TestRegisteredMemoryUnpinnedChild$", unpinnedChildEnv+"=1")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	t.Logf("child output:\n%s", out)
	if err != nil {
		t.Fatalf("child failed: %v", err)
	}
	if !bytes.Contains(out, []byte("unpinned child ok")) {
		t.Fatal("the child did not run the fallback to the end")
	}
}

func TestRegisteredMemoryUnpinnedChild(t *testing.T) {
	if os.Getenv(unpinnedChildEnv) == "" {
		t.Skip("runs only as TestRegisteredMemoryUnpinned's child")
	}
	const limit = 64 << 10
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		t.Fatal(err)
	}
	r.Cur = limit
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		t.Fatalf("lowering RLIMIT_MEMLOCK: %v", err)
	}
	log, out := logTo()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 8 << 20, Pin: buffers.PinAuto, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if pool.Pinned() {
		t.Fatal("the pool was pinned under a 64 KiB memlock limit: the child still has CAP_IPC_LOCK")
	}
	e, err := aio.New(aio.Options{Backend: aio.BackendUring, BlockSizeBytes: 256 << 10, QueueDepth: 8, IntraOpParallelism: 2, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	err = pool.Register(e)
	if !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK") {
		t.Fatalf("Pool.Register under a 64 KiB memlock limit: %v; want ENOMEM and what to do about it", err)
	}
	if err := pool.Register(e); err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("registering the arena twice: %v", err)
	}
	f, err := e.Open(filepath.Join(t.TempDir(), "data"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var bufs []*buffers.Buffer
	for i := range 4 {
		b, err := pool.Acquire(ctx, 1<<20, buffers.PurposeOptimizer)
		if err != nil {
			t.Fatal(err)
		}
		for j, x := 0, b.Bytes(); j < len(x); j++ {
			x[j] = byte(i*3 + j*11)
		}
		if _, err := e.WriteAt(ctx, f, b.Bytes(), int64(i)<<20); err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	for i, b := range bufs {
		want := bytes.Clone(b.Bytes())
		clear(b.Bytes())
		if _, err := e.ReadAt(ctx, f, b.Bytes(), int64(i)<<20); err != nil || !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("buffer %d: read back %v, equal %v", i, err, bytes.Equal(b.Bytes(), want))
		}
		b.Release()
	}
	st := e.Stats()
	if st.FixedBufferPieces != 0 || st.RegisteredBytes != 0 || st.FixedFilePieces == 0 {
		t.Fatalf("stats %+v: want no registered-buffer pieces and no bytes registered (the fallback), fixed files in use", st)
	}
	logged := out.String()
	if n := strings.Count(logged, "could not register the pinned memory"); n != 1 {
		t.Fatalf("the registration fallback was logged %d times, want once:\n%s", n, logged)
	}
	if !strings.Contains(logged, "cannot pin") {
		t.Fatalf("the pool's own fallback was not logged:\n%s", logged)
	}
	f.Close()
	if err := errors.Join(pool.Close(), e.Close()); err != nil {
		t.Fatal(err)
	}
	fmt.Println("unpinned child ok")
}
