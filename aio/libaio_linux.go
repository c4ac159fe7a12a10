package aio

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the "libaio" backend's ring: Linux kernel AIO driven through
// raw io_setup/io_submit/io_getevents/io_destroy syscalls. There is no cgo
// and no libaio.so; the two kernel structures it exchanges are declared
// below with the kernel's layout.
//
// Kernel AIO is asynchronous only for O_DIRECT files on filesystems that
// support it (ext4, xfs). On a buffered file the kernel performs the copy
// inside io_submit, which then blocks like pread/pwrite; results are still
// delivered through io_getevents, so the ring behaves the same, only
// without overlap.

// Opcodes of struct iocb's aio_lio_opcode (include/uapi/linux/aio_abi.h).
const (
	iocbCmdPread  = 0
	iocbCmdPwrite = 1
)

// libaioIocb is the kernel's struct iocb (64 bytes on every architecture).
// The kernel declares aio_key and aio_rw_flags in endian-dependent order;
// both are always zero here, so one declaration serves every byte order.
// aio_buf and the other addresses are 64-bit even on 32-bit kernels.
type libaioIocb struct {
	data      uint64 // aio_data: returned in io_event.data; holds the token
	key       uint32 // aio_key: written by the kernel during io_submit
	rwFlags   uint32 // aio_rw_flags: RWF_* per-I/O flags (none used)
	opcode    uint16 // aio_lio_opcode
	reqprio   int16  // aio_reqprio
	fildes    uint32 // aio_fildes
	buf       uint64 // aio_buf: user buffer address
	nbytes    uint64 // aio_nbytes
	offset    int64  // aio_offset
	reserved2 uint64 // aio_reserved2: must be 0
	flags     uint32 // aio_flags: IOCB_FLAG_* (IOCB_FLAG_RESFD with an eventfd)
	resfd     uint32 // aio_resfd: the eventfd IOCB_FLAG_RESFD signals
}

// libaioFlagResfd is IOCB_FLAG_RESFD: the kernel signals aio_resfd when the
// operation completes.
const libaioFlagResfd = 1

// libaioEvent is the kernel's struct io_event (32 bytes).
type libaioEvent struct {
	data uint64 // the iocb's aio_data
	obj  uint64 // the user address of the iocb
	res  int64  // bytes moved, or a negated errno
	res2 int64  // secondary result (0 for reads and writes)
}

// The kernel ABI sizes; a mismatch fails to compile.
var (
	_ [64 - unsafe.Sizeof(libaioIocb{})]byte
	_ [unsafe.Sizeof(libaioIocb{}) - 64]byte
	_ [32 - unsafe.Sizeof(libaioEvent{})]byte
	_ [unsafe.Sizeof(libaioEvent{}) - 32]byte
)

var _ ring = (*libaioRing)(nil)

// libaioRing is a ring over one kernel AIO context.
//
// Each token owns one preallocated iocb (iocbs[token]) from prep until its
// completion is returned by wait, and the ring keeps the token's buffer
// referenced for that long (bufs[token]) so the garbage collector keeps it
// alive while the kernel may still write to it. All arrays the kernel reads
// or writes (iocbs, the iocb pointer array, events) live on the Go heap,
// which does not move, and are referenced by the ring for its lifetime.
//
// A token moves through these states:
//
//	prep -> queued (queue[:nq]) -> in the kernel (inKernel) -> returned by wait
//	                            \-> ready (a completion known to user space, not yet returned)
//
// An operation enters the kernel exactly once: io_submit is always handed
// the queue's head, and the queue advances by exactly the count io_submit
// reports as accepted. io_submit fails as a whole only when the first iocb
// of the batch is refused; that refusal is either a lack of resources
// (EAGAIN, ENOMEM: the operation stays queued and is retried by the next
// submit or wait) or a verdict on that operation (EBADF, EINVAL, ...: it
// becomes a completion with the negated errno, delivered by wait).
//
// ready also holds completions reaped early: when io_submit reports EAGAIN,
// submit polls (without blocking) for finished operations to free kernel
// slots, and keeps what it reaps for the next wait.
type libaioRing struct {
	ctx uintptr // aio_context_t; 0 once closed

	iocbs []libaioIocb // indexed by token
	bufs  [][]byte     // indexed by token: keeps in-flight buffers alive
	busy  []bool       // indexed by token: prepped and not yet returned

	queue []*libaioIocb // queue[:nq]: prepped, not yet accepted by the kernel
	nq    int

	inKernel int // accepted by io_submit, not yet reaped

	ready     []completion // FIFO ring buffer of readyLen entries from readyHead
	readyHead int
	readyLen  int

	events []libaioEvent // io_getevents output
	pollTS unix.Timespec // zero timeout: io_getevents returns at once

	// evfd is the eventfd every operation signals on completion
	// (IOCB_FLAG_RESFD): a wait for completions polls io_getevents and
	// parks on it instead of blocking in io_getevents (parker). Where it
	// could not be made, wait blocks in the kernel.
	evfd parker

	// deferred holds errors met where they cannot be returned (a failed
	// poll inside submit, which must not report the batch it did hand to
	// the kernel as refused; a stray event); the next wait returns them,
	// after its completions.
	deferred error

	// The syscalls, replaceable by tests to inject partial submission,
	// EAGAIN and EINTR.
	ioSubmit    func(ctx uintptr, iocbs []*libaioIocb) (int, unix.Errno)
	ioGetevents func(ctx uintptr, minNr int, events []libaioEvent, timeout *unix.Timespec) (int, unix.Errno)
}

// newLibaioRing creates a kernel AIO context that holds entries operations
// in flight. It fails with an error matching ErrUnavailable (and the errno)
// when the kernel cannot provide one; the message says why.
func newLibaioRing(entries int) (ring, error) {
	if entries <= 0 || entries > 1<<20 {
		return nil, fmt.Errorf("aio: libaio: ring capacity %d out of range [1, %d]", entries, 1<<20)
	}
	var ctx uintptr
	if errno := ioSetup(entries, &ctx); errno != 0 {
		return nil, libaioSetupError(entries, errno)
	}
	r := &libaioRing{
		ctx:         ctx,
		iocbs:       make([]libaioIocb, entries),
		bufs:        make([][]byte, entries),
		busy:        make([]bool, entries),
		queue:       make([]*libaioIocb, entries),
		ready:       make([]completion, entries),
		events:      make([]libaioEvent, entries),
		ioSubmit:    ioSubmit,
		ioGetevents: ioGetevents,
	}
	r.evfd = newParker(func(int) error { return nil })
	return r, nil
}

// libaioAvailable reports whether kernel AIO works here: it creates a
// one-entry context, exercises io_submit and io_getevents with no work (a
// seccomp policy may allow one syscall and not another) and destroys it.
// A failure matches ErrUnavailable and the errno, and says what to change.
func libaioAvailable() error {
	var ctx uintptr
	if errno := ioSetup(1, &ctx); errno != 0 {
		return libaioSetupError(1, errno)
	}
	var errs []string
	// A signal (the Go runtime's preemption, say) may interrupt either
	// call: that says nothing of whether the syscall is allowed, so it is
	// retried, as the ring retries it.
	if errno := retryEINTR(func() unix.Errno { _, e := ioSubmit(ctx, nil); return e }); errno != 0 {
		errs = append(errs, "io_submit: "+errno.Error())
	}
	var ts unix.Timespec
	if errno := retryEINTR(func() unix.Errno { _, e := ioGetevents(ctx, 0, nil, &ts); return e }); errno != 0 {
		errs = append(errs, "io_getevents: "+errno.Error())
	}
	if errno := ioDestroy(ctx); errno != 0 {
		errs = append(errs, "io_destroy: "+errno.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: libaio: io_setup works but %s (a seccomp or container policy may filter these syscalls)",
			ErrUnavailable, strings.Join(errs, ", "))
	}
	return nil
}

// probeEINTRTries bounds the retries of a probe call a signal
// interrupted.
const probeEINTRTries = 100

// retryEINTR runs call until it returns something other than EINTR, at
// most probeEINTRTries times, and returns the last errno.
func retryEINTR(call func() unix.Errno) unix.Errno {
	var errno unix.Errno
	for range probeEINTRTries {
		if errno = call(); errno != unix.EINTR {
			return errno
		}
	}
	return errno
}

// libaioSetupError explains why io_setup(entries) failed.
func libaioSetupError(entries int, errno unix.Errno) error {
	var why string
	switch errno {
	case unix.ENOSYS:
		why = "the kernel has no AIO support (built without CONFIG_AIO) or the syscall is filtered"
	case unix.EPERM:
		why = "the syscall is forbidden (seccomp or container policy)"
	case unix.EAGAIN:
		why = fmt.Sprintf("the system-wide AIO event limit is exhausted (fs.aio-nr %s in use of fs.aio-max-nr %s); "+
			"raise /proc/sys/fs/aio-max-nr (sysctl -w fs.aio-max-nr=1048576) or use fewer or shallower queues",
			readProcValue("/proc/sys/fs/aio-nr"), readProcValue("/proc/sys/fs/aio-max-nr"))
	case unix.EINVAL:
		why = "the kernel refuses this many events in one context"
	case unix.ENOMEM:
		why = "the kernel is out of memory"
	default:
		why = "unexpected error"
	}
	return fmt.Errorf("%w: libaio: io_setup(%d): %s: %w", ErrUnavailable, entries, why, errno)
}

// readProcValue returns a /proc file's trimmed content, or "?".
func readProcValue(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// prep fills the token's iocb and queues it. It panics on a broken
// invariant: a token outside [0, capacity) or one still in use.
func (r *libaioRing) registerBuffers([][]byte) error  { return errFixedUnsupported }
func (r *libaioRing) registerFile(int) (int32, error) { return -1, errFixedUnsupported }
func (r *libaioRing) unregisterFile(int32) error      { return errFixedUnsupported }

func (r *libaioRing) fixedBuffer([]byte) bool { return false }

func (r *libaioRing) prep(op Op, t target, buf []byte, off int64, token uint32) {
	fd := t.fd
	if int64(token) >= int64(len(r.iocbs)) || r.busy[token] {
		panic(fmt.Sprintf("aio: libaio prep: token %d out of range or in use (capacity %d)", token, len(r.iocbs)))
	}
	var opcode uint16
	switch op {
	case OpRead:
		opcode = iocbCmdPread
	case OpWrite:
		opcode = iocbCmdPwrite
	default:
		panic(fmt.Sprintf("aio: libaio prep: unknown op %d", op))
	}
	cb := &r.iocbs[token]
	*cb = libaioIocb{
		data:   uint64(token),
		opcode: opcode,
		// A negative fd becomes an invalid descriptor, which the kernel
		// refuses with EBADF (reported as that token's completion).
		fildes: uint32(fd),
		buf:    uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		nbytes: uint64(len(buf)),
		offset: off,
	}
	if r.evfd.ok() {
		cb.flags, cb.resfd = libaioFlagResfd, uint32(r.evfd.fd)
	}
	r.bufs[token] = buf
	r.busy[token] = true
	r.queue[r.nq] = cb // cannot overflow: queued tokens are busy tokens
	r.nq++
}

// submit hands the queued operations to the kernel. EINTR is retried. When
// the kernel lacks resources (EAGAIN/ENOMEM), submit reaps finished
// operations without blocking and retries; if none have finished, the rest
// stay queued, in order, and the next submit or wait submits them (wait
// blocks for completions first, which is what frees kernel slots). An
// operation the kernel refuses outright (EBADF, EINVAL, ...) is completed
// with that negated errno. submit never blocks waiting for a completion.
func (r *libaioRing) submit() error {
	if r.ctx == 0 {
		return ErrClosed
	}
	for r.nq > 0 {
		if !r.flush() || r.inKernel == 0 {
			return nil
		}
		n, err := r.reapToReady()
		if err != nil {
			// Part of the queue is in the kernel already, so this is no
			// refusal of the batch: wait reports it.
			r.deferred = errors.Join(r.deferred, err)
			return nil
		}
		if n == 0 {
			return nil
		}
	}
	return nil
}

// flush io_submits queue[:nq] until the queue is empty or the kernel
// reports a lack of resources; it returns whether the latter happened. The
// operations left are moved to the front of the queue, in order.
func (r *libaioRing) flush() (again bool) {
	done := 0
	for done < r.nq {
		n, errno := r.ioSubmit(r.ctx, r.queue[done:r.nq])
		switch {
		case errno == 0 && n > 0:
			if n > r.nq-done {
				panic(fmt.Sprintf("aio: libaio: io_submit accepted %d of %d", n, r.nq-done))
			}
			done += n
			r.inKernel += n
		case errno == unix.EINTR:
		case errno == 0 || errno == unix.EAGAIN || errno == unix.ENOMEM:
			// 0 accepted without an error cannot happen for a non-empty
			// batch; treat it as a lack of resources rather than spin.
			again = true
		default:
			// io_submit fails as a whole only when the batch's first iocb
			// is refused: that iocb is the culprit, and it never entered
			// the kernel.
			cb := r.queue[done]
			done++
			r.pushReady(r.finishQueued(uint32(cb.data), -int64(errno)))
		}
		if again {
			break
		}
	}
	// Compact so that prep appends after what is left (rare: only after
	// EAGAIN). Copying pointers allocates nothing.
	left := copy(r.queue, r.queue[done:r.nq])
	clear(r.queue[left:r.nq])
	r.nq = left
	return again
}

// wait returns completions: first those already known to user space, then
// from io_getevents, blocking until at least minN are stored (minN is capped
// at len(out)). Queued operations (left by submit after EAGAIN) are
// submitted as soon as the kernel takes them. It is an error to wait for
// more completions than there are operations outstanding. With an error,
// the count returned still says how many entries of out are valid; errors
// met earlier (see deferred) are returned with the next completions.
func (r *libaioRing) wait(minN int, out []completion) (int, error) {
	if r.ctx == 0 {
		return 0, ErrClosed
	}
	minN = max(0, min(minN, len(out)))
	got := 0
	backoff := time.Duration(0)
	for {
		if r.nq > 0 {
			r.flush()
		}
		got += r.popReady(out[got:])
		if got == len(out) {
			return got, r.takeDeferred()
		}
		need := minN - got
		if r.inKernel == 0 {
			if need <= 0 {
				return got, r.takeDeferred()
			}
			if r.nq == 0 {
				return got, errors.Join(r.takeDeferred(), fmt.Errorf("aio: libaio wait: %d more completions wanted but no operation is outstanding", need))
			}
			// The kernel refuses work while none of ours is in flight: its
			// per-CPU slot accounting can lag briefly. Back off and retry,
			// up to a bound, then complete the queued operations with
			// EAGAIN: the core retries those a bounded number of times, so
			// a kernel that never relents fails the requests instead of
			// hanging them or breaking the ring.
			if backoff > 100*time.Millisecond {
				for _, cb := range r.queue[:r.nq] {
					r.pushReady(r.finishQueued(uint32(cb.data), -int64(unix.EAGAIN)))
				}
				clear(r.queue[:r.nq])
				r.nq = 0
				backoff = 0
				continue
			}
			backoff = max(2*backoff, 50*time.Microsecond)
			time.Sleep(backoff)
			continue
		}
		kmin := max(0, min(need, r.inKernel))
		kmax := min(len(out)-got, r.inKernel)
		n, err := r.reap(kmin, kmax)
		if err != nil {
			return got, errors.Join(r.takeDeferred(), err)
		}
		for _, ev := range r.events[:n] {
			if c, ok := r.finish(ev.data, ev.res); ok {
				out[got] = c
				got++
			}
		}
		if got >= minN && (r.nq == 0 || n == 0) {
			return got, r.takeDeferred()
		}
		// Below minN (a signal cut io_getevents short), or slots were freed
		// for queued operations: go round again.
	}
}

// takeDeferred returns and clears the errors kept for wait.
func (r *libaioRing) takeDeferred() error {
	err := r.deferred
	r.deferred = nil
	return err
}

// reapToReady polls for finished operations and keeps them for wait.
func (r *libaioRing) reapToReady() (int, error) {
	n, err := r.reap(0, r.inKernel)
	for _, ev := range r.events[:n] {
		if c, ok := r.finish(ev.data, ev.res); ok {
			r.pushReady(c)
		}
	}
	return n, err
}

// reap runs io_getevents for between minNr and maxNr events into r.events,
// blocking when minNr > 0 (no timeout) and polling when minNr == 0. An
// interrupted call returns what it got, possibly fewer than minNr.
func (r *libaioRing) reap(minNr, maxNr int) (int, error) {
	if maxNr <= 0 {
		return 0, nil
	}
	ts := &r.pollTS
	if minNr > 0 && r.evfd.ok() {
		// Poll, and park on the eventfd between polls (parker says why),
		// then block in the kernel.
		for range parkRounds {
			n, err := r.reap(0, maxNr)
			if n > 0 || err != nil {
				return n, err
			}
			r.evfd.park()
			if !r.evfd.ok() {
				break // parking failed
			}
		}
	}
	if minNr > 0 {
		ts = nil
	}
	for {
		n, errno := r.ioGetevents(r.ctx, minNr, r.events[:maxNr], ts)
		switch errno {
		case 0:
			if n < 0 || n > maxNr {
				panic(fmt.Sprintf("aio: libaio: io_getevents returned %d of at most %d", n, maxNr))
			}
			r.inKernel -= n
			return n, nil
		case unix.EINTR:
			if minNr > 0 {
				return 0, nil // the caller recomputes what it still needs
			}
		default:
			return 0, os.NewSyscallError("io_getevents", errno)
		}
	}
}

// finish releases the token of an event from the kernel and builds its
// completion. An event for a token that is not in flight is discarded and
// recorded for wait to report (ok is false); it was not one of ours, so
// it does not count against inKernel either. The kernel caps one read or
// write at MAX_RW_COUNT (2 GiB - 4 KiB), so res fits in an int32.
func (r *libaioRing) finish(data uint64, res int64) (c completion, ok bool) {
	if data >= uint64(len(r.busy)) || !r.busy[data] {
		r.inKernel++
		r.deferred = errors.Join(r.deferred, &strayError{backend: BackendLibaio, token: data})
		return completion{}, false
	}
	return r.finishQueued(uint32(data), res), true
}

// finishQueued releases a token known to be in flight (one of the queue's)
// and builds its completion.
func (r *libaioRing) finishQueued(token uint32, res int64) completion {
	r.busy[token] = false
	r.bufs[token] = nil
	return completion{token: token, res: int32(res)}
}

func (r *libaioRing) pushReady(c completion) {
	r.ready[(r.readyHead+r.readyLen)%len(r.ready)] = c
	r.readyLen++
}

func (r *libaioRing) popReady(out []completion) int {
	n := min(len(out), r.readyLen)
	for i := range n {
		out[i] = r.ready[r.readyHead]
		r.readyHead = (r.readyHead + 1) % len(r.ready)
	}
	r.readyLen -= n
	return n
}

// capacity is the number of operations the context holds in flight.
func (r *libaioRing) capacity() int { return len(r.iocbs) }

// close destroys the context. The kernel's io_destroy cancels and waits
// for anything still in flight, so no buffer is written after close
// returns. A second close returns ErrClosed.
func (r *libaioRing) close() error {
	if r.ctx == 0 {
		return ErrClosed
	}
	errno := ioDestroy(r.ctx)
	r.ctx = 0
	r.evfd.drop()
	clear(r.bufs)
	clear(r.queue)
	if errno != 0 {
		return os.NewSyscallError("io_destroy", errno)
	}
	return nil
}

// The raw syscalls. Pointers are converted to uintptr in the argument list
// of unix.Syscall itself, which keeps what they point to alive and in place
// for the duration of the call.

func ioSetup(entries int, ctx *uintptr) unix.Errno {
	*ctx = 0 // the kernel requires a zeroed context on input
	_, _, errno := unix.Syscall(unix.SYS_IO_SETUP, uintptr(entries), uintptr(unsafe.Pointer(ctx)), 0)
	return errno
}

func ioDestroy(ctx uintptr) unix.Errno {
	_, _, errno := unix.Syscall(unix.SYS_IO_DESTROY, ctx, 0, 0)
	return errno
}

func ioSubmit(ctx uintptr, iocbs []*libaioIocb) (int, unix.Errno) {
	n, _, errno := unix.Syscall(unix.SYS_IO_SUBMIT, ctx, uintptr(len(iocbs)), uintptr(unsafe.Pointer(unsafe.SliceData(iocbs))))
	return int(n), errno
}

func ioGetevents(ctx uintptr, minNr int, events []libaioEvent, timeout *unix.Timespec) (int, unix.Errno) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_GETEVENTS, ctx, uintptr(minNr), uintptr(len(events)),
		uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(unsafe.Pointer(timeout)), 0)
	return int(n), errno
}
