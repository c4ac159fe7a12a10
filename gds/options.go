package gds

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
)

// DefaultLibrary is the cuFile library's soname (GPUDirect Storage, shipped
// with the CUDA toolkit and the nvidia-gds package).
const DefaultLibrary = "libcufile.so.0"

// LibraryEnv names the environment variable that overrides DefaultLibrary
// when Options.Library is empty.
const LibraryEnv = "ZINF_CUFILE_LIBRARY"

// DefaultBlockSizeBytes is the default piece size: 1 MiB, DeepNVMe's
// block_size default, and large enough that per-call overhead is small
// next to an NVMe transfer.
const DefaultBlockSizeBytes = 1 << 20

// MaxParallelism bounds the goroutines one request is spread over.
const MaxParallelism = 64

// Modes for Select (the config's gds setting).
const (
	// ModeOff never uses GPUDirect Storage: the bounce path.
	ModeOff = "off"
	// ModeAuto uses GPUDirect Storage when Available says it works, else
	// the bounce path with one warning.
	ModeAuto = "auto"
	// ModeRequired uses GPUDirect Storage or fails with Available's error.
	ModeRequired = "required"
)

// Names DeviceIO.Mode returns.
const (
	NameGDS    = "gds"
	NameBounce = "bounce"
)

// Options configure the cuFile Engine (and what Available checks). The zero
// value is usable: every field documents its default.
type Options struct {
	// BlockSizeBytes is the size of the pieces a request is split into;
	// pieces start at multiples of it in the file. Default 1 MiB.
	BlockSizeBytes int64
	// Parallelism is the number of goroutines issuing one request's pieces
	// concurrently. Default 1.
	Parallelism int
	// Library is the cuFile library's path or soname. Default:
	// $ZINF_CUFILE_LIBRARY if set, else "libcufile.so.0".
	Library string
	// Direct is the O_DIRECT policy for OpenFile. GPUDirect Storage needs
	// O_DIRECT files for the direct path; with the default DirectOptional a
	// filesystem that refuses O_DIRECT yields a buffered file (cuFile then
	// uses its compatibility mode or refuses the handle, saying so).
	Direct aio.DirectPolicy
	// CUDA selects the driver library and device Available probes. Open
	// uses the *cuda.Device it is given instead.
	CUDA cuda.Options
	// Paths are directories whose filesystems Available checks for
	// GPUDirect Storage support; Select ("auto", "required") and
	// AvailableFor also check that cuFile registers a file created there
	// (RegistrationCheck). A runtime passes its NVMe paths. Default none.
	Paths []string
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills zero fields with their documented defaults.
func (o *Options) EnsureDefaults() {
	if o.BlockSizeBytes == 0 {
		o.BlockSizeBytes = DefaultBlockSizeBytes
	}
	if o.Parallelism == 0 {
		o.Parallelism = 1
	}
	if o.Library == "" {
		o.Library = os.Getenv(LibraryEnv)
	}
	if o.Library == "" {
		o.Library = DefaultLibrary
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid field at once.
func (o *Options) Validate() error {
	return errors.Join(validateSplit("gds", o.BlockSizeBytes, o.Parallelism), validateDirect(o.Direct))
}

// BounceOptions configure the bounce path. The zero value is usable.
type BounceOptions struct {
	// BlockSizeBytes is the size of each staging buffer and of the pieces a
	// request is split into; pieces start at multiples of it in the file,
	// and it must be a multiple of the O_DIRECT alignment of the files used.
	// Default 1 MiB.
	BlockSizeBytes int64
	// Parallelism is the number of pieces in flight at once, each with its
	// own pair of staging buffers (one filling from NVMe while the other
	// copies to the device) and its own device stream. Default 1.
	Parallelism int
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills zero fields with their documented defaults.
func (o *BounceOptions) EnsureDefaults() {
	if o.BlockSizeBytes == 0 {
		o.BlockSizeBytes = DefaultBlockSizeBytes
	}
	if o.Parallelism == 0 {
		o.Parallelism = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid field at once.
func (o *BounceOptions) Validate() error {
	return validateSplit("gds bounce", o.BlockSizeBytes, o.Parallelism)
}

func validateSplit(who string, block int64, parallelism int) error {
	var errs []error
	if block <= 0 || block%4096 != 0 {
		errs = append(errs, fmt.Errorf("%s: block size %d is invalid (allowed: a positive multiple of 4096, so pieces stay aligned for O_DIRECT)", who, block))
	}
	if parallelism <= 0 || parallelism > MaxParallelism {
		errs = append(errs, fmt.Errorf("%s: parallelism %d is invalid (allowed: 1..%d)", who, parallelism, MaxParallelism))
	}
	return errors.Join(errs...)
}

func validateDirect(p aio.DirectPolicy) error {
	switch p {
	case aio.DirectOptional, aio.DirectRequired, aio.DirectOff:
		return nil
	}
	return fmt.Errorf("gds: O_DIRECT policy %d is unknown", int(p))
}

// ParseMode reads "off", "auto" or "required" (case-insensitive; "" is
// "auto").
func ParseMode(s string) (string, error) {
	switch m := strings.ToLower(strings.TrimSpace(s)); m {
	case ModeOff, ModeAuto, ModeRequired:
		return m, nil
	case "":
		return ModeAuto, nil
	}
	return "", fmt.Errorf("gds: mode %q is unknown (allowed: off, auto, required)", s)
}
