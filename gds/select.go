package gds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
)

// DeviceIO moves bytes between files and device memory, either directly
// (GPUDirect Storage, Mode "gds") or through pinned host memory (Mode
// "bounce"). Select picks one.
//
// Files are opened with OpenFile and used only with the DeviceIO that
// opened them. Every method may be called from any goroutine; requests run
// concurrently. A request's device memory must not be freed, and its
// range not touched by device copies, until the request returns. A
// request returns the bytes it moved; when it fails, some pieces may have
// completed (the count says how many bytes) and the error is an
// *aio.OpError naming the operation, path, offsets and bytes done.
// Close is called once, after the requests; it closes the files still
// open.
type DeviceIO interface {
	// Mode returns "gds" or "bounce".
	Mode() string
	// OpenFile opens path for device I/O (flag as os.OpenFile).
	OpenFile(path string, flag int, perm os.FileMode) (*File, error)
	// ReadToDevice reads n bytes of f at fileOff into dst at dstOff.
	ReadToDevice(ctx context.Context, f *File, dst accel.Mem, dstOff, fileOff, n int64) (int64, error)
	// WriteFromDevice writes n bytes of src at srcOff to f at fileOff.
	WriteFromDevice(ctx context.Context, f *File, src accel.Mem, srcOff, fileOff, n int64) (int64, error)
	// Close releases what the DeviceIO holds (not the device, aio engine
	// or pool it was given).
	Close() error
}

// SelectOptions are what Select needs to build either path.
type SelectOptions struct {
	// GDS configures the cuFile Engine (and Available's checks).
	GDS Options
	// Bounce configures the bounce path.
	Bounce BounceOptions
	// AIO and Pool serve the bounce path; they are required unless the
	// mode is "required".
	AIO  aio.Engine
	Pool *buffers.Pool
	// Logger receives the warning when "auto" falls back to the bounce
	// path. Default slog.Default().
	Logger *slog.Logger
}

// Select builds the DeviceIO the mode asks for ("off", "auto" or
// "required"; see ParseMode):
//
//   - "off": the bounce path.
//   - "auto": GPUDirect Storage when dev is a CUDA device and Available
//     says it works, the Engine opens and cuFile registers a file on each
//     of GDS.Paths (RegistrationCheck); otherwise the bounce path, with one
//     warning saying why.
//   - "required": GPUDirect Storage, or Available's (or Open's) error.
func Select(mode string, dev accel.Device, opts SelectOptions) (DeviceIO, error) {
	mode, err := ParseMode(mode)
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.GDS.Logger == nil {
		opts.GDS.Logger = opts.Logger
	}
	if opts.Bounce.Logger == nil {
		opts.Bounce.Logger = opts.Logger
	}
	bounce := func() (DeviceIO, error) {
		return NewBounce(dev, opts.AIO, opts.Pool, opts.Bounce)
	}
	if mode == ModeOff {
		return bounce()
	}
	e, err := openGDS(dev, opts.GDS)
	if err == nil {
		if err = RegistrationCheck(e, opts.GDS.Paths); err == nil {
			return e, nil
		}
		e.Close()
	}
	if mode == ModeRequired {
		return nil, fmt.Errorf("gds: mode \"required\" but GPUDirect Storage cannot be used: %w", err)
	}
	b, berr := bounce()
	if berr != nil {
		return nil, errors.Join(berr, err)
	}
	opts.Logger.Warn("gds: GPUDirect Storage unavailable; using the bounce path (NVMe -> pinned host buffer -> device), which costs host memory bandwidth",
		"reason", err.Error())
	return b, nil
}

// RegistrationCheck has e register a file it creates in each of paths
// with cuFile (cuFileHandleRegister, as OpenFile does), then closes and
// removes it. A driver that opens and a supported filesystem are not
// enough: cuFile may still refuse every file of a disk (on a virtio disk
// without udev properties, CU_FILE_HANDLE_NOT_REGISTERED even in its
// compatibility mode), and a swap file refused there would fail the first
// swap-in. The error names the path and cuFile's reason, and wraps
// ErrUnavailable.
func RegistrationCheck(e *Engine, paths []string) error {
	for _, dir := range paths {
		f, err := os.CreateTemp(dir, ".zinf-gds-check-*")
		if err != nil {
			return unavailable(fmt.Errorf("gds: checking that cuFile registers a file in %s: %w", dir, err))
		}
		name := f.Name()
		f.Close()
		gf, err := e.OpenFile(name, os.O_RDWR, 0)
		if err == nil {
			err = gf.Close()
		}
		if rerr := os.Remove(name); rerr != nil && err == nil {
			err = rerr
		}
		if err != nil {
			return unavailable(fmt.Errorf("gds: cuFile does not register a file in %s: %w", dir, err))
		}
	}
	return nil
}

// openGDS checks availability with dev and opens the Engine.
func openGDS(dev accel.Device, opts Options) (*Engine, error) {
	cd, ok := dev.(*cuda.Device)
	if !ok || cd == nil {
		name := "none"
		if dev != nil {
			name = dev.Name()
		}
		return nil, unavailable(fmt.Errorf("gds: device %s is not a CUDA device; GPUDirect Storage moves data to GPU memory only", name))
	}
	opts.EnsureDefaults()
	if err := available(opts, cd); err != nil {
		return nil, err
	}
	return Open(cd, opts)
}
