package aio

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/test/testenv"
)

// These tests drive the uring ring directly, without the engine core. Each
// test that owns a ring holds runtime.LockOSThread, as the core's worker
// does (uringNeedsLockedThread).

// skipWithoutUring skips the test where io_uring cannot run, or fails it
// when ZINF_REQUIRE_BACKENDS lists uring.
func skipWithoutUring(t testing.TB) {
	t.Helper()
	testenv.SkipUnavailable(t, BackendUring, uringAvailable())
}

// newTestUring opens a ring with the default setup tiers and closes it at
// the end of the test. The caller must hold LockOSThread.
func newTestUring(t testing.TB, entries int) *uringRing {
	t.Helper()
	skipWithoutUring(t)
	r, err := newUringRing(entries)
	if err != nil {
		t.Fatalf("newUringRing(%d): %v", entries, err)
	}
	t.Cleanup(func() {
		if err := r.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r.(*uringRing)
}

// alignedBuf returns size bytes of page-aligned anonymous memory, outside
// the Go heap, unmapped at the end of the test.
func alignedBuf(t testing.TB, size int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", size, err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// openTestFile opens path with flags through unix.Open and closes it at the
// end of the test.
func openTestFile(t testing.TB, path string, flags int) int {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

type uringTestOp struct {
	op  Op
	fd  int
	buf []byte
	off int64
}

// driveUring runs ops through r keeping up to depth of them in flight, and
// returns each op's result and the most operations ever in flight at once.
func driveUring(t testing.TB, r *uringRing, ops []uringTestOp, depth int) (res []int32, maxInFlight int) {
	t.Helper()
	depth = min(depth, r.capacity())
	res = make([]int32, len(ops))
	free := make([]uint32, 0, depth)
	for tok := depth - 1; tok >= 0; tok-- {
		free = append(free, uint32(tok))
	}
	owner := make([]int, r.capacity())
	comps := make([]completion, r.capacity())
	next, done := 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for done < len(ops) {
		for next < len(ops) && len(free) > 0 {
			tok := free[len(free)-1]
			free = free[:len(free)-1]
			o := ops[next]
			owner[tok] = next
			r.prep(o.op, fdTarget(o.fd), o.buf, o.off, tok)
			next++
		}
		maxInFlight = max(maxInFlight, depth-len(free))
		if err := r.submit(); err != nil {
			t.Fatalf("submit: %v", err)
		}
		n, err := r.wait(1, comps)
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
		for _, c := range comps[:n] {
			res[owner[c.token]] = c.res
			free = append(free, c.token)
			done++
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d operations still outstanding after 30s", len(ops)-done, len(ops))
		}
	}
	return res, maxInFlight
}

// fillPattern writes a pattern that differs per byte and per seed.
func fillPattern(b []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func TestUringAvailable(t *testing.T) {
	err := uringAvailable()
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("uringAvailable error does not wrap ErrUnavailable: %v", err)
		}
		testenv.SkipUnavailable(t, BackendUring, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 8)
	t.Logf("setup flags %#x, features %#x, SQ %d, CQ %d", r.setupFlags, r.features, r.sqEntries, len(r.cqes))
}

func TestUringDirectIO(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 16)
	const block = 4096
	path := filepath.Join(t.TempDir(), "direct")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("O_DIRECT not supported on %s", filepath.Dir(path))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)

	// Pieces of 1, 2 and 4 blocks at shuffled, aligned offsets.
	const blocks = 96
	src := alignedBuf(t, blocks*block)
	dst := alignedBuf(t, blocks*block)
	fillPattern(src, 1)
	var writes, reads []uringTestOp
	for b := 0; b < blocks; {
		n := 1 << (b % 3)
		n = min(n, blocks-b)
		lo, hi := b*block, (b+n)*block
		writes = append(writes, uringTestOp{OpWrite, fd, src[lo:hi], int64(lo)})
		reads = append(reads, uringTestOp{OpRead, fd, dst[lo:hi], int64(lo)})
		b += n
	}
	rng := rand.New(rand.NewPCG(7, 7))
	rng.Shuffle(len(writes), func(i, j int) { writes[i], writes[j] = writes[j], writes[i] })
	rng.Shuffle(len(reads), func(i, j int) { reads[i], reads[j] = reads[j], reads[i] })

	for _, pass := range []struct {
		name string
		ops  []uringTestOp
	}{{"write", writes}, {"read", reads}} {
		res, inFlight := driveUring(t, r, pass.ops, 16)
		if inFlight < 2 {
			t.Errorf("%s: at most %d operation in flight, want several", pass.name, inFlight)
		}
		for i, o := range pass.ops {
			if int(res[i]) != len(o.buf) {
				t.Fatalf("%s at %d: res %d, want %d", pass.name, o.off, res[i], len(o.buf))
			}
		}
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data read back through the ring differs from what was written")
	}
	// Cross-check against plain pread.
	check := alignedBuf(t, blocks*block)
	if n, err := unix.Pread(fd, check, 0); err != nil || n != len(check) || !bytes.Equal(check, src) {
		t.Fatalf("pread of the file: n=%d err=%v equal=%v", n, err, bytes.Equal(check, src))
	}
}

// TestUringBuffered writes a random partition of a region in random order,
// then reads random (overlapping) ranges back, comparing with a reference
// built in memory and with pread. Buffers are Go heap memory, offsets and
// lengths unaligned.
func TestUringBuffered(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 8)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 99))
	fd := openTestFile(t, filepath.Join(t.TempDir(), "buffered"), unix.O_RDWR|unix.O_CREAT)

	const size = 1 << 20
	want := make([]byte, size)
	fillPattern(want, seed)
	var writes []uringTestOp
	for off := 0; off < size; {
		n := min(1+rng.IntN(20000), size-off)
		buf := append([]byte(nil), want[off:off+n]...)
		writes = append(writes, uringTestOp{OpWrite, fd, buf, int64(off)})
		off += n
	}
	rng.Shuffle(len(writes), func(i, j int) { writes[i], writes[j] = writes[j], writes[i] })
	res, inFlight := driveUring(t, r, writes, 8)
	if inFlight < 2 {
		t.Errorf("at most %d write in flight, want several", inFlight)
	}
	for i, o := range writes {
		if int(res[i]) != len(o.buf) {
			t.Fatalf("write at %d: res %d, want %d", o.off, res[i], len(o.buf))
		}
	}
	got := make([]byte, size)
	if n, err := unix.Pread(fd, got, 0); err != nil || n != size || !bytes.Equal(got, want) {
		t.Fatalf("pread after ring writes: n=%d err=%v equal=%v", n, err, bytes.Equal(got, want))
	}

	var reads []uringTestOp
	for range 200 {
		off := rng.IntN(size)
		n := 1 + rng.IntN(min(size-off, 50000))
		reads = append(reads, uringTestOp{OpRead, fd, make([]byte, n), int64(off)})
	}
	res, _ = driveUring(t, r, reads, 8)
	for i, o := range reads {
		if int(res[i]) != len(o.buf) {
			t.Fatalf("read at %d: res %d, want %d", o.off, res[i], len(o.buf))
		}
		if !bytes.Equal(o.buf, want[o.off:o.off+int64(len(o.buf))]) {
			t.Fatalf("read at %d (%d bytes): data differs", o.off, len(o.buf))
		}
	}
}

// TestUringErrorCompletions checks that failing operations come back as
// negated errnos in their completions, in a batch alongside good ones, and
// that the ring keeps working.
func TestUringErrorCompletions(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 8)
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, bytes.Repeat([]byte("z"), 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	rdonly := openTestFile(t, path, unix.O_RDONLY)
	wronly := openTestFile(t, path, unix.O_WRONLY)
	const unopened = 1<<20 - 1 // an fd number far above any open file
	buf := make([]byte, 4096)
	cases := []struct {
		name string
		op   uringTestOp
		want int32
	}{
		{"read from write-only fd", uringTestOp{OpRead, wronly, make([]byte, 100), 0}, -int32(unix.EBADF)},
		{"good read", uringTestOp{OpRead, rdonly, buf, 0}, 4096},
		{"write to read-only fd", uringTestOp{OpWrite, rdonly, make([]byte, 100), 0}, -int32(unix.EBADF)},
		{"read from an unopened fd", uringTestOp{OpRead, unopened, make([]byte, 100), 0}, -int32(unix.EBADF)},
		{"read from fd -1", uringTestOp{OpRead, -1, make([]byte, 100), 0}, -int32(unix.EBADF)},
		{"read at end of file", uringTestOp{OpRead, rdonly, make([]byte, 100), 8192}, 0},
		{"short read at the tail", uringTestOp{OpRead, rdonly, make([]byte, 100), 8150}, 42},
		{"good write", uringTestOp{OpWrite, wronly, []byte("hello"), 10}, 5},
	}
	direct, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err == nil {
		defer unix.Close(direct)
		aligned := alignedBuf(t, 8192)
		cases = append(cases,
			struct {
				name string
				op   uringTestOp
				want int32
			}{"O_DIRECT misaligned buffer", uringTestOp{OpRead, direct, aligned[1 : 1+4096], 0}, -int32(unix.EINVAL)},
			struct {
				name string
				op   uringTestOp
				want int32
			}{"O_DIRECT aligned", uringTestOp{OpRead, direct, aligned[4096:], 0}, 4096},
		)
	}
	ops := make([]uringTestOp, len(cases))
	for i, c := range cases {
		ops[i] = c.op
	}
	res, _ := driveUring(t, r, ops, 8)
	for i, c := range cases {
		if res[i] != c.want {
			t.Errorf("%s: res %d, want %d", c.name, res[i], c.want)
		}
	}
	// Still usable.
	res, _ = driveUring(t, r, []uringTestOp{{OpRead, rdonly, buf, 0}}, 1)
	if res[0] != 4096 || !bytes.Equal(buf[:10], []byte("zzzzzzzzzz")) {
		t.Fatalf("read after errors: res %d data %q", res[0], buf[:10])
	}
}

func TestUringCapacity(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	skipWithoutUring(t)
	for _, c := range []struct{ entries, want int }{{1, 1}, {2, 2}, {5, 8}, {8, 8}, {100, 128}, {32768, 32768}} {
		r, err := newUringRing(c.entries)
		if err != nil {
			t.Fatalf("newUringRing(%d): %v", c.entries, err)
		}
		if got := r.capacity(); got != c.want {
			t.Errorf("newUringRing(%d).capacity() = %d, want %d", c.entries, got, c.want)
		}
		if ur := r.(*uringRing); len(ur.cqes) < 2*c.want {
			t.Errorf("newUringRing(%d): CQ %d entries, want >= %d", c.entries, len(ur.cqes), 2*c.want)
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []int{0, -1, 32769, 1 << 30} {
		if r, err := newUringRing(bad); err == nil || !errors.Is(err, unix.EINVAL) {
			t.Errorf("newUringRing(%d) = %v, %v; want an EINVAL error", bad, r, err)
			if r != nil {
				r.close()
			}
		}
	}

	// A full ring: capacity operations in flight at once, reaped in one
	// wait; a short out slice leaves the rest for the next call.
	r := newTestUring(t, 8)
	fd := openTestFile(t, filepath.Join(t.TempDir(), "cap"), unix.O_RDWR|unix.O_CREAT)
	if err := unix.Ftruncate(fd, 1<<16); err != nil {
		t.Fatal(err)
	}
	comps := make([]completion, 16)
	if n, err := r.wait(0, comps); n != 0 || err != nil {
		t.Fatalf("idle poll: %d, %v", n, err)
	}
	if n, err := r.wait(4, comps); n != 0 || err != nil {
		t.Fatalf("idle wait(4) must not block: %d, %v", n, err)
	}
	bufs := make([][]byte, r.capacity())
	for round := range 3 {
		for tok := range r.capacity() {
			bufs[tok] = make([]byte, 512)
			r.prep(OpRead, fdTarget(fd), bufs[tok], int64(tok)*512, uint32(tok))
		}
		if err := r.submit(); err != nil {
			t.Fatal(err)
		}
		seen := make([]bool, r.capacity())
		var total int
		if round == 0 {
			n, err := r.wait(r.capacity(), comps)
			if err != nil || n != r.capacity() {
				t.Fatalf("wait(capacity): %d, %v", n, err)
			}
			for _, c := range comps[:n] {
				seen[c.token] = true
			}
			total = n
		} else {
			for total < r.capacity() {
				n, err := r.wait(1, comps[:3])
				if err != nil || n < 1 || n > 3 {
					t.Fatalf("wait(1) into 3 slots: %d, %v", n, err)
				}
				for _, c := range comps[:n] {
					seen[c.token] = true
				}
				total += n
			}
		}
		if total != r.capacity() {
			t.Fatalf("round %d: %d completions, want %d", round, total, r.capacity())
		}
		for tok, ok := range seen {
			if !ok {
				t.Fatalf("round %d: no completion for token %d", round, tok)
			}
		}
		if r.inflight != 0 || r.toSubmit != 0 {
			t.Fatalf("round %d: inflight %d, toSubmit %d after reaping all", round, r.inflight, r.toSubmit)
		}
	}
	// More than is in flight is never waited for.
	r.prep(OpRead, fdTarget(fd), bufs[0], 0, 0)
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	if n, err := r.wait(8, comps); n != 1 || err != nil || comps[0].res != 512 {
		t.Fatalf("wait(8) with one in flight: %d, %v, %+v", n, err, comps[0])
	}
}

// TestUringPollCompletes checks that polling (wait with min 0) alone sees
// device completions; with DEFER_TASKRUN they only become CQEs when the
// kernel is entered, which the ring does when the kernel flags pending work.
func TestUringPollCompletes(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 8)
	path := filepath.Join(t.TempDir(), "poll")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Skipf("O_DIRECT: %v", err)
	}
	defer unix.Close(fd)
	buf := alignedBuf(t, 8*4096)
	fillPattern(buf, 3)
	if _, err := unix.Pwrite(fd, buf, 0); err != nil {
		t.Fatal(err)
	}
	for tok := range 8 {
		r.prep(OpRead, fdTarget(fd), buf[tok*4096:(tok+1)*4096], int64(tok)*4096, uint32(tok))
	}
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	comps := make([]completion, 8)
	got, polls := 0, 0
	deadline := time.Now().Add(10 * time.Second)
	for got < 8 {
		n, err := r.wait(0, comps)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range comps[:n] {
			if c.res != 4096 {
				t.Errorf("token %d: res %d", c.token, c.res)
			}
		}
		got += n
		polls++
		if time.Now().After(deadline) {
			t.Fatalf("polling saw %d of 8 completions in 10s (%d polls)", got, polls)
		}
		runtime.Gosched()
	}
	t.Logf("%d polls", polls)
}

// TestUringSetupTiers runs a round trip on every setup tier this kernel
// accepts, so the fallbacks are exercised too.
func TestUringSetupTiers(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	skipWithoutUring(t)
	fd := openTestFile(t, filepath.Join(t.TempDir(), "tiers"), unix.O_RDWR|unix.O_CREAT)
	for _, flags := range uringSetupTiers {
		r, err := openUring(4, []uint32{flags})
		if errors.Is(err, unix.EINVAL) {
			t.Logf("flags %#x: rejected by this kernel", flags)
			continue
		}
		if err != nil {
			t.Fatalf("flags %#x: %v", flags, err)
		}
		w := []byte("tier " + strings.Repeat("x", int(flags%7)))
		rd := make([]byte, len(w))
		res, _ := driveUring(t, r, []uringTestOp{{OpWrite, fd, w, 100}}, 4)
		res2, _ := driveUring(t, r, []uringTestOp{{OpRead, fd, rd, 100}}, 4)
		if res[0] != int32(len(w)) || res2[0] != int32(len(w)) || !bytes.Equal(rd, w) {
			t.Errorf("flags %#x: write %d, read %d, got %q want %q", flags, res[0], res2[0], rd, w)
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUringWrongThread checks the error a single-issuer ring gives when
// entered from another OS thread.
func TestUringWrongThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 4)
	if r.setupFlags&uringSetupSingleIssuer == 0 {
		t.Skip("this kernel gave no single-issuer ring; any thread may enter it")
	}
	buf := make([]byte, 10)
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // a different thread from the test's
		defer runtime.UnlockOSThread()
		r.prep(OpRead, fdTarget(-1), buf, 0, 0)
		errc <- r.submit()
	}()
	err := <-errc
	if !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), "LockOSThread") {
		t.Fatalf("submit from another thread: %v; want EEXIST naming LockOSThread", err)
	}
	// The failed batch was withdrawn: token 0 is free and the ring works.
	res, _ := driveUring(t, r, []uringTestOp{{OpRead, -1, buf, 0}}, 1)
	if res[0] != -int32(unix.EBADF) {
		t.Fatalf("after the failed submit: res %d, want -EBADF", res[0])
	}
}

// TestUringAbandonBatch exercises what a fatal submit error does: with
// nothing accepted the batch is withdrawn and the error returned; with
// part accepted the rest complete with the errno.
func TestUringAbandonBatch(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 4)
	buf := make([]byte, 8)
	comps := make([]completion, 4)

	r.prep(OpRead, fdTarget(-1), buf, 0, 0)
	r.prep(OpRead, fdTarget(-1), buf, 0, 1)
	if err := r.abandonBatch(false, unix.ENOMEM); !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("abandon with nothing accepted: %v", err)
	}
	if n, err := r.wait(1, comps); n != 0 || err != nil {
		t.Fatalf("wait after withdrawal: %d, %v", n, err)
	}

	r.prep(OpRead, fdTarget(-1), buf, 0, 0)
	r.prep(OpRead, fdTarget(-1), buf, 0, 1)
	if err := r.abandonBatch(true, unix.ENOMEM); err != nil {
		t.Fatalf("abandon with part accepted: %v", err)
	}
	n, err := r.wait(2, comps)
	if n != 2 || err != nil || comps[0].res != -int32(unix.ENOMEM) || comps[1].res != -int32(unix.ENOMEM) {
		t.Fatalf("synthetic completions: %d, %v, %+v", n, err, comps[:n])
	}
	// Tokens are free again.
	res, _ := driveUring(t, r, []uringTestOp{{OpRead, -1, buf, 0}, {OpRead, -1, buf, 0}}, 2)
	if res[0] != -int32(unix.EBADF) || res[1] != -int32(unix.EBADF) {
		t.Fatalf("after synthetic completions: %v", res)
	}
}

func TestUringCloseDrains(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	skipWithoutUring(t)
	r, err := openUring(4, uringSetupTiers)
	if err != nil {
		t.Fatal(err)
	}
	fd := openTestFile(t, filepath.Join(t.TempDir(), "close"), unix.O_RDWR|unix.O_CREAT)
	for tok := range 4 {
		r.prep(OpWrite, fdTarget(fd), make([]byte, 4096), int64(tok)*4096, uint32(tok))
	}
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	if err := r.close(); err != nil {
		t.Fatalf("close with operations in flight: %v", err)
	}
	if err := r.submit(); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
	if _, err := r.wait(0, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
	if err := r.close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestUringExplainSetupErrno(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			if v, ok := m[name]; ok {
				return []byte(v), nil
			}
			return nil, os.ErrNotExist
		}
	}
	for _, c := range []struct {
		errno unix.Errno
		files map[string]string
		want  string
	}{
		{unix.EPERM, map[string]string{"/proc/sys/kernel/io_uring_disabled": "2\n"}, "io_uring_disabled=2"},
		{unix.EPERM, map[string]string{"/proc/sys/kernel/io_uring_disabled": "1\n", "/proc/sys/kernel/io_uring_group": "1234\n"}, "io_uring_group=1234"},
		{unix.EPERM, map[string]string{"/proc/sys/kernel/io_uring_disabled": "0\n", "/proc/self/status": "Name:\tx\nSeccomp:\t2\n"}, "seccomp filter active"},
		{unix.EPERM, nil, "security module or seccomp"},
		{unix.ENOSYS, map[string]string{"/proc/self/status": "Seccomp:\t2\n"}, "seccomp"},
		{unix.ENOSYS, nil, "CONFIG_IO_URING"},
	} {
		if got := explainSetupErrno(c.errno, files(c.files)); !strings.Contains(got, c.want) {
			t.Errorf("explainSetupErrno(%v, %v) = %q, want it to mention %q", c.errno, c.files, got, c.want)
		}
	}
}

// TestUringZeroAllocs checks that steady-state prep/submit/wait allocates
// nothing.
func TestUringZeroAllocs(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newTestUring(t, 8)
	fd := openTestFile(t, filepath.Join(t.TempDir(), "allocs"), unix.O_RDWR|unix.O_CREAT)
	if err := unix.Ftruncate(fd, 8*4096); err != nil {
		t.Fatal(err)
	}
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, 4096)
	}
	comps := make([]completion, 8)
	var failed error
	cycle := func() {
		for tok := range 8 {
			op := OpRead
			if tok%2 == 1 {
				op = OpWrite
			}
			r.prep(op, fdTarget(fd), bufs[tok], int64(tok)*4096, uint32(tok))
		}
		if err := r.submit(); err != nil {
			failed = err
			return
		}
		for got := 0; got < 8; {
			n, err := r.wait(1, comps)
			if err != nil {
				failed = err
				return
			}
			got += n
		}
	}
	cycle()
	allocs := testing.AllocsPerRun(200, cycle)
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per prep/submit/wait cycle, want 0", allocs)
	}
}

// BenchmarkUringRead4K measures steady-state 4 KiB reads from a page-cached
// file at queue depth 32; one op is one completed read.
func BenchmarkUringRead4K(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const qd, block, fileBlocks = 32, 4096, 1024
	r := newTestUring(b, qd)
	path := filepath.Join(b.TempDir(), "bench")
	data := make([]byte, fileBlocks*block)
	fillPattern(data, 5)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	fd := openTestFile(b, path, unix.O_RDONLY)
	if _, err := unix.Pread(fd, data, 0); err != nil { // warm the page cache
		b.Fatal(err)
	}
	bufs := make([][]byte, qd)
	for i := range bufs {
		bufs[i] = make([]byte, block)
	}
	comps := make([]completion, qd)
	next := 0
	prep := func(tok uint32) {
		r.prep(OpRead, fdTarget(fd), bufs[tok], int64(next%fileBlocks)*block, tok)
		next += 7 // stride through the file
	}
	b.SetBytes(block)
	b.ReportAllocs()
	b.ResetTimer()
	issued := 0
	for tok := range min(qd, b.N) {
		prep(uint32(tok))
		issued++
	}
	for done := 0; done < b.N; {
		if err := r.submit(); err != nil {
			b.Fatal(err)
		}
		n, err := r.wait(1, comps)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range comps[:n] {
			if c.res != block {
				b.Fatalf("res %d", c.res)
			}
			done++
			if issued < b.N {
				prep(c.token)
				issued++
			}
		}
	}
}

// TestUringParksOnEventfd: on every setup tier this kernel accepts, a
// ring has an eventfd, and a wait for a direct read or write of 1 MiB
// parks on it and is woken by the kernel's signal (about one park each,
// not one per parkMax); a ring whose eventfd the kernel never signals
// still completes its waits, a parkMax at a time.
func TestUringParksOnEventfd(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	skipWithoutUring(t)
	path := filepath.Join(t.TempDir(), "park")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Skipf("O_DIRECT: %v", err)
	}
	defer unix.Close(fd)
	const ops, size = 16, 1 << 20
	buf := alignedBuf(t, ops/2*size)
	fillPattern(buf, 9)
	if _, err := unix.Pwrite(fd, buf, 0); err != nil {
		t.Fatal(err)
	}
	// drive runs reads and writes in turn, one at a time, and returns the
	// parks per operation.
	drive := func(t *testing.T, r *uringRing) float64 {
		t.Helper()
		comps := make([]completion, 1)
		before := r.evfd.parks
		for i := range ops {
			op := OpRead
			if i%2 == 1 {
				op = OpWrite
			}
			b := buf[i/2*size : (i/2+1)*size]
			r.prep(op, fdTarget(fd), b, int64(i/2*size), 0)
			if err := r.submit(); err != nil {
				t.Fatal(err)
			}
			if n, err := r.wait(1, comps); err != nil || n != 1 || comps[0].res != size {
				t.Fatalf("op %d: %d completions (%v), %v", i, n, comps[:n], err)
			}
		}
		return float64(r.evfd.parks-before) / ops
	}
	for _, flags := range uringSetupTiers {
		r, ok := openTier(t, flags)
		if !ok {
			continue
		}
		if !r.evfd.ok() {
			t.Errorf("flags %#x: no eventfd: waits block in io_uring_enter, holding a Go processor", flags)
		} else if parks := drive(t, r); parks < 0.5 || parks > 1.5 {
			t.Errorf("flags %#x: %.2f parks an operation (want about 1: the kernel's signal, not the deadline, ends a park)", flags, parks)
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
	}
	// An eventfd the kernel does not know: only the deadline ends a park.
	r := newTestUring(t, 4)
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	r.evfd.drop()
	r.evfd = parker{f: os.NewFile(uintptr(efd), "unregistered eventfd")}
	if parks := drive(t, r); parks < 1 {
		t.Errorf("unsignalled eventfd: %.2f parks an operation, want at least 1", parks)
	}
}

// openTier opens a 4-entry ring with the setup flags of one tier; false
// where this kernel refuses them (EINVAL), any other failure fatal.
func openTier(t *testing.T, flags uint32) (*uringRing, bool) {
	t.Helper()
	r, err := openUring(4, []uint32{flags})
	if errors.Is(err, unix.EINVAL) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("flags %#x: %v", flags, err)
	}
	return r, true
}
