package cuda

import (
	"errors"
	"fmt"
	"os"

	"github.com/zinfio/zinf/accel"
)

// DefaultLibrary is the CUDA driver library's soname. It ships with the
// NVIDIA driver, so it is present wherever a GPU works (unlike libcudart,
// which comes with the toolkit).
const DefaultLibrary = "libcuda.so.1"

// LibraryEnv names the environment variable that overrides DefaultLibrary
// when Options.Library is empty.
const LibraryEnv = "ZINF_CUDA_LIBRARY"

// Options select and size a CUDA device. The zero value opens device 0 with
// the system's driver library and all its free memory.
type Options struct {
	// Ordinal is the device index as the driver numbers it (honouring
	// CUDA_VISIBLE_DEVICES). Default 0.
	Ordinal int
	// Library is the path or soname of the CUDA driver library. Default:
	// $ZINF_CUDA_LIBRARY if set, else "libcuda.so.1".
	Library string
	// CapacityBytes is the device memory zinf may allocate. Default 0: the
	// memory free on the device when it is opened.
	CapacityBytes int64
}

// library returns the library to load: Library, else $ZINF_CUDA_LIBRARY,
// else DefaultLibrary.
func (o Options) library() string {
	if o.Library != "" {
		return o.Library
	}
	if env := os.Getenv(LibraryEnv); env != "" {
		return env
	}
	return DefaultLibrary
}

// validate reports every invalid field at once.
func (o Options) validate() error {
	var errs []error
	if o.Ordinal < 0 {
		errs = append(errs, fmt.Errorf("cuda: ordinal %d is negative", o.Ordinal))
	}
	if o.CapacityBytes < 0 {
		errs = append(errs, fmt.Errorf("cuda: capacity %d bytes is negative (0 means the free memory at open)", o.CapacityBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", err, accel.ErrInvalid)
	}
	return nil
}

// Info describes a device, as Probe reports it.
type Info struct {
	Ordinal int
	Name    string // the driver's name for the device: "NVIDIA H100 80GB HBM3"
	// TotalBytes and FreeBytes are the device memory in all and free now.
	TotalBytes, FreeBytes int64
	// DriverVersion is the CUDA version the driver supports, encoded as
	// 1000*major + 10*minor (12040 is CUDA 12.4).
	DriverVersion int
	// Library is the driver library that was loaded.
	Library string
}

// DriverVersionString formats DriverVersion as "major.minor".
func (i Info) DriverVersionString() string {
	return fmt.Sprintf("%d.%d", i.DriverVersion/1000, i.DriverVersion%1000/10)
}
