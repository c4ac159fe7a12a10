package aio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/test/testenv"
)

// refuseRegister makes io_uring_register fail with errno for opcode, as a
// small RLIMIT_MEMLOCK (ENOMEM for buffers) or an old kernel (EINVAL for a
// sparse file table) would, until the end of the test.
func refuseRegister(t *testing.T, opcode uintptr, errno unix.Errno) {
	t.Helper()
	old := uringRegisterFn
	uringRegisterFn = func(fd int, op uintptr, arg unsafe.Pointer, n int) (int, unix.Errno) {
		if op == opcode {
			return -1, errno
		}
		return old(fd, op, arg, n)
	}
	t.Cleanup(func() { uringRegisterFn = old })
}

// lockedLog is a log sink safe for the engine's goroutines.
type lockedLog = testenv.SyncBuffer

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// fixedRoundTrip writes a pattern through buf to a new file with e, reads
// it back into buf after clearing it, and checks the bytes, with and
// without faults in the way.
func fixedRoundTrip(t *testing.T, e Engine, path string, buf []byte) {
	t.Helper()
	f, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range buf {
		buf[i] = byte(i*5 + i>>9)
	}
	want := bytes.Clone(buf)
	if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
		t.Fatal(err)
	}
	clear(buf)
	if n, err := e.ReadAt(context.Background(), f, buf, 0); err != nil || n != len(buf) || !bytes.Equal(buf, want) {
		t.Fatalf("round trip: %d bytes, %v, equal %v", n, err, bytes.Equal(buf, want))
	}
}

// shortFaults shortens every third piece and fails every seventh with
// EAGAIN, so the fallbacks run through continuations and retries too.
type shortFaults struct {
	mu sync.Mutex
	n  int
}

func (h *shortFaults) Before(p PieceInfo) Fault {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	switch {
	case h.n%7 == 0:
		return Fault{Err: syscall.EAGAIN}
	case h.n%3 == 0 && p.Len > 2*p.Align:
		return Fault{ShortLen: p.Len / 2 / p.Align * p.Align}
	}
	return Fault{}
}

// TestRegisterBuffersRefused: when io_uring refuses the registration (a
// memlock limit too small for the pinned pool, without CAP_IPC_LOCK),
// RegisterMemory says why and what to do, the engine logs it once, and the
// memory is moved with plain reads and writes, correctly, faults included.
func TestRegisterBuffersRefused(t *testing.T) {
	skipWithoutUring(t)
	refuseRegister(t, uringRegisterBuffers, unix.ENOMEM)
	var out lockedLog
	e, err := New(Options{Backend: BackendUring, BlockSizeBytes: 64 << 10, QueueDepth: 4, IntraOpParallelism: 2,
		Logger: slogTo(&out), Faults: &shortFaults{}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	mem := alignedBuf(t, 4<<20)
	err = e.RegisterMemory(mem[:2<<20])
	if err == nil || !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK") || !strings.Contains(err.Error(), "CAP_IPC_LOCK") {
		t.Fatalf("RegisterMemory with the kernel refusing: %v; want ENOMEM and what to do about it", err)
	}
	if err := e.RegisterMemory(mem[2<<20:]); err == nil {
		t.Fatal("second RegisterMemory succeeded with the kernel refusing")
	}
	if n := strings.Count(out.String(), "could not register the pinned memory"); n != 1 {
		t.Fatalf("the fallback was logged %d times, want once:\n%s", n, out.String())
	}
	fixedRoundTrip(t, e, filepath.Join(t.TempDir(), "a"), mem[:1<<20])
	fixedRoundTrip(t, e, filepath.Join(t.TempDir(), "b"), mem[3<<20:])
	st := e.Stats()
	if st.FixedBufferPieces != 0 || st.RegisteredBytes != 0 {
		t.Fatalf("with registration refused: %d registered-buffer pieces, %d bytes registered; want 0", st.FixedBufferPieces, st.RegisteredBytes)
	}
	if st.ShortTransfers == 0 || st.Retries == 0 {
		t.Fatalf("the faults did not fire: %+v", st)
	}
	// The memory stays in the engine's set, so it can be unregistered.
	if err := errors.Join(e.UnregisterMemory(mem[:2<<20]), e.UnregisterMemory(mem[2<<20:])); err != nil {
		t.Fatalf("UnregisterMemory after a refused registration: %v", err)
	}
}

// TestFixedFileTableRefused: a kernel that refuses the sparse file table
// leaves every file used by its descriptor, logged once, all correct.
func TestFixedFileTableRefused(t *testing.T) {
	skipWithoutUring(t)
	refuseRegister(t, uringRegisterFiles, unix.EINVAL)
	var out lockedLog
	e, err := New(Options{Backend: BackendUring, BlockSizeBytes: 64 << 10, QueueDepth: 4, IntraOpParallelism: 2,
		Logger: slogTo(&out), Faults: &shortFaults{}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	mem := alignedBuf(t, 1<<20)
	if err := e.RegisterMemory(mem); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		fixedRoundTrip(t, e, filepath.Join(t.TempDir(), fmt.Sprint(i)), mem)
	}
	st := e.Stats()
	if st.FixedFilePieces != 0 || st.FixedBufferPieces == 0 {
		t.Fatalf("fixed-file pieces %d (want 0), registered-buffer pieces %d (want some)", st.FixedFilePieces, st.FixedBufferPieces)
	}
	if n := strings.Count(out.String(), "could not get an io_uring fixed-file slot"); n != 1 {
		t.Fatalf("the fallback was logged %d times, want once:\n%s", n, out.String())
	}
}

// TestFixedFileTableFull: files beyond the table use their descriptors;
// slots freed by closed files are reused.
func TestFixedFileTableFull(t *testing.T) {
	skipWithoutUring(t)
	old := uringFileTableSize
	uringFileTableSize = 3
	t.Cleanup(func() { uringFileTableSize = old })
	var out lockedLog
	e, err := New(Options{Backend: BackendUring, BlockSizeBytes: 64 << 10, QueueDepth: 4, Logger: slogTo(&out)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	dir := t.TempDir()
	buf := alignedBuf(t, 64<<10)
	var files []*File
	for i := range 5 {
		f, err := e.Open(filepath.Join(dir, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		for j := range buf {
			buf[j] = byte(i + j)
		}
		if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := e.Stats(); st.FixedFilePieces != 3 || st.Pieces != 5 {
		t.Fatalf("%d of %d pieces used a fixed file; want the 3 the table holds", st.FixedFilePieces, st.Pieces)
	}
	if !strings.Contains(out.String(), "slots are all in use") {
		t.Fatalf("a full table was not logged:\n%s", out.String())
	}
	// Free two slots; the next new files take them.
	files[0].Close()
	files[1].Close()
	for i := 5; i < 7; i++ {
		f, err := e.Open(filepath.Join(dir, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := e.Stats(); st.FixedFilePieces != 5 {
		t.Fatalf("%d pieces used a fixed file after two slots were freed; want 5", st.FixedFilePieces)
	}
	for i, f := range files {
		if i >= 2 {
			f.Close()
		}
		want := make([]byte, len(buf))
		for j := range want {
			want[j] = byte(min(i, 4) + j)
		}
		got, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		if i < 5 && !bytes.Equal(got, want) {
			t.Fatalf("file %d holds the wrong bytes", i)
		}
	}
}
