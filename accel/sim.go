package accel

import (
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// DefaultSimCapacityBytes is the capacity of a Sim whose options leave it
// zero: 1 GiB, small enough for CI machines, large enough for the examples.
const DefaultSimCapacityBytes = 1 << 30

// SimOptions configure a simulated device. The zero value is usable.
type SimOptions struct {
	// CapacityBytes is the simulated device memory. Default 1 GiB.
	CapacityBytes int64
	// BandwidthBytesPerSec models the host<->device link (PCIe): a copy of
	// n bytes occupies its direction of the link for n/bandwidth seconds,
	// shared by every stream of the device; the two directions are
	// independent, as on a full-duplex link. Default 0: unlimited.
	BandwidthBytesPerSec float64
	// Name is returned by Name. Default "sim".
	Name string
	// CopyFault, when set, is called by a stream's worker before each copy
	// runs; a non-nil error fails that copy (no bytes move) and is returned
	// by the stream's next Synchronize. Tests use it; nil in production.
	CopyFault func(c SimCopy) error
}

// SimCopy describes one asynchronous copy, for SimOptions.CopyFault.
type SimCopy struct {
	ToDevice bool  // host to device (else device to host)
	Offset   int64 // offset in the device allocation
	Len      int64 // bytes
}

// Sim is a simulated GPU: device memory is host memory under a capacity
// budget, and copies run asynchronously, in issue order per stream, on one
// goroutine per stream. It implements Device and is safe for concurrent
// use.
//
// Allocations come from anonymous mmap where the platform has it, outside
// the Go heap, so the process's resident memory counts them honestly and
// Free returns them to the system.
type Sim struct {
	opts SimOptions

	mu       sync.Mutex
	closed   bool
	used     int64
	mems     map[*simMem]struct{}
	streams  map[*simStream]struct{}
	hostRegs map[uintptr]int // start address -> length

	linkMu sync.Mutex
	link   [2]time.Time // when each direction of the link is next free
}

var _ Device = (*Sim)(nil)

// NewSim creates a simulated device.
func NewSim(opts SimOptions) (*Sim, error) {
	if opts.CapacityBytes < 0 {
		return nil, fmt.Errorf("accel: sim capacity %d bytes is negative: %w", opts.CapacityBytes, ErrInvalid)
	}
	if opts.BandwidthBytesPerSec < 0 {
		return nil, fmt.Errorf("accel: sim bandwidth %g bytes/s is negative: %w", opts.BandwidthBytesPerSec, ErrInvalid)
	}
	if opts.CapacityBytes == 0 {
		opts.CapacityBytes = DefaultSimCapacityBytes
	}
	if opts.Name == "" {
		opts.Name = "sim"
	}
	return &Sim{
		opts:     opts,
		mems:     make(map[*simMem]struct{}),
		streams:  make(map[*simStream]struct{}),
		hostRegs: make(map[uintptr]int),
	}, nil
}

// simMem is one Sim allocation.
type simMem struct {
	size int64
	data []byte

	// Guarded by Sim.mu.
	freed bool
	refs  int // copies queued or running on the memory
}

func (m *simMem) Size() int64 { return m.size }

// Name returns the name from the options ("sim" by default).
func (s *Sim) Name() string { return s.opts.Name }

// CapacityBytes returns the simulated memory size.
func (s *Sim) CapacityBytes() int64 { return s.opts.CapacityBytes }

// UsedBytes returns the bytes currently allocated.
func (s *Sim) UsedBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Alloc allocates size bytes, zeroed. It fails with ErrOutOfMemory when the
// allocation would exceed the capacity.
func (s *Sim) Alloc(size int64) (Mem, error) {
	if size <= 0 {
		return nil, fmt.Errorf("accel: %s: alloc of %d bytes: %w", s.opts.Name, size, ErrInvalid)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("accel: %s: alloc: %w", s.opts.Name, ErrClosed)
	}
	if size > s.opts.CapacityBytes-s.used {
		used := s.used
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s: requested %d bytes, %d of %d in use",
			ErrOutOfMemory, s.opts.Name, size, used, s.opts.CapacityBytes)
	}
	// Reserve before mapping so concurrent Allocs cannot overshoot.
	s.used += size
	s.mu.Unlock()

	data, err := simMap(size)
	if err != nil {
		s.mu.Lock()
		s.used -= size
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s: mapping %d bytes of host memory: %v", ErrOutOfMemory, s.opts.Name, size, err)
	}
	m := &simMem{size: size, data: data}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // closed while mapping
		s.used -= size
		simUnmap(data)
		return nil, fmt.Errorf("accel: %s: alloc: %w", s.opts.Name, ErrClosed)
	}
	s.mems[m] = struct{}{}
	return m, nil
}

// lookup returns m as this device's live allocation. s.mu must be held.
func (s *Sim) lookup(m Mem, op string) (*simMem, error) {
	if s.closed {
		return nil, fmt.Errorf("accel: %s: %s: %w", s.opts.Name, op, ErrClosed)
	}
	sm, ok := m.(*simMem)
	if !ok || sm == nil {
		return nil, fmt.Errorf("accel: %s: %s: memory %T was not allocated by a sim device: %w", s.opts.Name, op, m, ErrInvalid)
	}
	if sm.freed {
		return nil, fmt.Errorf("accel: %s: %s: memory (%d bytes) was already freed: %w", s.opts.Name, op, sm.size, ErrInvalid)
	}
	if _, ok := s.mems[sm]; !ok {
		return nil, fmt.Errorf("accel: %s: %s: memory was allocated by another device: %w", s.opts.Name, op, ErrInvalid)
	}
	return sm, nil
}

// Free releases m. Its capacity is available again at once; the host memory
// is unmapped when the last copy queued on it has run. Freeing twice returns
// an error matching ErrInvalid.
func (s *Sim) Free(m Mem) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sm, err := s.lookup(m, "free")
	if err != nil {
		return err
	}
	sm.freed = true
	delete(s.mems, sm)
	s.used -= sm.size
	if sm.refs == 0 {
		simUnmap(sm.data)
		sm.data = nil
	}
	return nil
}

// HostView returns the host bytes backing m, for tests and diagnostics. The
// slice is valid until m is freed or the device closed; reading it while a
// copy on m is in flight is a data race.
func (s *Sim) HostView(m Mem) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sm, err := s.lookup(m, "host view")
	if err != nil {
		return nil, err
	}
	return sm.data, nil
}

// NewStream creates a stream served by its own goroutine.
func (s *Sim) NewStream() (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("accel: %s: new stream: %w", s.opts.Name, ErrClosed)
	}
	st := &simStream{sim: s, exited: make(chan struct{})}
	st.cond = sync.NewCond(&st.mu)
	s.streams[st] = struct{}{}
	go st.run()
	return st, nil
}

// CopyToDevice queues a copy of src into dst at dstOff on stream st.
func (s *Sim) CopyToDevice(st Stream, dst Mem, dstOff int64, src []byte) error {
	return s.enqueue(st, simOp{toDevice: true, off: dstOff, host: src}, dst)
}

// CopyFromDevice queues a copy of len(dst) bytes of src at srcOff into dst on
// stream st.
func (s *Sim) CopyFromDevice(st Stream, dst []byte, src Mem, srcOff int64) error {
	return s.enqueue(st, simOp{off: srcOff, host: dst}, src)
}

func (s *Sim) enqueue(st Stream, op simOp, m Mem) error {
	what := "copy to device"
	if !op.toDevice {
		what = "copy from device"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sm, err := s.lookup(m, what)
	if err != nil {
		return err
	}
	ss, ok := st.(*simStream)
	if !ok || ss == nil || ss.sim != s {
		return fmt.Errorf("accel: %s: %s: stream %T was not created by this device: %w", s.opts.Name, what, st, ErrInvalid)
	}
	n := int64(len(op.host))
	if op.off < 0 || op.off > sm.size || n > sm.size-op.off {
		return fmt.Errorf("%w: %s: %s of %d bytes at offset %d of a %d-byte allocation",
			ErrBounds, s.opts.Name, what, n, op.off, sm.size)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return fmt.Errorf("accel: %s: %s: stream: %w", s.opts.Name, what, ErrClosed)
	}
	if n == 0 {
		return nil
	}
	sm.refs++
	op.mem = sm
	ss.queue = append(ss.queue, op)
	ss.pending++
	ss.cond.Broadcast()
	return nil
}

// RegisterHost records that b is registered. It moves nothing; it fails, as
// CUDA does, when b (by start address) is already registered.
func (s *Sim) RegisterHost(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("accel: %s: register host: empty buffer: %w", s.opts.Name, ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("accel: %s: register host: %w", s.opts.Name, ErrClosed)
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	if _, ok := s.hostRegs[p]; ok {
		return fmt.Errorf("accel: %s: register host: %#x is already registered: %w", s.opts.Name, p, ErrInvalid)
	}
	s.hostRegs[p] = len(b)
	return nil
}

// UnregisterHost undoes RegisterHost; it fails when b was not registered.
func (s *Sim) UnregisterHost(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("accel: %s: unregister host: empty buffer: %w", s.opts.Name, ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("accel: %s: unregister host: %w", s.opts.Name, ErrClosed)
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	if _, ok := s.hostRegs[p]; !ok {
		return fmt.Errorf("accel: %s: unregister host: %#x is not registered: %w", s.opts.Name, p, ErrInvalid)
	}
	delete(s.hostRegs, p)
	return nil
}

// HostRegistrations returns how many host buffers are registered, for leak
// checks in tests.
func (s *Sim) HostRegistrations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.hostRegs)
}

// Close drains and closes every stream, then frees every allocation. Later
// calls fail with ErrClosed. Close is idempotent and returns the first
// error a drained stream reported.
func (s *Sim) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	streams := make([]*simStream, 0, len(s.streams))
	for st := range s.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()

	var first error
	for _, st := range streams {
		if err := st.Close(); err != nil && first == nil {
			first = err
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for m := range s.mems {
		// Every stream has drained, so no copy holds a reference.
		m.freed = true
		simUnmap(m.data)
		m.data = nil
	}
	clear(s.mems)
	clear(s.hostRegs)
	s.used = 0
	return first
}

// simOp is one queued copy.
type simOp struct {
	toDevice bool
	mem      *simMem
	off      int64
	host     []byte
}

// simStream runs its copies in order on one goroutine.
type simStream struct {
	sim    *Sim
	exited chan struct{}

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []simOp // queue[head:] waits to run; reused once drained
	head    int
	pending int   // queued or running
	err     error // first error since the last Synchronize
	closed  bool
}

var _ Stream = (*simStream)(nil)

func (st *simStream) run() {
	defer close(st.exited)
	for {
		st.mu.Lock()
		for st.head == len(st.queue) && !st.closed {
			st.cond.Wait()
		}
		if st.head == len(st.queue) { // closed and drained
			st.mu.Unlock()
			return
		}
		op := st.queue[st.head]
		st.queue[st.head] = simOp{}
		if st.head++; st.head == len(st.queue) {
			st.queue, st.head = st.queue[:0], 0
		}
		st.mu.Unlock()

		err := st.sim.execute(op)

		st.mu.Lock()
		st.pending--
		if err != nil && st.err == nil {
			st.err = err
		}
		st.cond.Broadcast()
		st.mu.Unlock()
	}
}

// execute performs one copy, then holds the link for the modelled time.
func (s *Sim) execute(op simOp) error {
	n := int64(len(op.host))
	var err error
	if s.opts.CopyFault != nil {
		err = s.opts.CopyFault(SimCopy{ToDevice: op.toDevice, Offset: op.off, Len: n})
	}
	if err == nil {
		// The reference taken at enqueue keeps op.mem.data mapped.
		dev := op.mem.data[op.off : op.off+n]
		if op.toDevice {
			copy(dev, op.host)
		} else {
			copy(op.host, dev)
		}
		s.holdLink(op.toDevice, n)
	} else {
		dir := "from"
		if op.toDevice {
			dir = "to"
		}
		err = fmt.Errorf("accel: %s: copy %s device of %d bytes at offset %d: %w", s.opts.Name, dir, n, op.off, err)
	}

	s.mu.Lock()
	op.mem.refs--
	if op.mem.freed && op.mem.refs == 0 && op.mem.data != nil {
		simUnmap(op.mem.data)
		op.mem.data = nil
	}
	s.mu.Unlock()
	return err
}

// holdLink sleeps until the modelled transfer of n bytes in one direction
// completes. Transfers in the same direction queue behind each other across
// streams, as they would on one PCIe link.
func (s *Sim) holdLink(toDevice bool, n int64) {
	bw := s.opts.BandwidthBytesPerSec
	if bw <= 0 {
		return
	}
	dir := 0
	if !toDevice {
		dir = 1
	}
	d := time.Duration(float64(n) / bw * float64(time.Second))
	now := time.Now()
	s.linkMu.Lock()
	start := s.link[dir]
	if start.Before(now) {
		start = now
	}
	end := start.Add(d)
	s.link[dir] = end
	s.linkMu.Unlock()
	time.Sleep(time.Until(end))
}

// Synchronize waits for every copy issued so far and returns the first error
// any of them met since the previous Synchronize (the error is then
// cleared, so the stream stays usable).
func (st *simStream) Synchronize() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	for st.pending > 0 {
		st.cond.Wait()
	}
	err := st.err
	st.err = nil
	return err
}

// Close synchronizes the stream, stops its goroutine and returns the
// synchronization's error. Copies issued after Close fail with ErrClosed.
// Close is idempotent.
func (st *simStream) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	for st.pending > 0 {
		st.cond.Wait()
	}
	err := st.err
	st.err = nil
	st.cond.Broadcast()
	st.mu.Unlock()
	<-st.exited

	s := st.sim
	s.mu.Lock()
	delete(s.streams, st)
	s.mu.Unlock()
	return err
}
