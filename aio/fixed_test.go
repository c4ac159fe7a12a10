package aio_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/testenv"
)

// logTo is a logger and its sink, safe for the engine's goroutines.
func logTo() (*slog.Logger, *testenv.SyncBuffer) {
	var b testenv.SyncBuffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

// TestRegisteredMemory registers memory the way buffers.Pool.Register
// does and moves random requests through it on every backend: on io_uring
// the pieces inside the registered regions use READ_FIXED/WRITE_FIXED and
// every piece a fixed-file slot; a piece straddling two regions, and
// memory that was never registered, go the ordinary way; libaio and posix
// say once that they have no registered buffers and work as before. The
// file is checked with plain pread against a model after every wave, and
// again after UnregisterMemory.
func TestRegisteredMemory(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (rerun with ZINF_TEST_SEED=%d)", seed, seed)
	const (
		region   = 1 << 20
		fileSize = 4 << 20
	)
	for _, backend := range backends(t) {
		for _, direct := range []aio.DirectPolicy{aio.DirectRequired, aio.DirectOff} {
			t.Run(fmt.Sprintf("%s/direct=%s", backend, direct), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 11))
				log, out := logTo()
				e := newEngine(t, aio.Options{Backend: backend, BlockSizeBytes: 256 << 10, QueueDepth: 8, IntraOpParallelism: 2,
					Direct: direct, Logger: log})
				// Two adjacent regions of one mapping, registered separately,
				// and a third mapping never registered.
				arena := alignedBuf(t, 2*region)
				a, b := arena[:region:region], arena[region:]
				plain := alignedBuf(t, region)
				regErr := errors.Join(e.RegisterMemory(a), e.RegisterMemory(b))
				uring := backend == aio.BackendUring
				switch {
				case uring && regErr != nil:
					t.Fatalf("io_uring refused to register %d bytes: %v", 2*region, regErr)
				case !uring && !errors.Is(regErr, errors.ErrUnsupported):
					t.Fatalf("%s: RegisterMemory = %v, want an error matching errors.ErrUnsupported", backend, regErr)
				}
				if err := e.RegisterMemory(arena[region/2 : region+4096]); err == nil || !strings.Contains(err.Error(), "overlap") {
					t.Fatalf("registering overlapping memory: %v, want an overlap error", err)
				}
				if st := e.Stats(); uring && st.RegisteredBytes != 2*region || !uring && st.RegisteredBytes != 0 {
					t.Fatalf("RegisteredBytes = %d", st.RegisteredBytes)
				}

				path := filepath.Join(t.TempDir(), "data")
				f, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				model := make([]byte, fileSize)
				if _, err := e.WriteAt(context.Background(), f, alignedZero(t, fileSize), 0); err != nil {
					t.Fatal(err)
				}
				align := f.Alignment()
				wave := func(mems ...[]byte) {
					t.Helper()
					var reqs []*aio.Request
					var want [][]byte
					for _, mem := range mems {
						// Non-overlapping, aligned requests carved from mem.
						for lo := 0; lo < len(mem); {
							n := (1 + rng.IntN(len(mem)/4/align)) * align
							if lo+n > len(mem) {
								break
							}
							off := int64(rng.IntN((fileSize-n)/align)) * int64(align)
							buf := mem[lo : lo+n]
							r := &aio.Request{File: f, Offset: off, Buf: buf}
							if rng.IntN(2) == 0 {
								r.Op = aio.OpWrite
								for i := range buf {
									buf[i] = byte(rng.Uint32())
								}
							}
							reqs = append(reqs, r)
							lo += n
						}
					}
					// Writes first (they may overlap in the file: submit them
					// one by one), then every read at once.
					for _, r := range reqs {
						if r.Op == aio.OpWrite {
							if err := e.Submit(r); err != nil {
								t.Fatal(err)
							}
							if _, err := r.Wait(); err != nil {
								t.Fatal(err)
							}
							copy(model[r.Offset:], r.Buf)
						}
					}
					for _, r := range reqs {
						if r.Op == aio.OpRead {
							want = append(want, model[r.Offset:r.Offset+int64(len(r.Buf))])
							if err := e.Submit(r); err != nil {
								t.Fatal(err)
							}
						}
					}
					i := 0
					for _, r := range reqs {
						if r.Op == aio.OpRead {
							if n, err := r.Wait(); err != nil || n != int64(len(r.Buf)) {
								t.Fatalf("read %d bytes at %d: %d, %v", len(r.Buf), r.Offset, n, err)
							}
							if d := differAt(r.Buf, want[i]); d >= 0 {
								t.Fatalf("read of %d bytes at %d differs at byte %d", len(r.Buf), r.Offset, d)
							}
							i++
						}
					}
					got := make([]byte, fileSize)
					if _, err := unix.Pread(fdOf(t, path), got, 0); err != nil {
						t.Fatal(err)
					}
					if d := differAt(got, model); d >= 0 {
						t.Fatalf("file differs from the model at byte %d", d)
					}
				}
				for range 2 {
					wave(a, b, plain)
				}
				// A request across the boundary of the two regions: split in
				// two slices of 256 KiB, the first lies in both regions, so it
				// cannot be a registered buffer.
				cross := arena[region-128<<10 : region+384<<10]
				for i := range cross {
					cross[i] = byte(i * 13)
				}
				if _, err := e.WriteAt(context.Background(), f, cross, 0); err != nil {
					t.Fatal(err)
				}
				copy(model, cross)
				wave(cross)

				st := e.Stats()
				if uring {
					if st.FixedBufferPieces == 0 || st.FixedBufferPieces >= st.Pieces {
						t.Errorf("%d of %d pieces used registered buffers; want some, not all (the plain mapping and the straddling piece are not registered)", st.FixedBufferPieces, st.Pieces)
					}
					if st.FixedFilePieces != st.Pieces {
						t.Errorf("%d of %d pieces named a fixed file; want all", st.FixedFilePieces, st.Pieces)
					}
				} else if st.FixedBufferPieces != 0 || st.FixedFilePieces != 0 {
					t.Errorf("%s: fixed pieces %d / %d, want none", backend, st.FixedBufferPieces, st.FixedFilePieces)
				}
				if !uring {
					if n := strings.Count(out.String(), "has no registered buffers"); n != 1 {
						t.Errorf("%s: the fallback was logged %d times, want once:\n%s", backend, n, out)
					}
				} else if strings.Contains(out.String(), "level=WARN") {
					t.Errorf("warnings with registration working:\n%s", out)
				}

				// After UnregisterMemory nothing uses the registration.
				if err := errors.Join(e.UnregisterMemory(a), e.UnregisterMemory(b)); err != nil {
					t.Fatalf("UnregisterMemory: %v", err)
				}
				if err := e.UnregisterMemory(a); err == nil {
					t.Fatal("unregistering memory twice succeeded")
				}
				before := e.Stats().FixedBufferPieces
				wave(a, b)
				if st := e.Stats(); st.FixedBufferPieces != before || st.RegisteredBytes != 0 {
					t.Fatalf("after UnregisterMemory: fixed-buffer pieces %d -> %d, RegisteredBytes %d", before, st.FixedBufferPieces, st.RegisteredBytes)
				}
			})
		}
	}
}

// alignedZero is n zero bytes of aligned memory.
func alignedZero(t *testing.T, n int) []byte { return alignedBuf(t, n) }

// fdOf opens path for a plain pread and closes it at the end of the test.
func fdOf(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestFixedFilesFollowTheirFile checks that a file's fixed-file slot never
// outlives it: after Close, a new file given the same descriptor number
// gets its own bytes and the closed file keeps its own, on every backend,
// for many open/close cycles (more than a ring's table holds at once, so
// slots are reused).
func TestFixedFilesFollowTheirFile(t *testing.T) {
	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) {
			e := newEngine(t, aio.Options{Backend: backend, BlockSizeBytes: 64 << 10, QueueDepth: 4, IntraOpParallelism: 2})
			buf := alignedBuf(t, 128<<10)
			if err := e.RegisterMemory(buf); err != nil && backend == aio.BackendUring {
				t.Fatal(err)
			}
			dir := t.TempDir()
			fill := func(i int) {
				for j := range buf {
					buf[j] = byte(i*31 + j*7)
				}
			}
			const cycles = 1100
			sameFd := 0
			lastFd := -1
			for i := range cycles {
				f, err := e.Open(filepath.Join(dir, fmt.Sprint("f", i%7)), os.O_RDWR|os.O_CREATE, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				if f.Fd() == lastFd {
					sameFd++
				}
				lastFd = f.Fd()
				fill(i)
				if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
					t.Fatalf("cycle %d: %v", i, err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if sameFd == 0 {
				t.Log("the descriptor number was never reused; the test still checks every file's bytes")
			}
			// Every one of the seven files holds what its last writer wrote.
			for k := range 7 {
				last := k
				for i := k; i < cycles; i += 7 {
					last = i
				}
				fill(last)
				got, err := os.ReadFile(filepath.Join(dir, fmt.Sprint("f", k)))
				if err != nil {
					t.Fatal(err)
				}
				if d := differAt(got, buf); d >= 0 {
					t.Fatalf("file f%d differs at byte %d from its last write (cycle %d)", k, d, last)
				}
			}
			st := e.Stats()
			if want := int64(0); backend != aio.BackendUring && st.FixedFilePieces != want {
				t.Errorf("%s: %d fixed-file pieces, want 0", backend, st.FixedFilePieces)
			}
			if backend == aio.BackendUring && st.FixedFilePieces != st.Pieces {
				t.Errorf("%d of %d pieces used a fixed file, want all (slots of closed files must be freed for reuse)", st.FixedFilePieces, st.Pieces)
			}
		})
	}
}

// differAt returns the first index at which a and b differ (the shorter
// length when one is a prefix of the other), or -1 when they are equal.
func differAt(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	return firstDiff(a, b)
}

// hugeBuf returns n bytes of anonymous memory starting on a 2 MiB
// boundary, advised for transparent huge pages and touched (as
// buffers.Pool maps its arena), unmapped at the end of the test.
func hugeBuf(t testing.TB, n int) []byte {
	t.Helper()
	const hp = 2 << 20
	raw, err := unix.Mmap(-1, 0, n+hp, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap %d: %v", n+hp, err)
	}
	t.Cleanup(func() { unix.Munmap(raw) })
	off := (hp - int(uintptr(unsafe.Pointer(&raw[0]))%hp)) % hp
	b := raw[off : off+n : off+n]
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	return b
}
