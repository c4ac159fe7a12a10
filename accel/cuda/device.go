package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/zinfio/zinf/accel"
)

// Device is one NVIDIA GPU driven through the CUDA driver API. It implements
// accel.Device and is safe for concurrent use.
//
// It works in the device's primary context (the one the CUDA runtime and
// libraries such as cuFile use too). Goroutines migrate between OS threads
// and a CUDA context is current per thread, so every driver call is made
// from C together with cuCtxSetCurrent, in one cgo call: no Device method
// depends on which thread the goroutine runs on, and none locks it.
// WithContext is there for code that calls other CUDA libraries.
type Device struct {
	drv      driver
	ordinal  int
	dev      int32
	ctx      uintptr
	name     string
	capacity int64
	info     Info

	// life is held shared by every call that uses the driver and
	// exclusively by Close, so Close never tears down under a call.
	life sync.RWMutex

	mu       sync.Mutex // guards the fields below
	closed   bool
	used     int64
	mems     map[*devMem]struct{}
	streams  map[*stream]struct{}
	hostRegs map[uintptr][]byte // start address -> registered bytes
}

var _ accel.Device = (*Device)(nil)

// devMem is one allocation of device memory.
type devMem struct {
	ptr   uint64
	size  int64
	freed bool // guarded by Device.mu
}

func (m *devMem) Size() int64 { return m.size }

// Probe describes the device opts selects without keeping it open: the
// checks Open makes, for `zinf doctor` and for choosing between GPU and
// simulated tiers. Its errors match accel.ErrUnavailable and say what is
// missing: the library (with the loader's message), a working driver
// (cuInit's error), or a device at the ordinal.
func Probe(opts Options) (Info, error) {
	d, err := open(opts)
	if err != nil {
		return Info{}, err
	}
	info := d.info
	return info, d.Close()
}

// Available reports whether the device opts selects can be opened: nil,
// or Probe's error saying what is missing.
func Available(opts Options) error {
	_, err := Probe(opts)
	return err
}

// Open opens the device opts selects, in its primary context. Errors say
// what is missing, as Probe's do.
func Open(opts Options) (*Device, error) {
	return open(opts)
}

func open(opts Options) (*Device, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	drv, err := loadDriver(opts.library())
	if err != nil {
		return nil, err
	}
	if err := drv.init(); err != nil {
		return nil, unavailable(fmt.Errorf("cuda: the driver in %s cannot start (no usable NVIDIA GPU, or the driver is not loaded or does not match the library): %w", drv.path(), err))
	}
	version, err := drv.driverVersion()
	if err != nil {
		return nil, err
	}
	count, err := drv.deviceCount()
	if err != nil {
		return nil, unavailable(err)
	}
	if opts.Ordinal >= count {
		if count == 0 {
			return nil, unavailable(fmt.Errorf("cuda: no device at ordinal %d: the driver sees no CUDA devices (check CUDA_VISIBLE_DEVICES)", opts.Ordinal))
		}
		return nil, unavailable(fmt.Errorf("cuda: no device at ordinal %d: the driver sees %d device(s), ordinals 0..%d (check CUDA_VISIBLE_DEVICES)", opts.Ordinal, count, count-1))
	}
	dev, err := drv.deviceGet(opts.Ordinal)
	if err != nil {
		return nil, unavailable(err)
	}
	name, err := drv.deviceName(dev)
	if err != nil {
		return nil, err
	}
	total, err := drv.deviceTotalMem(dev)
	if err != nil {
		return nil, err
	}
	ctx, err := drv.primaryCtxRetain(dev)
	if err != nil {
		return nil, unavailable(err)
	}
	free, _, err := drv.memGetInfo(ctx)
	if err != nil {
		drv.primaryCtxRelease(dev)
		return nil, err
	}
	capacity := opts.CapacityBytes
	if capacity == 0 {
		capacity = free
	}
	return &Device{
		drv:      drv,
		ordinal:  opts.Ordinal,
		dev:      dev,
		ctx:      ctx,
		name:     fmt.Sprintf("cuda:%d %s", opts.Ordinal, name),
		capacity: capacity,
		info: Info{
			Ordinal:       opts.Ordinal,
			Name:          name,
			TotalBytes:    total,
			FreeBytes:     free,
			DriverVersion: version,
			Library:       drv.path(),
		},
		mems:     make(map[*devMem]struct{}),
		streams:  make(map[*stream]struct{}),
		hostRegs: make(map[uintptr][]byte),
	}, nil
}

// Name returns "cuda:<ordinal> <device name>".
func (d *Device) Name() string { return d.name }

// Info returns what Probe reports for the device, as of Open.
func (d *Device) Info() Info { return d.info }

// CapacityBytes is the memory zinf may allocate on the device.
func (d *Device) CapacityBytes() int64 { return d.capacity }

// UsedBytes is the memory allocated through this Device.
func (d *Device) UsedBytes() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// enter takes the shared lifetime lock; it fails once the device is closed.
func (d *Device) enter(op string) error {
	d.life.RLock()
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		d.life.RUnlock()
		return fmt.Errorf("cuda: %s: %s: %w", d.name, op, accel.ErrClosed)
	}
	return nil
}

func (d *Device) exit() { d.life.RUnlock() }

// Alloc allocates size bytes of device memory (cuMemAlloc_v2). It fails with
// accel.ErrOutOfMemory when the allocation would exceed CapacityBytes or the
// driver has no room.
func (d *Device) Alloc(size int64) (accel.Mem, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda: %s: alloc of %d bytes: %w", d.name, size, accel.ErrInvalid)
	}
	if err := d.enter("alloc"); err != nil {
		return nil, err
	}
	defer d.exit()
	d.mu.Lock()
	if size > d.capacity-d.used {
		used := d.used
		d.mu.Unlock()
		return nil, fmt.Errorf("%w: %s: requested %d bytes, %d of %d in use",
			accel.ErrOutOfMemory, d.name, size, used, d.capacity)
	}
	d.used += size // reserved while the driver allocates
	d.mu.Unlock()

	p, err := d.drv.memAlloc(d.ctx, size)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.used -= size
		if errors.Is(err, accel.ErrOutOfMemory) {
			return nil, fmt.Errorf("%w: %s: requested %d bytes, %d of %d in use by zinf: %w",
				accel.ErrOutOfMemory, d.name, size, d.used, d.capacity, err)
		}
		return nil, err
	}
	m := &devMem{ptr: p, size: size}
	d.mems[m] = struct{}{}
	return m, nil
}

// lookup returns m as a live allocation of d. d.mu must be held.
func (d *Device) lookup(m accel.Mem, op string) (*devMem, error) {
	dm, ok := m.(*devMem)
	if !ok || dm == nil {
		return nil, fmt.Errorf("cuda: %s: %s: memory %T was not allocated by a CUDA device: %w", d.name, op, m, accel.ErrInvalid)
	}
	if dm.freed {
		return nil, fmt.Errorf("cuda: %s: %s: memory (%d bytes) was already freed: %w", d.name, op, dm.size, accel.ErrInvalid)
	}
	if _, ok := d.mems[dm]; !ok {
		return nil, fmt.Errorf("cuda: %s: %s: memory was allocated by another device: %w", d.name, op, accel.ErrInvalid)
	}
	return dm, nil
}

// Free releases m (cuMemFree_v2). Copies on m must have been synchronized.
// Freeing twice returns an error matching accel.ErrInvalid.
func (d *Device) Free(m accel.Mem) error {
	if err := d.enter("free"); err != nil {
		return err
	}
	defer d.exit()
	d.mu.Lock()
	dm, err := d.lookup(m, "free")
	if err != nil {
		d.mu.Unlock()
		return err
	}
	dm.freed = true
	delete(d.mems, dm)
	d.used -= dm.size
	d.mu.Unlock()
	return d.drv.memFree(d.ctx, dm.ptr)
}

// Pointer returns m's device address (a CUdeviceptr), for libraries such as
// cuFile that take device pointers. It is valid until m is freed.
func (d *Device) Pointer(m accel.Mem) (uintptr, error) {
	if err := d.enter("pointer"); err != nil {
		return 0, err
	}
	defer d.exit()
	d.mu.Lock()
	defer d.mu.Unlock()
	dm, err := d.lookup(m, "pointer")
	if err != nil {
		return 0, err
	}
	return uintptr(dm.ptr), nil
}

// WithContext runs fn on a locked OS thread with the device's context
// current, for code that calls other CUDA libraries (cuFile) which use the
// calling thread's context. fn must not call back into d in a way that
// waits for Close. It fails with accel.ErrClosed after Close.
func (d *Device) WithContext(fn func() error) error {
	if err := d.enter("with context"); err != nil {
		return err
	}
	defer d.exit()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.drv.setCurrent(d.ctx); err != nil {
		return err
	}
	return fn()
}

// stream is a CUDA stream created non-blocking (it does not synchronize
// with the legacy default stream).
type stream struct {
	dev *Device
	s   uintptr

	mu     sync.RWMutex // held shared by copies, exclusively by Close
	closed bool
}

var _ accel.Stream = (*stream)(nil)

// NewStream creates a stream (cuStreamCreate, CU_STREAM_NON_BLOCKING).
func (d *Device) NewStream() (accel.Stream, error) {
	if err := d.enter("new stream"); err != nil {
		return nil, err
	}
	defer d.exit()
	s, err := d.drv.streamCreate(d.ctx)
	if err != nil {
		return nil, err
	}
	st := &stream{dev: d, s: s}
	d.mu.Lock()
	d.streams[st] = struct{}{}
	d.mu.Unlock()
	return st, nil
}

// copyArgs validates a copy and returns the device address and the stream,
// read-locked; the caller unlocks it after issuing the copy.
func (d *Device) copyArgs(st accel.Stream, m accel.Mem, off int64, n int, what string) (uint64, *stream, error) {
	cs, ok := st.(*stream)
	if !ok || cs == nil || cs.dev != d {
		return 0, nil, fmt.Errorf("cuda: %s: %s: stream %T was not created by this device: %w", d.name, what, st, accel.ErrInvalid)
	}
	d.mu.Lock()
	dm, err := d.lookup(m, what)
	d.mu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	if off < 0 || off > dm.size || int64(n) > dm.size-off {
		return 0, nil, fmt.Errorf("%w: %s: %s of %d bytes at offset %d of a %d-byte allocation",
			accel.ErrBounds, d.name, what, n, off, dm.size)
	}
	cs.mu.RLock()
	if cs.closed {
		cs.mu.RUnlock()
		return 0, nil, fmt.Errorf("cuda: %s: %s: stream: %w", d.name, what, accel.ErrClosed)
	}
	return dm.ptr + uint64(off), cs, nil
}

// CopyToDevice queues a copy of src into dst at dstOff on s
// (cuMemcpyHtoDAsync_v2). From pageable memory the driver stages the copy;
// from memory registered with RegisterHost it is DMA and truly
// asynchronous.
func (d *Device) CopyToDevice(s accel.Stream, dst accel.Mem, dstOff int64, src []byte) error {
	if err := d.enter("copy to device"); err != nil {
		return err
	}
	defer d.exit()
	p, cs, err := d.copyArgs(s, dst, dstOff, len(src), "copy to device")
	if err != nil {
		return err
	}
	defer cs.mu.RUnlock()
	if len(src) == 0 {
		return nil
	}
	return d.drv.memcpyHtoDAsync(d.ctx, p, src, cs.s)
}

// CopyFromDevice queues a copy of len(dst) bytes of src at srcOff into dst
// on s (cuMemcpyDtoHAsync_v2).
func (d *Device) CopyFromDevice(s accel.Stream, dst []byte, src accel.Mem, srcOff int64) error {
	if err := d.enter("copy from device"); err != nil {
		return err
	}
	defer d.exit()
	p, cs, err := d.copyArgs(s, src, srcOff, len(dst), "copy from device")
	if err != nil {
		return err
	}
	defer cs.mu.RUnlock()
	if len(dst) == 0 {
		return nil
	}
	return d.drv.memcpyDtoHAsync(d.ctx, dst, p, cs.s)
}

// Synchronize waits for the stream's copies (cuStreamSynchronize) and
// returns the driver's error for the first that failed.
func (s *stream) Synchronize() error {
	d := s.dev
	if err := d.enter("synchronize"); err != nil {
		return err
	}
	defer d.exit()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return fmt.Errorf("cuda: %s: synchronize: stream: %w", d.name, accel.ErrClosed)
	}
	return d.drv.streamSynchronize(d.ctx, s.s)
}

// Handle returns a stream's CUstream, for libraries such as NCCL that
// take streams; it is valid until the stream is closed.
func (d *Device) Handle(st accel.Stream) (uintptr, error) {
	cs, ok := st.(*stream)
	if !ok || cs == nil || cs.dev != d {
		return 0, fmt.Errorf("cuda: %s: stream %T was not created by this device: %w", d.name, st, accel.ErrInvalid)
	}
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	if cs.closed {
		return 0, fmt.Errorf("cuda: %s: stream: %w", d.name, accel.ErrClosed)
	}
	return cs.s, nil
}

// Done reports whether the work queued on a stream has finished
// (cuStreamQuery), without waiting: for callers that poll while they
// watch for other failures.
func (d *Device) Done(st accel.Stream) (bool, error) {
	if err := d.enter("query stream"); err != nil {
		return false, err
	}
	defer d.exit()
	cs, ok := st.(*stream)
	if !ok || cs == nil || cs.dev != d {
		return false, fmt.Errorf("cuda: %s: query: stream %T was not created by this device: %w", d.name, st, accel.ErrInvalid)
	}
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	if cs.closed {
		return false, fmt.Errorf("cuda: %s: query: stream: %w", d.name, accel.ErrClosed)
	}
	return d.drv.streamQuery(d.ctx, cs.s)
}

// Close synchronizes and destroys the stream. It is idempotent.
func (s *stream) Close() error {
	d := s.dev
	if err := d.enter("close stream"); err != nil {
		// Device.Close destroyed it already.
		return nil
	}
	defer d.exit()
	err := s.destroy()
	d.mu.Lock()
	delete(d.streams, s)
	d.mu.Unlock()
	return err
}

// destroy synchronizes and destroys the stream once.
func (s *stream) destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	d := s.dev
	return errors.Join(d.drv.streamSynchronize(d.ctx, s.s), d.drv.streamDestroy(d.ctx, s.s))
}

// RegisterHost page-locks b and maps it for DMA (cuMemHostRegister_v2,
// CU_MEMHOSTREGISTER_PORTABLE). b must stay mapped until UnregisterHost or
// Close; it should come from the buffers pool (mmap'ed, outside the Go
// heap).
func (d *Device) RegisterHost(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("cuda: %s: register host: empty buffer: %w", d.name, accel.ErrInvalid)
	}
	if err := d.enter("register host"); err != nil {
		return err
	}
	defer d.exit()
	if err := d.drv.hostRegister(d.ctx, b); err != nil {
		return err
	}
	d.mu.Lock()
	d.hostRegs[uintptr(unsafe.Pointer(unsafe.SliceData(b)))] = b
	d.mu.Unlock()
	return nil
}

// UnregisterHost undoes RegisterHost (cuMemHostUnregister).
func (d *Device) UnregisterHost(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("cuda: %s: unregister host: empty buffer: %w", d.name, accel.ErrInvalid)
	}
	if err := d.enter("unregister host"); err != nil {
		return err
	}
	defer d.exit()
	if err := d.drv.hostUnregister(d.ctx, b); err != nil {
		return err
	}
	d.mu.Lock()
	delete(d.hostRegs, uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	d.mu.Unlock()
	return nil
}

// Close waits for calls in progress, destroys every stream (synchronizing
// it), unregisters host memory still registered, frees every allocation and
// releases the primary context. It is idempotent and returns every error it
// met, joined.
func (d *Device) Close() error {
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	var errs []error
	for s := range d.streams {
		errs = append(errs, s.destroy())
	}
	clear(d.streams)
	for _, b := range d.hostRegs {
		errs = append(errs, d.drv.hostUnregister(d.ctx, b))
	}
	clear(d.hostRegs)
	for m := range d.mems {
		m.freed = true
		errs = append(errs, d.drv.memFree(d.ctx, m.ptr))
	}
	clear(d.mems)
	d.used = 0
	errs = append(errs, d.drv.primaryCtxRelease(d.dev))
	return errors.Join(errs...)
}
