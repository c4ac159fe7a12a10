package aio_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/internal/test/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// alignedBuf returns page-aligned memory outside the Go heap.
func alignedBuf(t testing.TB, n int) []byte {
	t.Helper()
	size := (n + 4095) &^ 4095
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap %d: %v", size, err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b[:n]
}

// backends returns the backends that work here; every backend the machine
// supports is tested (uring and libaio are enabled on the CI machine). A
// backend listed in ZINF_REQUIRE_BACKENDS that is unavailable fails the
// test instead of dropping out of the matrix.
func backends(t testing.TB) []string {
	return testenv.Backends(t, aio.Backends, aio.Available)
}

func newEngine(t testing.TB, o aio.Options) aio.Engine {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	e, err := aio.New(o)
	if err != nil {
		t.Fatalf("aio.New(%+v): %v", o, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func testSeed(t *testing.T) uint64 {
	if s := os.Getenv("ZINF_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ZINF_TEST_SEED=%q: %v", s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// TestDifferential runs random request mixes through every backend, with
// O_DIRECT on and off and several parallelism/queue-depth/block-size
// settings, against an in-memory model of the file, then checks the file
// with plain pread. Reproduce a failure with ZINF_TEST_SEED=<seed>.
func TestDifferential(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (rerun with ZINF_TEST_SEED=%d)", seed, seed)
	const fileSize = 48 << 20
	type shape struct{ par, qd, bs int }
	shapes := []shape{{1, 1, 4096}, {1, 32, 1 << 20}, {3, 4, 64 << 10}, {4, 8, 256 << 10}}
	if testing.Short() {
		shapes = shapes[1:3]
	}
	for _, backend := range backends(t) {
		for _, direct := range []aio.DirectPolicy{aio.DirectRequired, aio.DirectOff} {
			for _, sh := range shapes {
				name := fmt.Sprintf("%s/direct=%s/par=%d/qd=%d/bs=%d", backend, direct, sh.par, sh.qd, sh.bs)
				t.Run(name, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, uint64(len(name))))
					defer func() {
						if t.Failed() {
							t.Logf("seed %d (rerun with ZINF_TEST_SEED=%d)", seed, seed)
						}
					}()
					e := newEngine(t, aio.Options{Backend: backend, BlockSizeBytes: sh.bs, QueueDepth: sh.qd, IntraOpParallelism: sh.par, Direct: direct})
					path := filepath.Join(t.TempDir(), "data")
					f, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					if direct == aio.DirectRequired && !f.Direct() {
						t.Fatalf("file not opened O_DIRECT under policy required")
					}
					if err := f.Truncate(fileSize); err != nil {
						t.Fatal(err)
					}
					model := make([]byte, fileSize)
					align := f.Alignment()
					buf := alignedBuf(t, fileSize)
					// Random source bytes, made once: filling byte by byte per
					// op would dominate the run under the race detector.
					noise := make([]byte, 2*fileSize)
					for j := 0; j+8 <= len(noise); j += 8 {
						binary.LittleEndian.PutUint64(noise[j:], rng.Uint64())
					}
					for i := 0; i < 40; i++ {
						// Sizes from 1 byte to tens of MiB, log-uniform.
						size := int(1 << rng.IntN(26))
						size += rng.IntN(size)
						size = min(size, 32<<20)
						off := rng.Int64N(fileSize - int64(size) + 1)
						if f.Direct() {
							if rng.IntN(6) == 0 {
								// Misaligned on purpose: must be refused, nothing written.
								if size%align == 0 {
									size++
								}
								req := &aio.Request{Op: aio.OpWrite, File: f, Offset: off, Buf: buf[:size]}
								if err := e.Submit(req); !errors.Is(err, aio.ErrAlignment) {
									t.Fatalf("misaligned O_DIRECT write (off %d, size %d): want ErrAlignment, got %v", off, size, err)
								}
								continue
							}
							size = max(size/align, 1) * align
							off = off / int64(align) * int64(align)
							if off+int64(size) > fileSize {
								off = fileSize - int64(size)
							}
						}
						b := buf[:size]
						if rng.IntN(2) == 0 {
							copy(b, noise[rng.IntN(fileSize):])
							n, err := e.WriteAt(context.Background(), f, b, off)
							if err != nil || n != size {
								t.Fatalf("write off %d size %d: n=%d err=%v", off, size, n, err)
							}
							copy(model[off:], b)
						} else {
							n, err := e.ReadAt(context.Background(), f, b, off)
							if err != nil || n != size {
								t.Fatalf("read off %d size %d: n=%d err=%v", off, size, n, err)
							}
							if !bytes.Equal(b, model[off:off+int64(size)]) {
								t.Fatalf("read off %d size %d: bytes differ from the reference (first at %d)", off, size, firstDiff(b, model[off:]))
							}
						}
					}
					got, err := os.ReadFile(path)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, model) {
						t.Fatalf("file differs from the reference at byte %d", firstDiff(got, model))
					}
				})
			}
		}
	}
}

// TestManyInFlight submits many requests at once (more than the queue
// depth) from several goroutines and checks every byte.
func TestManyInFlight(t *testing.T) {
	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) {
			e := newEngine(t, aio.Options{Backend: backend, BlockSizeBytes: 64 << 10, QueueDepth: 4, IntraOpParallelism: 2, Direct: aio.DirectRequired})
			f, err := e.Open(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const n, size = 64, 192 << 10
			src := alignedBuf(t, n*size)
			for i := range src {
				src[i] = byte(i*7 + i>>12)
			}
			reqs := make([]aio.Request, n)
			for i := range reqs {
				reqs[i] = aio.Request{Op: aio.OpWrite, File: f, Offset: int64(i * size), Buf: src[i*size : (i+1)*size]}
				if err := e.Submit(&reqs[i]); err != nil {
					t.Fatal(err)
				}
			}
			for i := range reqs {
				if m, err := reqs[i].Wait(); err != nil || m != size {
					t.Fatalf("write %d: %d, %v", i, m, err)
				}
			}
			dst := alignedBuf(t, n*size)
			for i := range reqs {
				reqs[i] = aio.Request{Op: aio.OpRead, File: f, Offset: int64(i * size), Buf: dst[i*size : (i+1)*size]}
				if err := e.Submit(&reqs[i]); err != nil {
					t.Fatal(err)
				}
			}
			for i := range reqs {
				if m, err := reqs[i].Wait(); err != nil || m != size {
					t.Fatalf("read %d: %d, %v", i, m, err)
				}
			}
			if !bytes.Equal(src, dst) {
				t.Fatalf("bytes differ at %d", firstDiff(src, dst))
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestFaults checks each injected fault's outcome on every backend.
func TestFaults(t *testing.T) {
	const size = 1 << 20
	for _, backend := range backends(t) {
		for _, direct := range []aio.DirectPolicy{aio.DirectRequired, aio.DirectOff} {
			t.Run(fmt.Sprintf("%s/direct=%s", backend, direct), func(t *testing.T) {
				setup := func(t *testing.T, rules ...faults.Rule) (aio.Engine, *aio.File, *faults.Injector, []byte) {
					inj := faults.New(1, rules...)
					e := newEngine(t, aio.Options{Backend: backend, BlockSizeBytes: 128 << 10, QueueDepth: 4, IntraOpParallelism: 2, Direct: direct, Faults: inj})
					f, err := e.Open(filepath.Join(t.TempDir(), "swap.bin"), os.O_RDWR|os.O_CREATE, 0o644)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { f.Close() })
					buf := alignedBuf(t, size)
					for i := range buf {
						buf[i] = byte(i ^ i>>8)
					}
					// The source buffer is registered (io_uring moves it with
					// WRITE_FIXED); the buffers read into are not: both paths
					// meet every fault.
					if err := e.RegisterMemory(buf); err != nil && backend == aio.BackendUring {
						t.Fatalf("RegisterMemory: %v", err)
					}
					return e, f, inj, buf
				}
				t.Run("ENOSPC", func(t *testing.T) {
					e, f, inj, buf := setup(t, faults.Rule{Kind: faults.Writes, Nth: 3, Err: syscall.ENOSPC})
					before := bytes.Clone(buf)
					_, err := e.WriteAt(context.Background(), f, buf, 0)
					if !errors.Is(err, aio.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
						t.Fatalf("want ErrNoSpace, got %v", err)
					}
					var oe *aio.OpError
					if !errors.As(err, &oe) || oe.Op != "write" || oe.Path != f.Path() || oe.Bytes != size || oe.Done >= size {
						t.Fatalf("OpError fields wrong: %#v", oe)
					}
					if !bytes.Equal(before, buf) {
						t.Fatal("source buffer changed by a failed write")
					}
					if inj.Hits() != 1 {
						t.Fatalf("rule fired %d times", inj.Hits())
					}
					// Space returns: the same write now succeeds and reads back.
					inj.Clear()
					if n, err := e.WriteAt(context.Background(), f, buf, 0); err != nil || n != size {
						t.Fatalf("rewrite after space returned: %d %v", n, err)
					}
					got := alignedBuf(t, size)
					if _, err := e.ReadAt(context.Background(), f, got, 0); err != nil || !bytes.Equal(got, buf) {
						t.Fatalf("read back after recovery: %v equal=%v", err, bytes.Equal(got, buf))
					}
				})
				t.Run("EIO", func(t *testing.T) {
					e, f, _, buf := setup(t, faults.Rule{Kind: faults.Reads, Nth: 2, Err: syscall.EIO})
					if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
						t.Fatal(err)
					}
					_, err := e.ReadAt(context.Background(), f, alignedBuf(t, size), 0)
					if !errors.Is(err, aio.ErrIO) || !errors.Is(err, syscall.EIO) {
						t.Fatalf("want ErrIO, got %v", err)
					}
					if want := "aio read"; !bytes.Contains([]byte(err.Error()), []byte(want)) || !bytes.Contains([]byte(err.Error()), []byte(f.Path())) {
						t.Fatalf("error %q does not name the op and path", err)
					}
				})
				for _, errno := range []syscall.Errno{syscall.EINTR, syscall.EAGAIN} {
					t.Run(errno.Error(), func(t *testing.T) {
						e, f, inj, buf := setup(t, faults.Rule{Probability: 0.3, Err: errno})
						if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
							t.Fatalf("write with %v injected: %v", errno, err)
						}
						got := alignedBuf(t, size)
						if _, err := e.ReadAt(context.Background(), f, got, 0); err != nil || !bytes.Equal(got, buf) {
							t.Fatalf("read with %v injected: %v equal=%v", errno, err, bytes.Equal(got, buf))
						}
						if st := e.Stats(); st.Retries == 0 || inj.Hits() == 0 || st.Retries != int64(inj.Hits()) {
							t.Fatalf("retries %d, injected %d", st.Retries, inj.Hits())
						}
					})
				}
				t.Run("short", func(t *testing.T) {
					e, f, inj, buf := setup(t, faults.Rule{Probability: 0.5, Fraction: 0.37})
					if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
						t.Fatal(err)
					}
					got := alignedBuf(t, size)
					if n, err := e.ReadAt(context.Background(), f, got, 0); err != nil || n != size || !bytes.Equal(got, buf) {
						t.Fatalf("short-transfer read: n=%d err=%v equal=%v", n, err, bytes.Equal(got, buf))
					}
					if st := e.Stats(); st.ShortTransfers == 0 || inj.Hits() == 0 {
						t.Fatalf("no short transfers happened: %+v", st)
					}
					// Reads into the registered buffer, shortened too.
					clear(buf)
					if n, err := e.ReadAt(context.Background(), f, buf, 0); err != nil || n != size || !bytes.Equal(got, buf) {
						t.Fatalf("short-transfer read into registered memory: n=%d err=%v equal=%v", n, err, bytes.Equal(got, buf))
					}
					if st := e.Stats(); backend == aio.BackendUring && st.FixedBufferPieces == 0 {
						t.Fatalf("io_uring moved no piece with the registered buffer: %+v", st)
					}
				})
				t.Run("EOF", func(t *testing.T) {
					e, f, _, buf := setup(t)
					// Reading past the end of an empty file is a short
					// transfer error, not a silent zero fill.
					_, err := e.ReadAt(context.Background(), f, buf, 0)
					if !errors.Is(err, aio.ErrShortTransfer) {
						t.Fatalf("read past EOF: want ErrShortTransfer, got %v", err)
					}
				})
			})
		}
	}
}

// TestBadRequests checks requests rejected before any I/O.
func TestBadRequests(t *testing.T) {
	e := newEngine(t, aio.Options{Backend: aio.BackendPosix, Direct: aio.DirectRequired})
	f, err := e.Open(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(t, 8192)
	cases := map[string]*aio.Request{
		"nil file":        {Op: aio.OpWrite, Buf: buf},
		"empty buffer":    {Op: aio.OpWrite, File: f},
		"negative offset": {Op: aio.OpWrite, File: f, Buf: buf[:4096], Offset: -4096},
		"unknown op":      {Op: 9, File: f, Buf: buf[:4096]},
		"misaligned":      {Op: aio.OpWrite, File: f, Buf: buf[:100]},
		"misaligned addr": {Op: aio.OpWrite, File: f, Buf: buf[1 : 4096+1]},
	}
	for name, r := range cases {
		if err := e.Submit(r); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !errors.As(err, new(*aio.OpError)) {
			t.Errorf("%s: error %v is not an *OpError", name, err)
		}
	}
	if sz, _ := f.Size(); sz != 0 {
		t.Fatalf("file grew to %d bytes after rejected requests", sz)
	}
	f.Close()
	if err := e.Submit(&aio.Request{Op: aio.OpWrite, File: f, Buf: buf[:4096]}); !errors.Is(err, aio.ErrClosed) {
		t.Fatalf("submit on closed file: %v", err)
	}
	e.Close()
	g, _ := aio.OpenFile(filepath.Join(t.TempDir(), "g"), os.O_RDWR|os.O_CREATE, 0o644, aio.DirectOff, quiet)
	defer g.Close()
	if err := e.Submit(&aio.Request{Op: aio.OpWrite, File: g, Buf: buf[:4096]}); !errors.Is(err, aio.ErrClosed) {
		t.Fatalf("submit on closed engine: %v", err)
	}
	for _, o := range []aio.Options{{Backend: "spdk"}, {QueueDepth: -1}, {BlockSizeBytes: 1000}, {IntraOpParallelism: 1000}} {
		if _, err := aio.New(o); err == nil {
			t.Errorf("aio.New(%+v) accepted", o)
		}
	}
}

// TestNoLeaks opens and closes engines of every backend, with files and
// I/O, and checks that no goroutine or file descriptor is left behind.
func TestNoLeaks(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	dir := t.TempDir()
	buf := alignedBuf(t, 1<<20)
	runtime.GC()
	g0, fd0 := runtime.NumGoroutine(), fds()
	for round := 0; round < 3; round++ {
		for _, backend := range backends(t) {
			inj := faults.New(7, faults.Rule{Kind: faults.Writes, Nth: 2, Err: syscall.EIO})
			e, err := aio.New(aio.Options{Backend: backend, IntraOpParallelism: 3, QueueDepth: 16, BlockSizeBytes: 64 << 10, Faults: inj, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			f, err := e.Open(filepath.Join(dir, backend), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.WriteAt(context.Background(), f, buf, 0); !errors.Is(err, aio.ErrIO) {
				t.Fatalf("%s: injected EIO not reported: %v", backend, err)
			}
			if _, err := e.WriteAt(context.Background(), f, buf, 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > g0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g, fd := runtime.NumGoroutine(), fds(); g > g0 || fd > fd0 {
		buf := make([]byte, 1<<16)
		t.Fatalf("leak: goroutines %d -> %d, fds %d -> %d\n%s", g0, g, fd0, fd, buf[:runtime.Stack(buf, true)])
	}
}

// TestHandle exercises the DeepNVMe-shaped API.
func TestHandle(t *testing.T) {
	h, err := aio.NewHandle(aio.Options{BlockSizeBytes: 64 << 10, QueueDepth: 8, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	path := filepath.Join(t.TempDir(), "h")
	const n, size = 10, 256 << 10
	src := alignedBuf(t, n*size)
	for i := range src {
		src[i] = byte(i * 31)
	}
	for i := 0; i < n; i++ {
		if err := h.AsyncPwrite(src[i*size:(i+1)*size], path, int64(i*size)); err != nil {
			t.Fatal(err)
		}
	}
	if done, err := h.Wait(); err != nil || done != n {
		t.Fatalf("Wait: %d %v", done, err)
	}
	dst := alignedBuf(t, n*size)
	if got, err := h.SyncPread(dst, path, 0); err != nil || got != n*size {
		t.Fatalf("SyncPread: %d %v", got, err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("handle round trip differs")
	}
	if h.BlockSize() != 64<<10 || h.QueueDepth() != 8 || !h.OverlapEvents() {
		t.Fatal("handle getters wrong")
	}
}
