package gds

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
)

// maxRetries bounds EINTR/EAGAIN retries of one cuFile call, so a
// persistently interrupted call fails instead of spinning.
const maxRetries = 1000

// Engine moves bytes between files and GPU memory with NVIDIA cuFile
// (GPUDirect Storage): NVMe to GPU by DMA, without a bounce through host
// memory. It implements DeviceIO and is safe for concurrent use.
type Engine struct {
	dev  *cuda.Device
	cf   cufile
	opts Options

	lifecycle // mu also guards files and bufs
	counters
	files map[*File]struct{}
	bufs  map[uintptr]int64 // registered device address -> bytes
}

var _ DeviceIO = (*Engine)(nil)

// Available reports whether GPUDirect Storage can run here with opts: nil,
// or an error matching ErrUnavailable that says exactly what is missing —
// the cuFile library (with the loader's message), a GPU or CUDA driver
// (accel/cuda's diagnosis), a working cuFile driver (cuFileDriverOpen's
// status code, and whether the nvidia-fs kernel module is loaded), or
// filesystem support for each of opts.Paths.
func Available(opts Options) error {
	opts.EnsureDefaults()
	return available(opts, nil)
}

// AvailableFor is Available followed by RegistrationCheck on opts.Paths
// with a device opened from opts.CUDA and an Engine: what "auto" and
// "required" find when a runtime opens. zinf doctor reports it.
func AvailableFor(opts Options) error {
	opts.EnsureDefaults()
	if err := available(opts, nil); err != nil {
		return err
	}
	if len(opts.Paths) == 0 {
		return nil
	}
	dev, err := cuda.Open(opts.CUDA)
	if err != nil {
		return unavailable(fmt.Errorf("gds: opening the GPU: %w", err))
	}
	defer dev.Close()
	e, err := Open(dev, opts)
	if err != nil {
		return err
	}
	defer e.Close()
	return RegistrationCheck(e, opts.Paths)
}

// available is Available with an already open device (nil: probe
// opts.CUDA).
func available(opts Options, dev *cuda.Device) error {
	cf, err := loadCuFile(opts.Library)
	if err != nil {
		return err
	}
	if dev == nil {
		if _, err := cuda.Probe(opts.CUDA); err != nil {
			return unavailable(fmt.Errorf("gds: no usable GPU: %w", err))
		}
	}
	if err := openDriver(cf, dev); err != nil {
		return err
	}
	if err := releaseDriver(cf); err != nil {
		return err
	}
	var errs []error
	for _, p := range opts.Paths {
		if err := filesystemSupported(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return unavailable(err)
	}
	return nil
}

// openDriver acquires the cuFile driver (in dev's context when there is a
// device) and explains a failure.
func openDriver(cf cufile, dev *cuda.Device) error {
	open := func() error { return acquireDriver(cf) }
	var err error
	if dev != nil {
		err = dev.WithContext(open)
	} else {
		err = open()
	}
	if err == nil {
		return nil
	}
	var ce *CuFileError
	if errors.As(err, &ce) {
		return unavailable(fmt.Errorf("gds: the cuFile driver in %s does not open (%s): %w",
			cf.path(), driverOpenHint(ce.Code), err))
	}
	return unavailable(fmt.Errorf("gds: opening the cuFile driver in %s: %w", cf.path(), err))
}

// Open starts a cuFile Engine on dev: it loads the library, opens the
// cuFile driver (once per process, shared by every Engine) and is ready to
// open files and register buffers. Close the Engine before the Device.
func Open(dev *cuda.Device, opts Options) (*Engine, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if dev == nil {
		return nil, unavailable(errors.New("gds: no CUDA device"))
	}
	cf, err := loadCuFile(opts.Library)
	if err != nil {
		return nil, err
	}
	if err := openDriver(cf, dev); err != nil {
		return nil, err
	}
	if cf.hasBatch() {
		opts.Logger.Debug("gds: " + cf.path() + " exports the cuFile batch API; zinf issues pieces with cuFileRead/cuFileWrite from Parallelism goroutines")
	}
	return &Engine{
		dev:   dev,
		cf:    cf,
		opts:  opts,
		files: make(map[*File]struct{}),
		bufs:  make(map[uintptr]int64),
	}, nil
}

// Mode returns "gds".
func (e *Engine) Mode() string { return NameGDS }

// Options returns the engine's effective options.
func (e *Engine) Options() Options { return e.opts }

// OpenFile opens path (flag as os.OpenFile) with the O_DIRECT policy of
// Options.Direct and registers it with cuFile (cuFileHandleRegister with an
// opaque fd). The handle is kept with the File and deregistered when the
// File is closed, or when the Engine is.
func (e *Engine) OpenFile(path string, flag int, perm os.FileMode) (*File, error) {
	if err := e.enter(); err != nil {
		return nil, &os.PathError{Op: "gds open", Path: path, Err: err}
	}
	defer e.exit()
	af, err := aio.OpenFile(path, flag, perm, e.opts.Direct, e.opts.Logger)
	if err != nil {
		return nil, err
	}
	rfd, extra, err := registrationFd(af.Fd())
	if err != nil {
		af.Close()
		return nil, &os.PathError{Op: "cuFileHandleRegister", Path: path, Err: err}
	}
	h, err := e.cf.handleRegister(rfd)
	if err != nil {
		if extra != nil {
			extra.Close()
		}
		af.Close()
		var ce *CuFileError
		if errors.As(err, &ce) && (ce.Code == cuFileDIONotSet || ce.Code == cuFileIONotSupported) {
			fs := "unknown"
			if name, ferr := filesystemName(path); ferr == nil {
				fs = name
			}
			err = fmt.Errorf("%w (file opened with O_DIRECT: %v, filesystem %s)", err, af.Direct(), fs)
		}
		return nil, &os.PathError{Op: "cuFileHandleRegister", Path: path, Err: err}
	}
	f := &File{af: af, owner: e, handle: h}
	f.finish = func() {
		e.cf.handleDeregister(h)
		if extra != nil {
			extra.Close()
		}
		e.mu.Lock()
		delete(e.files, f)
		e.mu.Unlock()
	}
	e.mu.Lock()
	e.files[f] = struct{}{}
	e.mu.Unlock()
	return f, nil
}

// RegisterBuffer registers m, a whole allocation of the Engine's device,
// with cuFile (cuFileBufRegister), so reads and writes on it skip cuFile's
// internal bounce buffers. Registering an already registered allocation
// does nothing. Registrations last until DeregisterBuffer or Close; call
// DeregisterBuffer before freeing m.
func (e *Engine) RegisterBuffer(m accel.Mem) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.exit()
	p, err := e.dev.Pointer(m)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.bufs[p]; ok {
		return nil
	}
	if err := e.dev.WithContext(func() error { return e.cf.bufRegister(p, m.Size()) }); err != nil {
		return fmt.Errorf("gds: registering %d bytes of device memory at %#x: %w", m.Size(), p, err)
	}
	e.bufs[p] = m.Size()
	return nil
}

// DeregisterBuffer undoes RegisterBuffer (cuFileBufDeregister); m not
// registered is an error.
func (e *Engine) DeregisterBuffer(m accel.Mem) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.exit()
	p, err := e.dev.Pointer(m)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.bufs[p]; !ok {
		return fmt.Errorf("gds: device memory at %#x is not registered: %w", p, accel.ErrInvalid)
	}
	delete(e.bufs, p)
	return e.dev.WithContext(func() error { return e.cf.bufDeregister(p) })
}

// Read reads n bytes of f at fileOff into dst at dstOff, in pieces of
// Options.BlockSizeBytes issued by Options.Parallelism goroutines with
// cuFileRead. Short transfers are continued; a read that reaches end of
// file early fails with aio.ErrShortTransfer. It returns the bytes moved
// and, on failure, an *aio.OpError (Backend "gds") whose *PieceError says
// which piece failed.
func (e *Engine) Read(ctx context.Context, f *File, dst accel.Mem, dstOff, fileOff, n int64) (int64, error) {
	return e.transfer(ctx, aio.OpRead, f, dst, dstOff, fileOff, n)
}

// Write writes n bytes of src at srcOff to f at fileOff with cuFileWrite,
// as Read does.
func (e *Engine) Write(ctx context.Context, f *File, src accel.Mem, srcOff, fileOff, n int64) (int64, error) {
	return e.transfer(ctx, aio.OpWrite, f, src, srcOff, fileOff, n)
}

// ReadToDevice is Read, for DeviceIO.
func (e *Engine) ReadToDevice(ctx context.Context, f *File, dst accel.Mem, dstOff, fileOff, n int64) (int64, error) {
	return e.Read(ctx, f, dst, dstOff, fileOff, n)
}

// WriteFromDevice is Write, for DeviceIO.
func (e *Engine) WriteFromDevice(ctx context.Context, f *File, src accel.Mem, srcOff, fileOff, n int64) (int64, error) {
	return e.Write(ctx, f, src, srcOff, fileOff, n)
}

// checkRequest validates a request's ranges.
func checkRequest(m accel.Mem, memOff, fileOff, n int64) error {
	if m == nil {
		return fmt.Errorf("nil device memory: %w", accel.ErrInvalid)
	}
	if n < 0 || fileOff < 0 {
		return fmt.Errorf("negative length %d or file offset %d: %w", n, fileOff, accel.ErrInvalid)
	}
	if memOff < 0 || memOff > m.Size() || n > m.Size()-memOff {
		return fmt.Errorf("%w: %d bytes at device offset %d of a %d-byte allocation", accel.ErrBounds, n, memOff, m.Size())
	}
	return nil
}

func (e *Engine) transfer(ctx context.Context, op aio.Op, f *File, m accel.Mem, memOff, fileOff, n int64) (int64, error) {
	if err := e.enter(); err != nil {
		return 0, opError(NameGDS, op.String(), f, fileOff, n, 0, err)
	}
	defer e.exit()
	if err := checkRequest(m, memOff, fileOff, n); err != nil {
		return 0, opError(NameGDS, op.String(), f, fileOff, n, 0, err)
	}
	if err := f.acquire(e); err != nil {
		return 0, opError(NameGDS, op.String(), f, fileOff, n, 0, err)
	}
	defer f.release()
	base, err := e.dev.Pointer(m)
	if err != nil {
		return 0, opError(NameGDS, op.String(), f, fileOff, n, 0, err)
	}

	s := newSplit(ctx, fileOff, n, e.opts.BlockSizeBytes)
	s.run(e.opts.Parallelism, func() {
		// One locked thread with the context current per goroutine, not
		// per piece.
		err := e.dev.WithContext(func() error {
			for {
				p, ok := s.claim()
				if !ok {
					return nil
				}
				memAt := memOff + (p.start - fileOff)
				if err := e.piece(op, f.handle, base, p, memAt, s); err != nil {
					s.fail(&PieceError{FileOffset: p.start, DeviceOffset: memAt, Len: p.len, Err: err})
					return nil
				}
			}
		})
		if err != nil {
			s.fail(err)
		}
	})
	done, err := s.result()
	if err != nil {
		e.errs.Add(1)
		return done, opError(NameGDS, op.String(), f, fileOff, n, done, err)
	}
	if op == aio.OpRead {
		e.readOps.Add(1)
		e.readBytes.Add(n)
	} else {
		e.writeOps.Add(1)
		e.writeBytes.Add(n)
	}
	return n, nil
}

// piece moves one piece, continuing short transfers and retrying EINTR
// and EAGAIN.
func (e *Engine) piece(op aio.Op, h, base uintptr, p piece, memAt int64, s *split) error {
	var moved int64
	retries := 0
	for moved < p.len {
		e.pieces.Add(1)
		var n int64
		var err error
		if op == aio.OpRead {
			n, err = e.cf.read(h, base, p.len-moved, p.start+moved, memAt+moved)
		} else {
			n, err = e.cf.write(h, base, p.len-moved, p.start+moved, memAt+moved)
		}
		if errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN) {
			if retries++; retries <= maxRetries {
				e.retries.Add(1)
				continue
			}
		}
		if err != nil {
			return err
		}
		if n == 0 {
			if op == aio.OpRead {
				return fmt.Errorf("%w: end of file after %d of %d bytes", aio.ErrShortTransfer, moved, p.len)
			}
			return fmt.Errorf("%w: cuFileWrite made no progress after %d of %d bytes", aio.ErrShortTransfer, moved, p.len)
		}
		if n > p.len-moved {
			return fmt.Errorf("%s returned %d bytes for a %d-byte transfer", op, n, p.len-moved)
		}
		if n < p.len-moved {
			e.shorts.Add(1)
		}
		moved += n
		s.done.Add(n)
	}
	return nil
}

// Close waits for requests in flight, closes every file still open
// (deregistering its cuFile handle), deregisters every buffer and releases
// the cuFile driver. Close the Engine before its Device. It is idempotent.
func (e *Engine) Close() error {
	e.life.Lock()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		e.life.Unlock()
		return nil
	}
	e.closed = true
	files := make([]*File, 0, len(e.files))
	for f := range e.files {
		files = append(files, f)
	}
	bufs := make([]uintptr, 0, len(e.bufs))
	for p := range e.bufs {
		bufs = append(bufs, p)
	}
	clear(e.bufs)
	e.mu.Unlock()
	e.life.Unlock()

	var errs []error
	if len(bufs) > 0 {
		errs = append(errs, e.dev.WithContext(func() error {
			var errs []error
			for _, p := range bufs {
				errs = append(errs, e.cf.bufDeregister(p))
			}
			return errors.Join(errs...)
		}))
	}
	for _, f := range files {
		errs = append(errs, f.Close())
	}
	errs = append(errs, releaseDriver(e.cf))
	return errors.Join(errs...)
}
