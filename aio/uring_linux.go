package aio

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the io_uring ring, spoken to through the three raw system
// calls (io_uring_setup, io_uring_enter, io_uring_register) with no cgo and
// no liburing. The kernel ABI it relies on is include/uapi/linux/io_uring.h.

// uringNeedsLockedThread reports that the goroutine driving a uring ring
// must hold runtime.LockOSThread from before newUringRing until after close.
//
// The ring is set up, where the kernel allows it (Linux 6.1+), with
// IORING_SETUP_SINGLE_ISSUER|IORING_SETUP_DEFER_TASKRUN. Single issuer lets
// the kernel skip locking on the submission path; deferred task running
// means completions are posted only when the submitter asks for them
// (io_uring_enter with IORING_ENTER_GETEVENTS), in a batch, instead of
// interrupting the thread once per finished I/O. Both tie the ring to the
// OS thread (kernel task) that created it: io_uring_enter from any other
// thread fails with EEXIST. Go moves goroutines between threads, hence the
// lock. The worker dedicates its goroutine to the ring anyway, and spends
// most of its time blocked in io_uring_enter, so the locked thread costs
// nothing that was not already spent.
const uringNeedsLockedThread = true

// Kernel ABI constants.
const (
	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000

	uringSetupSubmitAll    = 1 << 7  // keep submitting a batch past a failing SQE (5.18)
	uringSetupCoopTaskrun  = 1 << 8  // no IPI to run completion work (5.19)
	uringSetupTaskrunFlag  = 1 << 9  // flag IORING_SQ_TASKRUN when completion work waits (5.19)
	uringSetupSingleIssuer = 1 << 12 // one task submits (6.0)

	uringFeatSingleMmap = 1 << 0 // SQ and CQ rings share one mapping (5.4)

	uringSQCQOverflow = 1 << 1 // sq_flags: CQEs wait in the kernel's overflow list
	uringSQTaskrun    = 1 << 2 // sq_flags: completion work is pending

	uringEnterGetEvents = 1 << 0

	uringOpReadFixed  = 4  // IORING_OP_READ_FIXED (5.1)
	uringOpWriteFixed = 5  // IORING_OP_WRITE_FIXED (5.1)
	uringOpRead       = 22 // IORING_OP_READ (5.6)
	uringOpWrite      = 23 // IORING_OP_WRITE (5.6)

	uringSqeFixedFile = 1 << 0 // IOSQE_FIXED_FILE: sqe.fd is a fixed-file slot

	uringRegisterBuffers     = 0 // IORING_REGISTER_BUFFERS (5.1)
	uringUnregisterBuffers   = 1 // IORING_UNREGISTER_BUFFERS (5.1)
	uringRegisterFiles       = 2 // IORING_REGISTER_FILES (5.1; sparse tables of -1 since 5.5)
	uringRegisterFilesUpdate = 6 // IORING_REGISTER_FILES_UPDATE (5.5)
	uringRegisterProbe       = 8 // IORING_REGISTER_PROBE (5.6)
	uringRegisterEventfd     = 4 // IORING_REGISTER_EVENTFD (5.2)
	uringOpSupported         = 1 << 0

	// uringMaxBufferLen is the kernel's limit on one registered buffer
	// (io_buffer_validate: 1 GiB); a larger region is registered as
	// several buffers.
	uringMaxBufferLen = 1 << 30
	// uringMaxBuffers is IORING_MAX_REG_BUFFERS.
	uringMaxBuffers = 1 << 14

	// uringMaxEntries is the kernel's IORING_MAX_ENTRIES: the largest SQ.
	uringMaxEntries = 32768
	// uringMaxLen is the most one SQE asks for. The kernel moves at most
	// MAX_RW_COUNT (2 GiB less a page) per call anyway; asking for that much,
	// page aligned, keeps an O_DIRECT request aligned. The core sees a short
	// transfer and continues.
	uringMaxLen = math.MaxInt32 &^ 4095
)

// uringFileTableSize is the number of fixed-file slots a ring registers
// (sparse, on first use): enough for the swap files, a checkpoint's files
// and a DeepNVMe-style handle's file per tensor; files past it use their
// descriptors. It is capped by RLIMIT_NOFILE, which the kernel applies to
// the table. A variable so that tests can fill it.
var uringFileTableSize = 1024

// uringSetupTiers are the setup flags tried in order; the kernel rejects
// flags it does not know with EINVAL, and the next tier is tried. The CQ is
// left at the kernel's default of twice the SQ: since at most capacity()
// (the SQ size) operations are ever in flight, the CQ cannot overflow.
//
// No tier defers completion work to io_uring_enter (DEFER_TASKRUN): wait
// parks on an eventfd (parker), which the kernel did not signal for deferred
// work here (6.18), so each wait of such a ring ran to park's deadline.
var uringSetupTiers = []uint32{
	uringSetupSubmitAll | uringSetupSingleIssuer | uringSetupCoopTaskrun | uringSetupTaskrunFlag,
	uringSetupSubmitAll | uringSetupCoopTaskrun | uringSetupTaskrunFlag,
	0,
}

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFd         uint32
	resv         [3]uint32
	sqOff        uringSQOffsets
	cqOff        uringCQOffsets
}

// uringSQOffsets is struct io_sqring_offsets.
type uringSQOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// uringCQOffsets is struct io_cqring_offsets.
type uringCQOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// uringSQE is the 64-byte struct io_uring_sqe, with the unions reduced to
// the members a read or write uses.
type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

// uringCQE is the 16-byte struct io_uring_cqe.
type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// uringProbe is struct io_uring_probe with room for 64 opcodes.
type uringProbe struct {
	lastOp uint8
	opsLen uint8
	resv   uint16
	resv2  [3]uint32
	ops    [64]uringProbeOp
}

// uringProbeOp is struct io_uring_probe_op.
type uringProbeOp struct {
	op    uint8
	resv  uint8
	flags uint16
	resv2 uint32
}

// The layouts must match the kernel's byte for byte.
var (
	_ [unsafe.Sizeof(uringParams{}) - 120]struct{}
	_ [120 - unsafe.Sizeof(uringParams{})]struct{}
	_ [unsafe.Sizeof(uringSQE{}) - 64]struct{}
	_ [64 - unsafe.Sizeof(uringSQE{})]struct{}
	_ [unsafe.Sizeof(uringCQE{}) - 16]struct{}
	_ [16 - unsafe.Sizeof(uringCQE{})]struct{}
	_ [unsafe.Sizeof(uringProbe{}) - (16 + 64*8)]struct{}
)

// uringRing is a ring over one io_uring instance. Tokens index bufs and
// busy; the core assigns them in [0, capacity()).
//
// Memory ordering: the kernel reads the SQ tail and writes the SQ head and
// CQ tail; this side writes the SQ tail and CQ head. Those shared words are
// read and written with sync/atomic, which in Go is sequentially consistent
// and so at least the acquire/release pairing the kernel expects: SQEs are
// filled before the tail store publishes them, and CQEs are read after the
// tail load and before the head store gives their slots back.
type uringRing struct {
	fd         int
	setupFlags uint32 // the tier the kernel accepted
	features   uint32

	sqMem, cqMem, sqeMem []byte // cqMem is nil when it shares sqMem

	sqHead, sqTail, sqFlags *uint32
	sqMask, sqEntries       uint32
	sqes                    []uringSQE
	sqLocalTail             uint32 // next SQE slot; published to *sqTail by submit

	cqHead, cqTail, cqOverflow *uint32
	cqMask                     uint32
	cqes                       []uringCQE
	overflowSeen               uint32

	toSubmit uint32 // prepped, not yet consumed by the kernel
	inflight int    // consumed by the kernel, completion not yet reaped

	// evfd is an eventfd registered with the ring, which the kernel
	// signals when it posts a completion: wait parks on it instead of
	// blocking in io_uring_enter (parker). Where it could not be set up
	// wait blocks in the kernel.
	evfd parker

	// synth holds completions made here for operations that were prepped
	// but withdrawn from the SQ after a fatal submit error partway through
	// a batch; wait hands them out before the kernel's.
	synth []completion

	// bufs holds each in-flight buffer, by token, so the Go memory the
	// kernel is reading or writing stays reachable until its completion
	// is reaped (the SQE holds only a bare address).
	bufs [][]byte
	busy []bool

	// regs are the registered buffers, by index (registerBuffers).
	regs []uringRegBuf
	// fileSlots is the size of the registered fixed-file table (0 until
	// the first registerFile); freeSlots are its empty slots, and
	// fileTableErr is why the table could not be registered.
	fileSlots    int
	freeSlots    []int32
	fileTableErr error
	// fdArg is the one-entry fd array IORING_REGISTER_FILES_UPDATE reads
	// through an address stored as an integer (io_uring_files_update.fds):
	// a field of the ring, which lives on the heap, so that the address
	// cannot go stale the way a stack variable's can when the stack moves.
	fdArg [1]int32

	closed bool
}

// uringRegBuf is one registered buffer: the addresses [base, end).
type uringRegBuf struct{ base, end uintptr }

// uringIovec is struct iovec.
type uringIovec struct {
	base uintptr
	len  uint64
}

// uringFilesUpdate is struct io_uring_files_update.
type uringFilesUpdate struct {
	offset uint32
	resv   uint32
	fds    uint64 // __s32 * as __aligned_u64
}

// uringRegisterFn is io_uring_register; tests replace it to make a
// registration fail as a small memlock limit or an old kernel would.
var uringRegisterFn = func(fd int, opcode uintptr, arg unsafe.Pointer, n int) (int, unix.Errno) {
	r, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), opcode, uintptr(arg), uintptr(n), 0, 0)
	return int(r), errno
}

var _ ring = (*uringRing)(nil)

// newUringRing creates an io_uring with at least entries SQ entries
// (rounded up to a power of two, at most 32768) and a CQ twice that. It
// tries IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN first and falls back to
// plainer setups when the kernel rejects the flags; the caller's goroutine
// must hold runtime.LockOSThread for the ring's life (see
// uringNeedsLockedThread).
func newUringRing(entries int) (ring, error) {
	return openUring(entries, uringSetupTiers)
}

// openUring sets up a ring with the first tier of flags the kernel accepts.
func openUring(entries int, tiers []uint32) (*uringRing, error) {
	if entries < 1 || entries > uringMaxEntries {
		return nil, fmt.Errorf("aio: io_uring with %d entries: %w (allowed: 1 to %d)", entries, unix.EINVAL, uringMaxEntries)
	}
	var (
		p     uringParams
		fd    int
		errno unix.Errno
	)
	for _, flags := range tiers {
		p = uringParams{flags: flags}
		fd, errno = uringSetup(uint32(entries), &p)
		if errno != unix.EINVAL {
			break
		}
	}
	if errno != 0 {
		err := fmt.Errorf("aio: io_uring_setup(entries=%d): %w", entries, errno)
		if errno == unix.ENOSYS || errno == unix.EPERM {
			err = fmt.Errorf("%w: %w (%s)", ErrUnavailable, err, explainSetupErrno(errno, os.ReadFile))
		}
		return nil, err
	}
	r := &uringRing{fd: fd, setupFlags: p.flags, features: p.features}
	if err := r.mapRings(&p); err != nil {
		r.release()
		return nil, err
	}
	r.evfd = uringEventfd(fd)
	return r, nil
}

// uringEventfd registers a new eventfd with ring fd (parker).
func uringEventfd(fd int) parker {
	return newParker(func(efd int) error {
		arg := int32(efd)
		if _, errno := uringRegisterFn(fd, uringRegisterEventfd, unsafe.Pointer(&arg), 1); errno != 0 {
			return errno
		}
		return nil
	})
}

func uringSetup(entries uint32, p *uringParams) (int, unix.Errno) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), 0 // the kernel opens ring fds close-on-exec
}

// mapRings maps the SQ ring, the CQ ring and the SQE array and points the
// ring's fields at the shared words.
func (r *uringRing) mapRings(p *uringParams) error {
	const prot = unix.PROT_READ | unix.PROT_WRITE
	const flags = unix.MAP_SHARED | unix.MAP_POPULATE
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.cqEntries)*int(unsafe.Sizeof(uringCQE{}))
	single := p.features&uringFeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqMem, err = unix.Mmap(r.fd, uringOffSQRing, sqSize, prot, flags); err != nil {
		return fmt.Errorf("aio: io_uring mmap of SQ ring (%d bytes): %w", sqSize, err)
	}
	cqMem := r.sqMem
	if !single {
		if r.cqMem, err = unix.Mmap(r.fd, uringOffCQRing, cqSize, prot, flags); err != nil {
			return fmt.Errorf("aio: io_uring mmap of CQ ring (%d bytes): %w", cqSize, err)
		}
		cqMem = r.cqMem
	}
	sqeSize := int(p.sqEntries) * int(unsafe.Sizeof(uringSQE{}))
	if r.sqeMem, err = unix.Mmap(r.fd, uringOffSQEs, sqeSize, prot, flags); err != nil {
		return fmt.Errorf("aio: io_uring mmap of SQEs (%d bytes): %w", sqeSize, err)
	}

	word := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead = word(r.sqMem, p.sqOff.head)
	r.sqTail = word(r.sqMem, p.sqOff.tail)
	r.sqFlags = word(r.sqMem, p.sqOff.flags)
	r.sqMask = *word(r.sqMem, p.sqOff.ringMask)
	r.sqEntries = *word(r.sqMem, p.sqOff.ringEntries)
	r.sqes = unsafe.Slice((*uringSQE)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	r.sqLocalTail = atomic.LoadUint32(r.sqTail)
	// SQ slot i always names SQE i, so the indirection array is written
	// once here and never again.
	array := unsafe.Slice(word(r.sqMem, p.sqOff.array), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}

	r.cqHead = word(cqMem, p.cqOff.head)
	r.cqTail = word(cqMem, p.cqOff.tail)
	r.cqOverflow = word(cqMem, p.cqOff.overflow)
	r.cqMask = *word(cqMem, p.cqOff.ringMask)
	r.cqes = unsafe.Slice((*uringCQE)(unsafe.Pointer(&cqMem[p.cqOff.cqes])), p.cqEntries)
	r.overflowSeen = atomic.LoadUint32(r.cqOverflow)

	r.bufs = make([][]byte, r.sqEntries)
	r.busy = make([]bool, r.sqEntries)
	r.synth = make([]completion, 0, r.sqEntries)
	return nil
}

// capacity is the SQ size: the requested entries rounded up to a power of
// two. Tokens are 0..capacity()-1.
func (r *uringRing) capacity() int { return int(r.sqEntries) }

// prep writes one SQE. It panics on a broken core invariant (a token out of
// range or already in flight, more than capacity() operations, a closed
// ring): continuing would hand the kernel a buffer the core may reuse.
func (r *uringRing) prep(op Op, t target, buf []byte, off int64, token uint32) {
	if r.closed {
		panic("aio: uring prep on a closed ring")
	}
	if token >= r.sqEntries || r.busy[token] {
		panic(fmt.Sprintf("aio: uring prep with token %d: out of range or in flight (capacity %d)", token, r.sqEntries))
	}
	if r.sqLocalTail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		panic("aio: uring prep with the submission queue full")
	}
	n := len(buf)
	if n > uringMaxLen {
		n = uringMaxLen
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	sqe := uringSQE{fd: int32(t.fd), off: uint64(off), addr: uint64(addr), len: uint32(n), userData: uint64(token)}
	if t.slot >= 0 {
		sqe.fd = t.slot
		sqe.flags = uringSqeFixedFile
	}
	if i := r.regIndex(addr, n); i >= 0 {
		sqe.opcode, sqe.bufIndex = uringOpReadFixed, uint16(i)
		if op == OpWrite {
			sqe.opcode = uringOpWriteFixed
		}
	} else {
		sqe.opcode = uringOpRead
		if op == OpWrite {
			sqe.opcode = uringOpWrite
		}
	}
	r.bufs[token] = buf
	r.busy[token] = true
	r.sqes[r.sqLocalTail&r.sqMask] = sqe
	r.sqLocalTail++
	r.toSubmit++
}

// fixedBuffer implements ring.
func (r *uringRing) fixedBuffer(buf []byte) bool {
	return r.regIndex(uintptr(unsafe.Pointer(unsafe.SliceData(buf))), min(len(buf), uringMaxLen)) >= 0
}

// regIndex returns the index of the registered buffer holding all of
// [addr, addr+n), or -1.
func (r *uringRing) regIndex(addr uintptr, n int) int {
	for i, rb := range r.regs {
		if addr >= rb.base && addr < rb.end {
			if uintptr(n) <= rb.end-addr {
				return i
			}
			return -1 // straddles the end: move it as it is
		}
	}
	return -1
}

// registerBuffers implements ring: it unregisters the current set, then
// registers regions, each split into pieces of at most 1 GiB.
func (r *uringRing) registerBuffers(regions [][]byte) error {
	if r.closed {
		return ErrClosed
	}
	if len(r.regs) > 0 {
		r.regs = nil
		if _, errno := uringRegisterFn(r.fd, uringUnregisterBuffers, nil, 0); errno != 0 {
			return fmt.Errorf("IORING_UNREGISTER_BUFFERS: %w", errno)
		}
	}
	var iov []uringIovec
	var regs []uringRegBuf
	var total int64
	for _, mem := range regions {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
		for off := 0; off < len(mem); off += uringMaxBufferLen {
			n := min(len(mem)-off, uringMaxBufferLen)
			iov = append(iov, uringIovec{base: base + uintptr(off), len: uint64(n)})
			regs = append(regs, uringRegBuf{base: base + uintptr(off), end: base + uintptr(off+n)})
			total += int64(n)
		}
	}
	if len(iov) == 0 {
		return nil
	}
	if len(iov) > uringMaxBuffers {
		return fmt.Errorf("IORING_REGISTER_BUFFERS: %d buffers of at most 1 GiB needed, the kernel takes at most %d", len(iov), uringMaxBuffers)
	}
	_, errno := uringRegisterFn(r.fd, uringRegisterBuffers, unsafe.Pointer(&iov[0]), len(iov))
	runtime.KeepAlive(iov)
	if errno != 0 {
		return fmt.Errorf("IORING_REGISTER_BUFFERS of %d bytes in %d buffers: %w (%s)", total, len(iov), errno, explainRegisterErrno(errno))
	}
	r.regs = regs
	return nil
}

// explainRegisterErrno says why IORING_REGISTER_BUFFERS may have failed.
func explainRegisterErrno(errno unix.Errno) string {
	switch errno {
	case unix.ENOMEM:
		return "registered buffers are pinned and count against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK: raise the memlock limit (ulimit -l unlimited, LimitMEMLOCK=infinity, --ulimit memlock=-1) or grant CAP_IPC_LOCK"
	case unix.EFAULT:
		return "the memory is not anonymous or not mapped"
	case unix.EOPNOTSUPP:
		return "the memory is file-backed, which io_uring does not register"
	case unix.EINVAL:
		return "the kernel refused the buffer table"
	}
	return errno.Error()
}

// registerFile implements ring. The sparse table is registered on first
// use; a kernel that refuses it leaves the ring without fixed files.
func (r *uringRing) registerFile(fd int) (int32, error) {
	if r.closed {
		return -1, ErrClosed
	}
	if r.fileTableErr != nil {
		return -1, r.fileTableErr
	}
	if r.fileSlots == 0 {
		if err := r.registerFileTable(); err != nil {
			r.fileTableErr = err
			return -1, err
		}
	}
	if len(r.freeSlots) == 0 {
		return -1, fmt.Errorf("the fixed-file table's %d slots are all in use", r.fileSlots)
	}
	slot := r.freeSlots[len(r.freeSlots)-1]
	if err := r.updateFile(slot, int32(fd)); err != nil {
		return -1, err
	}
	r.freeSlots = r.freeSlots[:len(r.freeSlots)-1]
	return slot, nil
}

// registerFileTable registers an empty (sparse) fixed-file table.
func (r *uringRing) registerFileTable() error {
	n := uringFileTableSize
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(n) {
		n = int(lim.Cur)
	}
	if n < 1 {
		return errors.New("RLIMIT_NOFILE leaves no room for a fixed-file table")
	}
	fds := make([]int32, n)
	for i := range fds {
		fds[i] = -1
	}
	_, errno := uringRegisterFn(r.fd, uringRegisterFiles, unsafe.Pointer(&fds[0]), n)
	runtime.KeepAlive(fds)
	if errno != 0 {
		return fmt.Errorf("IORING_REGISTER_FILES of a sparse table of %d slots: %w", n, errno)
	}
	r.fileSlots = n
	r.freeSlots = make([]int32, n)
	for i := range r.freeSlots {
		r.freeSlots[i] = int32(n - 1 - i)
	}
	return nil
}

// updateFile puts fd (-1: none) in slot.
func (r *uringRing) updateFile(slot, fd int32) error {
	r.fdArg[0] = fd
	up := uringFilesUpdate{offset: uint32(slot), fds: uint64(uintptr(unsafe.Pointer(&r.fdArg[0])))}
	n, errno := uringRegisterFn(r.fd, uringRegisterFilesUpdate, unsafe.Pointer(&up), 1)
	runtime.KeepAlive(r)
	switch {
	case errno != 0:
		return fmt.Errorf("IORING_REGISTER_FILES_UPDATE of slot %d: %w", slot, errno)
	case n != 1:
		return fmt.Errorf("IORING_REGISTER_FILES_UPDATE of slot %d updated %d slots", slot, n)
	}
	return nil
}

// unregisterFile implements ring.
func (r *uringRing) unregisterFile(slot int32) error {
	if r.closed {
		return ErrClosed
	}
	if slot < 0 || int(slot) >= r.fileSlots {
		return fmt.Errorf("fixed-file slot %d out of range (table of %d)", slot, r.fileSlots)
	}
	if err := r.updateFile(slot, -1); err != nil {
		return err
	}
	r.freeSlots = append(r.freeSlots, slot)
	return nil
}

// submit hands every prepped SQE to the kernel with io_uring_enter. EINTR
// is retried at once. EAGAIN (the kernel is short of memory for requests)
// and EBUSY (completions are backed up) are retried after letting one
// in-flight operation complete; the completions stay in the CQ for wait,
// which the core calls next. Only if that keeps failing, or on any other
// error, does submit give up:
//
//   - if the kernel accepted none of the SQEs prepped since the last
//     successful submit, they are withdrawn from the SQ (they will never
//     run) and the error is returned, so the core can fail them;
//   - if it accepted some, the rest are withdrawn and each gets a
//     completion carrying the negated errno, returned by the next wait, and
//     submit returns nil: every prepped operation yields exactly one
//     completion, and the core never fails an operation the kernel is still
//     running.
func (r *uringRing) submit() error {
	if r.closed {
		return ErrClosed
	}
	return r.submitBatch(false)
}

// submitBatch is submit; with synthesize, a failure before any SQE was
// accepted is also turned into completions instead of an error.
func (r *uringRing) submitBatch(synthesize bool) error {
	accepted := synthesize
	backoffs := 0
	for r.toSubmit > 0 {
		atomic.StoreUint32(r.sqTail, r.sqLocalTail)
		n, errno := r.enter(r.toSubmit, 0, 0)
		if errno == 0 {
			if n > 0 {
				accepted = true
				r.toSubmit -= uint32(n)
				r.inflight += n
				backoffs = 0
				continue
			}
			errno = unix.EAGAIN // nothing consumed and no error: treat as transient
		}
		switch {
		case errno == unix.EINTR:
			continue
		case (errno == unix.EAGAIN || errno == unix.EBUSY) && backoffs < 100:
			backoffs++
			if errno := r.letOneComplete(backoffs); errno != 0 && errno != unix.EINTR {
				return r.abandonBatch(accepted, errno)
			}
			continue
		}
		return r.abandonBatch(accepted, errno)
	}
	return nil
}

// letOneComplete waits for one more completion than the CQ already holds
// (reaping nothing), or sleeps briefly when nothing more can complete.
func (r *uringRing) letOneComplete(attempt int) unix.Errno {
	ready := atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
	if int(ready) >= r.inflight {
		// Nothing more will complete: give the kernel a moment instead.
		time.Sleep(time.Duration(attempt) * 100 * time.Microsecond)
		return 0
	}
	_, errno := r.enter(0, ready+1, uringEnterGetEvents)
	return errno
}

// abandonBatch withdraws the SQEs the kernel has not consumed (it reads the
// SQ only inside io_uring_enter, so rewinding the tail is safe) and reports
// errno as submit's doc describes.
func (r *uringRing) abandonBatch(accepted bool, errno unix.Errno) error {
	head := atomic.LoadUint32(r.sqHead)
	for i := head; i != r.sqLocalTail; i++ {
		tok := uint32(r.sqes[i&r.sqMask].userData)
		r.bufs[tok] = nil
		r.busy[tok] = false
		if accepted {
			r.synth = append(r.synth, completion{token: tok, res: -int32(errno)})
		}
	}
	r.sqLocalTail = head
	atomic.StoreUint32(r.sqTail, head)
	r.toSubmit = 0
	if accepted {
		return nil
	}
	return r.enterError("submit", errno)
}

// wait reaps up to len(out) completions, waiting until at least
// minComplete have arrived: parked on the ring's eventfd (parker), or, where
// there is none, blocked in io_uring_enter with IORING_ENTER_GETEVENTS. It never
// blocks for more completions than there are operations outstanding
// (minComplete is clamped to that, and to len(out)). With minComplete == 0
// (a poll) it enters the kernel only
// when the kernel flags completion work or overflowed CQEs waiting (with
// DEFER_TASKRUN, finished I/O becomes a CQE only inside io_uring_enter).
// Operations still prepped but not submitted are submitted first.
func (r *uringRing) wait(minComplete int, out []completion) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	if r.toSubmit > 0 {
		// The core submits before it waits; should it not, a failure here
		// must still produce completions, as wait cannot return the
		// operations unaccepted.
		_ = r.submitBatch(true)
	}
	need := max(0, min(minComplete, len(out), r.inflight+len(r.synth)))
	n := copy(out, r.synth)
	r.synth = r.synth[:copy(r.synth, r.synth[n:])]
	got, err := r.reap(out[n:])
	n += got
	if err != nil {
		return n, err
	}
	if n == len(out) || (n >= need && atomic.LoadUint32(r.sqFlags)&(uringSQTaskrun|uringSQCQOverflow) == 0) {
		return n, nil
	}
	for parks := 0; ; {
		want := uint32(0)
		if n < need {
			want = uint32(need - n)
		}
		// With an eventfd, enter only runs the completion work the kernel
		// holds for this task without waiting, and the wait is a park on
		// the eventfd (parker says why), up to parkRounds of them.
		// Before a park the kernel is entered only where it flags
		// completion work or overflowed CQEs waiting, as the poll above
		// does: otherwise the eventfd already says when there is more.
		parking := want > 0 && r.evfd.ok() && parks < parkRounds
		if !parking || atomic.LoadUint32(r.sqFlags)&(uringSQTaskrun|uringSQCQOverflow) != 0 {
			if parking {
				want = 0
			}
			_, errno := r.enter(0, want, uringEnterGetEvents)
			if errno != 0 && errno != unix.EINTR && errno != unix.EAGAIN {
				return n, r.enterError("wait", errno)
			}
		}
		got, err := r.reap(out[n:])
		n += got
		if err != nil || n >= need {
			return n, err
		}
		if parking {
			r.evfd.park()
			parks++
		}
	}
}

// reap copies the CQEs the kernel has posted into out and gives their slots
// back.
func (r *uringRing) reap(out []completion) (int, error) {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	var bad error
	for ; head != tail && n < len(out); head++ {
		c := &r.cqes[head&r.cqMask]
		if c.userData >= uint64(r.sqEntries) || !r.busy[c.userData] {
			// Not ours (or already reaped): discard it and say so; the
			// core logs it and carries on.
			bad = &strayError{backend: BackendUring, token: c.userData}
			continue
		}
		tok := uint32(c.userData)
		out[n] = completion{token: tok, res: c.res}
		r.bufs[tok] = nil
		r.busy[tok] = false
		r.inflight--
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	// With IORING_FEAT_NODROP (5.5+) the kernel keeps CQEs that do not fit
	// in an overflow list and flushes them on GETEVENTS (wait enters the
	// kernel whenever IORING_SQ_CQ_OVERFLOW is flagged); it only counts one
	// as dropped when it could not even allocate that. A dropped
	// completion's operation has finished but will never be reaped: it no
	// longer counts as in flight (so close does not wait for it), and the
	// core, told how many were lost, fails them once the rest are in and
	// replaces the ring, whose busy tokens still include them.
	if ov := atomic.LoadUint32(r.cqOverflow); ov != r.overflowSeen {
		dropped := int(ov - r.overflowSeen)
		r.overflowSeen = ov
		r.inflight = max(0, r.inflight-dropped)
		return n, errors.Join(bad, &lostError{backend: BackendUring, n: dropped})
	}
	if bad != nil {
		return n, bad
	}
	return n, nil
}

// enter is io_uring_enter without a signal mask.
func (r *uringRing) enter(toSubmit, minComplete, flags uint32) (int, unix.Errno) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
	return int(n), errno
}

func (r *uringRing) enterError(what string, errno unix.Errno) error {
	if errno == unix.EEXIST && r.setupFlags&uringSetupSingleIssuer != 0 {
		return fmt.Errorf("aio: io_uring_enter (%s): %w: the ring was entered from an OS thread other than the one that created it; with IORING_SETUP_SINGLE_ISSUER the goroutine driving it must hold runtime.LockOSThread", what, errno)
	}
	return fmt.Errorf("aio: io_uring_enter (%s): %w", what, errno)
}

// close waits for any operation still in flight (the contract says there
// is none, but the kernel must not write into memory that is then reused),
// then unmaps the rings and closes the ring fd. If the wait fails the ring
// is left open and the error returned: releasing it could free buffers the
// kernel still writes. A second close returns nil.
func (r *uringRing) close() error {
	if r.closed {
		return nil
	}
	r.abandonBatchQuiet()
	r.synth = r.synth[:0]
	var scratch [64]completion
	for r.inflight > 0 {
		_, err := r.wait(r.inflight, scratch[:])
		var se *strayError
		var le *lostError
		if err != nil && !errors.As(err, &se) && !errors.As(err, &le) {
			// Stray and lost completions only change what is counted as in
			// flight; anything else means the ring cannot be drained.
			return fmt.Errorf("aio: io_uring close with %d operations in flight: %w", r.inflight, err)
		}
	}
	r.closed = true
	return r.release()
}

// abandonBatchQuiet withdraws prepped, unsubmitted SQEs without reporting.
func (r *uringRing) abandonBatchQuiet() {
	if r.toSubmit > 0 && r.sqHead != nil {
		_ = r.abandonBatch(false, 0)
	}
}

// release unmaps whatever was mapped and closes the fd.
func (r *uringRing) release() error {
	var errs []error
	r.evfd.drop()
	for _, m := range []*[]byte{&r.sqeMem, &r.cqMem, &r.sqMem} {
		if *m != nil {
			if err := unix.Munmap(*m); err != nil {
				errs = append(errs, fmt.Errorf("aio: io_uring munmap: %w", err))
			}
			*m = nil
		}
	}
	r.sqHead, r.sqTail, r.sqFlags, r.sqes = nil, nil, nil, nil
	r.cqHead, r.cqTail, r.cqOverflow, r.cqes = nil, nil, nil, nil
	r.bufs, r.busy = nil, nil
	if r.fd >= 0 {
		if err := unix.Close(r.fd); err != nil {
			errs = append(errs, fmt.Errorf("aio: io_uring close: %w", err))
		}
		r.fd = -1
	}
	r.closed = true
	return errors.Join(errs...)
}

// uringAvailable reports whether io_uring works here: nil, or an error
// wrapping ErrUnavailable (and the errno, where there is one) that says why.
// It sets up a small ring, asks the kernel whether IORING_OP_READ and
// IORING_OP_WRITE are supported, and moves a few bytes through a pipe with
// each, which also catches sandboxes (gVisor, seccomp) that accept
// io_uring_setup but not real work. The answer is computed once.
func uringAvailable() error { return uringAvailableOnce() }

var uringAvailableOnce = sync.OnceValue(probeUring)

func probeUring() error {
	// The probe ring may use SINGLE_ISSUER: keep this goroutine on one
	// thread while it lives. LockOSThread nests, so a caller's own lock
	// survives.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	unavailable := func(format string, args ...any) error {
		return fmt.Errorf("%w: io_uring: %w", ErrUnavailable, fmt.Errorf(format, args...))
	}
	r, err := openUring(4, uringSetupTiers)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer r.close()

	var probe uringProbe
	errno := retryEINTR(func() unix.Errno {
		_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uringRegisterProbe,
			uintptr(unsafe.Pointer(&probe)), uintptr(len(probe.ops)), 0, 0)
		return e
	})
	switch {
	case errno == unix.EINVAL:
		return unavailable("the kernel cannot list its opcodes (IORING_REGISTER_PROBE: %w); IORING_OP_READ/WRITE need Linux 5.6", errno)
	case errno != 0:
		return unavailable("IORING_REGISTER_PROBE: %w", errno)
	}
	for _, op := range [...]struct {
		code uint8
		name string
	}{{uringOpRead, "IORING_OP_READ"}, {uringOpWrite, "IORING_OP_WRITE"},
		{uringOpReadFixed, "IORING_OP_READ_FIXED"}, {uringOpWriteFixed, "IORING_OP_WRITE_FIXED"}} {
		if op.code > probe.lastOp || probe.ops[op.code].flags&uringOpSupported == 0 {
			return unavailable("%s (opcode %d) is not supported by this kernel", op.name, op.code)
		}
	}

	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return unavailable("pipe for the self-test: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	msg := []byte("zinf io_uring probe")
	got := make([]byte, len(msg))
	var comps [1]completion
	roundTrip := func(op Op, fd int, buf []byte) error {
		r.prep(op, fdTarget(fd), buf, -1, 0)
		if err := r.submit(); err != nil {
			return err
		}
		n, err := r.wait(1, comps[:])
		switch {
		case err != nil:
			return err
		case n != 1:
			return fmt.Errorf("%d completions, want 1", n)
		case comps[0].res < 0:
			return unix.Errno(-comps[0].res)
		case int(comps[0].res) != len(buf):
			return fmt.Errorf("moved %d bytes, want %d", comps[0].res, len(buf))
		}
		return nil
	}
	if err := roundTrip(OpWrite, p[1], msg); err != nil {
		return unavailable("self-test IORING_OP_WRITE to a pipe: %w", err)
	}
	if _, err := unix.Read(p[0], got); err != nil || !bytes.Equal(got, msg) {
		return unavailable("self-test IORING_OP_WRITE: pipe holds %q, want %q (%v)", got, msg, err)
	}
	clear(got)
	if _, err := unix.Write(p[1], msg); err != nil {
		return unavailable("self-test pipe write: %w", err)
	}
	if err := roundTrip(OpRead, p[0], got); err != nil {
		return unavailable("self-test IORING_OP_READ from a pipe: %w", err)
	}
	if !bytes.Equal(got, msg) {
		return unavailable("self-test IORING_OP_READ got %q, want %q", got, msg)
	}
	return nil
}

// explainSetupErrno says why io_uring_setup may have failed with errno,
// reading the sysctl and seccomp state through readFile.
func explainSetupErrno(errno unix.Errno, readFile func(string) ([]byte, error)) string {
	sysctl := func(name string) string {
		b, err := readFile("/proc/sys/kernel/" + name)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	seccomp := func() bool {
		b, err := readFile("/proc/self/status")
		if err != nil {
			return false
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Seccomp:"); ok {
				return strings.TrimSpace(v) != "0"
			}
		}
		return false
	}
	switch errno {
	case unix.ENOSYS:
		if seccomp() {
			return "the kernel lacks io_uring, or a seccomp filter (active for this process) hides it"
		}
		return "the kernel was built without io_uring (CONFIG_IO_URING) or predates Linux 5.1"
	case unix.EPERM:
		switch sysctl("io_uring_disabled") {
		case "2":
			return "io_uring is disabled for everyone: sysctl kernel.io_uring_disabled=2 (set it to 0 to allow)"
		case "1":
			return fmt.Sprintf("sysctl kernel.io_uring_disabled=1 allows io_uring only to root and to group kernel.io_uring_group=%s; this process is in neither", sysctl("io_uring_group"))
		}
		if seccomp() {
			return "denied by the seccomp filter active for this process (containers often block io_uring)"
		}
		return "denied by a security module or seccomp filter"
	}
	return errno.Error()
}
