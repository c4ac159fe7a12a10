package aio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/test/testenv"
)

// libaioTestRing returns a ring of the given capacity, closed at cleanup, or
// skips the test where kernel AIO is unavailable (fails it when
// ZINF_REQUIRE_BACKENDS lists libaio).
func libaioTestRing(tb testing.TB, entries int) *libaioRing {
	tb.Helper()
	testenv.SkipUnavailable(tb, BackendLibaio, libaioAvailable())
	rg, err := newLibaioRing(entries)
	if err != nil {
		tb.Fatalf("newLibaioRing(%d): %v", entries, err)
	}
	r := rg.(*libaioRing)
	tb.Cleanup(func() {
		if r.ctx != 0 {
			if err := r.close(); err != nil {
				tb.Errorf("close: %v", err)
			}
		}
	})
	return r
}

// libaioMmap returns page-aligned anonymous memory outside the Go heap.
func libaioMmap(tb testing.TB, size int) []byte {
	tb.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		tb.Fatalf("mmap %d: %v", size, err)
	}
	tb.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// libaioOpen opens a file in a temporary directory, skipping the test when
// O_DIRECT is asked for and the filesystem refuses it.
func libaioOpen(tb testing.TB, name string, flag int) (fd int, path string) {
	tb.Helper()
	path = filepath.Join(tb.TempDir(), name)
	fd, err := unix.Open(path, flag|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err == unix.EINVAL && flag&unix.O_DIRECT != 0 {
		tb.Skipf("O_DIRECT refused on %s", filepath.Dir(path))
	}
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	tb.Cleanup(func() { _ = unix.Close(fd) })
	return fd, path
}

type libaioTestOp struct {
	op  Op
	fd  int
	buf []byte
	off int64
}

// libaioRun drives ops through r the way a worker does: up to capacity in
// flight, prep/submit, then wait for at least one completion and refill. It
// returns each op's result and fails the test if a token is completed twice
// or an op never completes.
func libaioRun(tb testing.TB, r *libaioRing, ops []libaioTestOp) []int32 {
	tb.Helper()
	res := make([]int32, len(ops))
	doneOps := make([]bool, len(ops))
	opOf := make([]int, r.capacity()) // token -> op index, -1 when free
	free := make([]uint32, 0, r.capacity())
	for tok := range opOf {
		opOf[tok] = -1
		free = append(free, uint32(tok))
	}
	out := make([]completion, r.capacity())
	next, completed := 0, 0
	for completed < len(ops) {
		for next < len(ops) && len(free) > 0 {
			tok := free[len(free)-1]
			free = free[:len(free)-1]
			o := ops[next]
			r.prep(o.op, fdTarget(o.fd), o.buf, o.off, tok)
			opOf[tok] = next
			next++
		}
		if err := r.submit(); err != nil {
			tb.Fatalf("submit: %v", err)
		}
		n, err := r.wait(1, out)
		if err != nil {
			tb.Fatalf("wait: %v", err)
		}
		if n < 1 {
			tb.Fatalf("wait(1) returned %d completions", n)
		}
		for _, c := range out[:n] {
			i := opOf[c.token]
			if i < 0 || doneOps[i] {
				tb.Fatalf("token %d completed twice or never prepped", c.token)
			}
			doneOps[i] = true
			res[i] = c.res
			opOf[c.token] = -1
			free = append(free, c.token)
			completed++
		}
	}
	if r.nq != 0 || r.inKernel != 0 || r.readyLen != 0 {
		tb.Fatalf("ring not idle after all completions: queued %d, in kernel %d, ready %d", r.nq, r.inKernel, r.readyLen)
	}
	return res
}

func libaioPattern(b []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

func TestLibaioAvailable(t *testing.T) {
	err := libaioAvailable()
	if err != nil && !errors.Is(err, ErrUnavailable) {
		t.Fatalf("libaioAvailable: %v does not match ErrUnavailable", err)
	}
	t.Logf("libaioAvailable: %v", err)
	if err != nil && testenv.Required(t, BackendLibaio) {
		t.Fatalf("libaio is required (%s) but unavailable: %v", testenv.RequireBackendsEnv, err)
	}
}

func TestLibaioSetupErrors(t *testing.T) {
	for _, tc := range []struct {
		errno unix.Errno
		want  string
	}{
		{unix.EAGAIN, "/proc/sys/fs/aio-max-nr"},
		{unix.ENOSYS, "CONFIG_AIO"},
		{unix.EPERM, "seccomp"},
		{unix.EINVAL, "too"},
	} {
		err := libaioSetupError(64, tc.errno)
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, tc.errno) {
			t.Errorf("%v: %v does not match ErrUnavailable and the errno", tc.errno, err)
		}
		if tc.errno != unix.EINVAL && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %q does not mention %q", tc.errno, err, tc.want)
		}
		if !strings.Contains(err.Error(), "io_setup(64)") {
			t.Errorf("%v: %q does not name the call", tc.errno, err)
		}
	}
	if _, err := newLibaioRing(0); err == nil {
		t.Error("newLibaioRing(0) succeeded")
	}
}

func TestLibaioABI(t *testing.T) {
	cb := libaioIocb{data: 0x0102030405060708, opcode: iocbCmdPwrite, fildes: 7, buf: 0x1122, nbytes: 4096, offset: 8192}
	want := make([]byte, 64)
	ne := binary.NativeEndian
	ne.PutUint64(want[0:], 0x0102030405060708) // aio_data
	ne.PutUint16(want[16:], iocbCmdPwrite)     // aio_lio_opcode
	ne.PutUint32(want[20:], 7)                 // aio_fildes
	ne.PutUint64(want[24:], 0x1122)            // aio_buf
	ne.PutUint64(want[32:], 4096)              // aio_nbytes
	ne.PutUint64(want[40:], 8192)              // aio_offset
	if raw := unsafe.Slice((*byte)(unsafe.Pointer(&cb)), unsafe.Sizeof(cb)); !bytes.Equal(raw, want) {
		t.Fatalf("iocb layout\n got % x\nwant % x", raw, want)
	}
	var ev libaioEvent
	if unsafe.Offsetof(ev.obj) != 8 || unsafe.Offsetof(ev.res) != 16 || unsafe.Offsetof(ev.res2) != 24 {
		t.Fatal("io_event layout differs from the kernel's")
	}
	if unsafe.Offsetof(cb.flags) != 56 || unsafe.Offsetof(cb.resfd) != 60 {
		t.Fatal("iocb tail layout differs from the kernel's")
	}
}

func TestLibaioDirectRoundTrip(t *testing.T) {
	const (
		blockBytes = 16 << 10
		nOps       = 64
	)
	r := libaioTestRing(t, 16)
	fd, path := libaioOpen(t, "direct.bin", unix.O_RDWR|unix.O_DIRECT)
	wbuf := libaioMmap(t, nOps*blockBytes)
	rbuf := libaioMmap(t, nOps*blockBytes)
	libaioPattern(wbuf, 1)

	// Blocks land at scattered offsets, with holes between them, in an
	// order unrelated to their position in memory.
	rng := rand.New(rand.NewPCG(2, 3))
	perm := rng.Perm(nOps)
	var writes, reads []libaioTestOp
	for i := range nOps {
		off := int64(perm[i]) * 3 * blockBytes
		writes = append(writes, libaioTestOp{OpWrite, fd, wbuf[i*blockBytes : (i+1)*blockBytes], off})
		reads = append(reads, libaioTestOp{OpRead, fd, rbuf[i*blockBytes : (i+1)*blockBytes], off})
	}
	for i, res := range libaioRun(t, r, writes) {
		if res != blockBytes {
			t.Fatalf("write %d at %d: res %d", i, writes[i].off, res)
		}
	}
	for i, res := range libaioRun(t, r, reads) {
		if res != blockBytes {
			t.Fatalf("read %d at %d: res %d", i, reads[i].off, res)
		}
	}
	if !bytes.Equal(wbuf, rbuf) {
		t.Fatal("O_DIRECT read-back differs from what was written")
	}
	// Differential check against plain buffered reads of the same file.
	ref, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range writes {
		if !bytes.Equal(ref[w.off:w.off+blockBytes], w.buf) {
			t.Fatalf("block %d at %d: file content differs", i, w.off)
		}
	}
}

func TestLibaioBufferedRoundTrip(t *testing.T) {
	const nOps = 40
	r := libaioTestRing(t, 8)
	fd, path := libaioOpen(t, "buffered.bin", unix.O_RDWR)
	var writes, reads []libaioTestOp
	off := int64(0)
	for i := range nOps {
		// Odd lengths and offsets: no alignment without O_DIRECT.
		n := 777 + 311*i
		off += int64(13 + 97*i)
		w := make([]byte, n)
		libaioPattern(w, uint64(i))
		writes = append(writes, libaioTestOp{OpWrite, fd, w, off})
		reads = append(reads, libaioTestOp{OpRead, fd, make([]byte, n), off})
		off += int64(n)
	}
	for i, res := range libaioRun(t, r, writes) {
		if int(res) != len(writes[i].buf) {
			t.Fatalf("write %d: res %d, want %d", i, res, len(writes[i].buf))
		}
	}
	for i, res := range libaioRun(t, r, reads) {
		if int(res) != len(reads[i].buf) || !bytes.Equal(reads[i].buf, writes[i].buf) {
			t.Fatalf("read %d: res %d, data equal %v", i, res, bytes.Equal(reads[i].buf, writes[i].buf))
		}
	}
	ref, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range writes {
		if !bytes.Equal(ref[w.off:w.off+int64(len(w.buf))], w.buf) {
			t.Fatalf("op %d: file content differs", i)
		}
	}
}

func TestLibaioErrorCompletions(t *testing.T) {
	r := libaioTestRing(t, 16)
	fd, path := libaioOpen(t, "errs.bin", unix.O_RDWR|unix.O_DIRECT)
	buf := libaioMmap(t, 8*4096)
	libaioPattern(buf, 7)
	if res := libaioRun(t, r, []libaioTestOp{{OpWrite, fd, buf[:4*4096], 0}}); res[0] != 4*4096 {
		t.Fatalf("setup write: res %d", res[0])
	}
	rdonly, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rdonly)
	closedFd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(closedFd)

	ops := []libaioTestOp{
		{OpRead, fd, buf[4*4096 : 5*4096], 0},       // fine
		{OpRead, fd, buf[5*4096 : 6*4096], 1},       // misaligned offset under O_DIRECT
		{OpRead, fd, buf[5*4096+1 : 6*4096+1], 0},   // misaligned buffer under O_DIRECT
		{OpRead, fd, buf[6*4096 : 6*4096+100], 0},   // misaligned length under O_DIRECT
		{OpRead, -1, buf[6*4096 : 7*4096], 0},       // refused by io_submit: EBADF
		{OpWrite, rdonly, buf[:4096], 0},            // refused by io_submit: EBADF
		{OpRead, closedFd, buf[7*4096 : 8*4096], 0}, // refused by io_submit: EBADF
		{OpRead, fd, buf[7*4096 : 8*4096], 1 << 20}, // past end of file: 0 bytes
		{OpWrite, fd, buf[:4096], 4 * 4096},         // fine, after the refusals in the same batch
	}
	want := []int32{4096, -int32(unix.EINVAL), -int32(unix.EINVAL), -int32(unix.EINVAL),
		-int32(unix.EBADF), -int32(unix.EBADF), -int32(unix.EBADF), 0, 4096}
	got := libaioRun(t, r, ops)
	for i := range ops {
		if got[i] != want[i] {
			t.Errorf("op %d: res %d (%v), want %d", i, got[i], unix.Errno(-got[i]), want[i])
		}
	}
}

// libaioFakeKernel wraps the real syscalls of a ring to emulate a kernel
// with few request slots, which accepts batches piecemeal and is
// interrupted by signals. It records what the kernel actually accepted, so
// a test can prove nothing is lost or submitted twice.
type libaioFakeKernel struct {
	slots       int // the most operations the emulated kernel holds
	outstanding int
	rng         *rand.Rand
	accepted    map[uint32]int // token -> times accepted since its prep
	eagain      int
	eintr       int
}

func (k *libaioFakeKernel) install(r *libaioRing) {
	realSubmit, realGet := r.ioSubmit, r.ioGetevents
	r.ioSubmit = func(ctx uintptr, iocbs []*libaioIocb) (int, unix.Errno) {
		if k.rng.IntN(8) == 0 {
			k.eintr++
			return 0, unix.EINTR
		}
		room := k.slots - k.outstanding
		if room == 0 || k.rng.IntN(6) == 0 {
			k.eagain++
			return 0, unix.EAGAIN
		}
		take := 1 + k.rng.IntN(min(room, len(iocbs)))
		n, errno := realSubmit(ctx, iocbs[:take])
		if errno == 0 {
			for _, cb := range iocbs[:n] {
				k.accepted[uint32(cb.data)]++
			}
			k.outstanding += n
		}
		return n, errno
	}
	r.ioGetevents = func(ctx uintptr, minNr int, events []libaioEvent, ts *unix.Timespec) (int, unix.Errno) {
		if k.rng.IntN(8) == 0 {
			k.eintr++
			return 0, unix.EINTR
		}
		n, errno := realGet(ctx, minNr, events, ts)
		if errno == 0 {
			k.outstanding -= n
			for _, ev := range events[:n] {
				if k.accepted[uint32(ev.data)] != 1 {
					panic("completion for a token accepted " + strconv.Itoa(k.accepted[uint32(ev.data)]) + " times")
				}
				delete(k.accepted, uint32(ev.data))
			}
		}
		return n, errno
	}
}

func TestLibaioPartialSubmitEAGAIN(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("ZINF_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (set ZINF_TEST_SEED to reproduce)", seed)
	r := libaioTestRing(t, 16)
	k := &libaioFakeKernel{slots: 3, rng: rand.New(rand.NewPCG(seed, 1)), accepted: map[uint32]int{}}
	k.install(r)
	fd, _ := libaioOpen(t, "partial.bin", unix.O_RDWR)

	const nOps = 200
	var writes, reads []libaioTestOp
	for i := range nOps {
		w := make([]byte, 512+i)
		libaioPattern(w, uint64(i))
		writes = append(writes, libaioTestOp{OpWrite, fd, w, int64(i) * 1024})
		reads = append(reads, libaioTestOp{OpRead, fd, make([]byte, len(w)), int64(i) * 1024})
	}
	for i, res := range libaioRun(t, r, writes) {
		if int(res) != len(writes[i].buf) {
			t.Fatalf("write %d: res %d", i, res)
		}
	}
	for i, res := range libaioRun(t, r, reads) {
		if int(res) != len(reads[i].buf) || !bytes.Equal(reads[i].buf, writes[i].buf) {
			t.Fatalf("read %d: res %d, data equal %v", i, res, bytes.Equal(reads[i].buf, writes[i].buf))
		}
	}
	if len(k.accepted) != 0 || k.outstanding != 0 {
		t.Fatalf("emulated kernel still holds %d operations (%d accepted, not completed)", k.outstanding, len(k.accepted))
	}
	t.Logf("emulated EAGAIN %d times, EINTR %d times", k.eagain, k.eintr)
	if k.eagain == 0 {
		t.Fatal("the EAGAIN path was not exercised")
	}
}

// TestLibaioWaitBeyondKernelSlots fills the ring while the kernel takes only
// two operations at a time: submit must leave the rest queued, and one wait
// for all of them must submit them as slots free up.
func TestLibaioWaitBeyondKernelSlots(t *testing.T) {
	r := libaioTestRing(t, 8)
	fd, _ := libaioOpen(t, "slots.bin", unix.O_RDWR)
	slots, outstanding := 2, 0
	realSubmit, realGet := r.ioSubmit, r.ioGetevents
	r.ioSubmit = func(ctx uintptr, iocbs []*libaioIocb) (int, unix.Errno) {
		if outstanding == slots {
			return 0, unix.EAGAIN
		}
		n, errno := realSubmit(ctx, iocbs[:min(len(iocbs), slots-outstanding)])
		outstanding += n
		return n, errno
	}
	r.ioGetevents = func(ctx uintptr, minNr int, events []libaioEvent, ts *unix.Timespec) (int, unix.Errno) {
		if minNr == 0 {
			return 0, 0 // a slow device: polls find nothing finished
		}
		n, errno := realGet(ctx, minNr, events, ts)
		outstanding -= n
		return n, errno
	}
	bufs := make([][]byte, 8)
	for tok := range bufs {
		bufs[tok] = bytes.Repeat([]byte{byte(tok)}, 100)
		r.prep(OpWrite, fdTarget(fd), bufs[tok], int64(tok)*100, uint32(tok))
	}
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	if r.nq == 0 {
		t.Fatal("nothing left queued although the kernel has two slots")
	}
	out := make([]completion, 8)
	n, err := r.wait(8, out)
	if err != nil || n != 8 {
		t.Fatalf("wait(8) = %d, %v", n, err)
	}
	seen := map[uint32]bool{}
	for _, c := range out {
		if c.res != 100 || seen[c.token] {
			t.Fatalf("completion %+v (seen before: %v)", c, seen[c.token])
		}
		seen[c.token] = true
	}
	got := make([]byte, 800)
	if _, err := unix.Pread(fd, got, 0); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != byte(i/100) {
			t.Fatalf("byte %d = %d, want %d", i, b, i/100)
		}
	}
}

// TestLibaioRandomDifferential runs random batches of reads and writes on
// disjoint extents against an in-memory model of the file.
func TestLibaioRandomDifferential(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("ZINF_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (set ZINF_TEST_SEED to reproduce)", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	const (
		slotBytes = 8192
		nSlots    = 64
	)
	r := libaioTestRing(t, 32)
	fd, _ := libaioOpen(t, "diff.bin", unix.O_RDWR)
	model := make([]byte, slotBytes*nSlots)
	fileLen := 0
	for round := range 30 {
		// Operations in one batch touch disjoint extents: concurrent
		// overlapping writes have no defined order.
		slots := rng.Perm(nSlots)[:1+rng.IntN(nSlots)]
		ops := make([]libaioTestOp, len(slots))
		for i, s := range slots {
			start := s*slotBytes + rng.IntN(slotBytes)
			n := 1 + rng.IntN((s+1)*slotBytes-start)
			buf := make([]byte, n)
			op := OpRead
			if rng.IntN(2) == 0 {
				op = OpWrite
				libaioPattern(buf, rng.Uint64())
			}
			ops[i] = libaioTestOp{op, fd, buf, int64(start)}
		}
		res := libaioRun(t, r, ops)
		for i, o := range ops {
			start, n := int(o.off), len(o.buf)
			if o.op == OpWrite {
				if int(res[i]) != n {
					t.Fatalf("round %d op %d: write res %d, want %d", round, i, res[i], n)
				}
				copy(model[start:], o.buf)
				fileLen = max(fileLen, start+n)
				continue
			}
			want := model[start:min(start+n, max(fileLen, start))]
			if int(res[i]) != len(want) || !bytes.Equal(o.buf[:len(want)], want) {
				t.Fatalf("round %d op %d: read at %d of %d: res %d, want %d bytes (equal %v)",
					round, i, start, n, res[i], len(want), int(res[i]) == len(want) && bytes.Equal(o.buf[:len(want)], want))
			}
		}
		// Apply writes of this round before the reads of the next: the
		// batch above already completed, so the model is current.
	}
}

func TestLibaioWaitAndClose(t *testing.T) {
	r := libaioTestRing(t, 4)
	out := make([]completion, 4)
	if n, err := r.wait(0, out); n != 0 || err != nil {
		t.Fatalf("wait(0) on an idle ring = %d, %v", n, err)
	}
	if _, err := r.wait(1, out); err == nil {
		t.Fatal("wait(1) with nothing outstanding did not fail")
	}
	if err := r.submit(); err != nil {
		t.Fatalf("empty submit: %v", err)
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	if err := r.close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if err := r.submit(); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
	if _, err := r.wait(0, out); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
}

func TestLibaioPrepBrokenInvariants(t *testing.T) {
	r := libaioTestRing(t, 2)
	buf := make([]byte, 8)
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	mustPanic("token out of range", func() { r.prep(OpRead, fdTarget(0), buf, 0, 2) })
	r.prep(OpRead, fdTarget(-1), buf, 0, 1)
	mustPanic("token in use", func() { r.prep(OpRead, fdTarget(-1), buf, 0, 1) })
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	out := make([]completion, 2)
	if n, err := r.wait(1, out); n != 1 || out[0] != (completion{token: 1, res: -int32(unix.EBADF)}) || err != nil {
		t.Fatalf("wait = %d, %+v, %v", n, out[0], err)
	}
}

// libaioSteadyState issues 4 KiB O_DIRECT reads, keeping depth in flight:
// each call reaps at least one completion and re-preps its token.
type libaioSteadyState struct {
	r      *libaioRing
	fd     int
	buf    []byte
	out    []completion
	offs   int64
	next   int64
	failed int32
}

func newLibaioSteadyState(tb testing.TB, depth int) *libaioSteadyState {
	const fileBytes = 4 << 20
	s := &libaioSteadyState{r: libaioTestRing(tb, depth), offs: fileBytes / 4096}
	s.fd, _ = libaioOpen(tb, "bench.bin", unix.O_RDWR|unix.O_DIRECT)
	w := libaioMmap(tb, fileBytes)
	if n, err := unix.Pwrite(s.fd, w, 0); n != fileBytes || err != nil {
		tb.Fatalf("pwrite: %d, %v", n, err)
	}
	s.buf = libaioMmap(tb, depth*4096)
	s.out = make([]completion, depth)
	for tok := range depth {
		s.prep(uint32(tok))
	}
	if err := s.r.submit(); err != nil {
		tb.Fatal(err)
	}
	return s
}

func (s *libaioSteadyState) prep(tok uint32) {
	s.r.prep(OpRead, fdTarget(s.fd), s.buf[int(tok)*4096:int(tok+1)*4096], (s.next%s.offs)*4096, tok)
	s.next += 7 // stride over the file
}

// step reaps at least one completion, re-preps and submits; it returns the
// number of operations completed.
func (s *libaioSteadyState) step() int {
	n, err := s.r.wait(1, s.out)
	if err != nil {
		panic(err)
	}
	for _, c := range s.out[:n] {
		if c.res != 4096 {
			s.failed = c.res
		}
		s.prep(c.token)
	}
	if err := s.r.submit(); err != nil {
		panic(err)
	}
	return n
}

func (s *libaioSteadyState) drain(tb testing.TB) {
	for s.r.inKernel > 0 {
		if _, err := s.r.wait(1, s.out); err != nil {
			tb.Fatal(err)
		}
	}
	if s.failed != 0 {
		tb.Fatalf("a 4 KiB read returned %d", s.failed)
	}
}

func TestLibaioZeroAllocs(t *testing.T) {
	for _, depth := range []int{1, 8} {
		s := newLibaioSteadyState(t, depth)
		for range 100 { // warm up
			s.step()
		}
		if a := testing.AllocsPerRun(500, func() { s.step() }); a != 0 {
			t.Errorf("depth %d: %.2f allocations per prep/submit/wait, want 0", depth, a)
		}
		s.drain(t)
	}
}

func BenchmarkLibaio4K(b *testing.B) {
	for _, depth := range []int{1, 32} {
		b.Run("qd"+strconv.Itoa(depth), func(b *testing.B) {
			s := newLibaioSteadyState(b, depth)
			b.SetBytes(4096)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				done += s.step()
			}
			b.StopTimer()
			s.drain(b)
		})
	}
}

// TestRetryEINTR: a probe call interrupted by a signal is called again
// (up to probeEINTRTries times), so an EINTR never reads as "filtered".
func TestRetryEINTR(t *testing.T) {
	calls := 0
	if errno := retryEINTR(func() unix.Errno {
		calls++
		if calls < 3 {
			return unix.EINTR
		}
		return 0
	}); errno != 0 || calls != 3 {
		t.Fatalf("errno %v after %d calls; want 0 after 3", errno, calls)
	}
	calls = 0
	if errno := retryEINTR(func() unix.Errno { calls++; return unix.EINTR }); errno != unix.EINTR || calls != probeEINTRTries {
		t.Fatalf("always EINTR: errno %v after %d calls; want EINTR after %d", errno, calls, probeEINTRTries)
	}
	calls = 0
	if errno := retryEINTR(func() unix.Errno { calls++; return unix.EPERM }); errno != unix.EPERM || calls != 1 {
		t.Fatalf("EPERM: errno %v after %d calls", errno, calls)
	}
}

// TestLibaioParksOnEventfd: a ring's operations signal its eventfd, and a
// wait for a direct read or write of 1 MiB parks on it and is woken by that
// signal (about one park each, not one per parkMax); without the flag on
// the operations (an eventfd the kernel never signals) the waits still
// complete, a parkMax at a time.
func TestLibaioParksOnEventfd(t *testing.T) {
	r := libaioTestRing(t, 4)
	if !r.evfd.ok() {
		t.Fatal("no eventfd: waits block in io_getevents, holding a Go processor")
	}
	fd, _ := libaioOpen(t, "park.bin", unix.O_RDWR|unix.O_DIRECT)
	const ops, size = 16, 1 << 20
	buf := libaioMmap(t, ops/2*size)
	libaioPattern(buf, 4)
	var list []libaioTestOp
	for i := range ops {
		op := OpWrite
		if i%2 == 1 {
			op = OpRead
		}
		list = append(list, libaioTestOp{op, fd, buf[i/2*size : (i/2+1)*size], int64(i / 2 * size)})
	}
	for _, unsignalled := range []bool{false, true} {
		if unsignalled {
			// The wait parks on one eventfd, the operations name
			// another: only the deadline ends a park.
			r.evfd.drop()
			parkOn, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			named, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(named) })
			r.evfd = parker{f: os.NewFile(uintptr(parkOn), "unsignalled eventfd"), fd: named}
		}
		before := r.evfd.parks
		// One operation at a time, so that each wait parks.
		for i := range list {
			if res := libaioRun(t, r, list[i:i+1])[0]; res != size {
				t.Fatalf("unsignalled %v, op %d: res %d", unsignalled, i, res)
			}
		}
		parks := float64(r.evfd.parks-before) / ops
		if !unsignalled && (parks < 0.5 || parks > 1.5) {
			t.Errorf("%.2f parks an operation (want about 1: the kernel's signal, not the deadline, ends a park)", parks)
		}
		if unsignalled && parks < 1 {
			t.Errorf("unsignalled eventfd: %.2f parks an operation, want at least 1", parks)
		}
	}
}
