package cuda

import (
	"errors"
	"fmt"

	"github.com/zinfio/zinf/accel"
)

// CUresult codes zinf branches on or names when the driver cannot. The
// values are the CUDA driver API's (cuda.h, enum cudaError_enum).
const (
	resultSuccess                 = 0
	resultInvalidValue            = 1
	resultOutOfMemory             = 2
	resultNotInitialized          = 3
	resultDeinitialized           = 4
	resultStubLibrary             = 34
	resultDeviceUnavailable       = 46
	resultNoDevice                = 100
	resultInvalidDevice           = 101
	resultInvalidContext          = 201
	resultOperatingSystem         = 304
	resultInvalidHandle           = 400
	resultNotFound                = 500
	resultHostMemoryAlreadyRegd   = 712
	resultHostMemoryNotRegistered = 713
	resultNotPermitted            = 800
	resultNotSupported            = 801
	resultSystemNotReady          = 802
	resultSystemDriverMismatch    = 803
	resultCompatNotSupported      = 804
	resultUnknown                 = 999
)

// resultNames names the codes above for drivers (or stand-ins) whose
// cuGetErrorName is missing or does not know the code.
var resultNames = map[int]string{
	resultSuccess:                 "CUDA_SUCCESS",
	resultInvalidValue:            "CUDA_ERROR_INVALID_VALUE",
	resultOutOfMemory:             "CUDA_ERROR_OUT_OF_MEMORY",
	resultNotInitialized:          "CUDA_ERROR_NOT_INITIALIZED",
	resultDeinitialized:           "CUDA_ERROR_DEINITIALIZED",
	resultStubLibrary:             "CUDA_ERROR_STUB_LIBRARY",
	resultDeviceUnavailable:       "CUDA_ERROR_DEVICE_UNAVAILABLE",
	resultNoDevice:                "CUDA_ERROR_NO_DEVICE",
	resultInvalidDevice:           "CUDA_ERROR_INVALID_DEVICE",
	resultInvalidContext:          "CUDA_ERROR_INVALID_CONTEXT",
	resultOperatingSystem:         "CUDA_ERROR_OPERATING_SYSTEM",
	resultInvalidHandle:           "CUDA_ERROR_INVALID_HANDLE",
	resultNotFound:                "CUDA_ERROR_NOT_FOUND",
	resultHostMemoryAlreadyRegd:   "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	resultHostMemoryNotRegistered: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	resultNotPermitted:            "CUDA_ERROR_NOT_PERMITTED",
	resultNotSupported:            "CUDA_ERROR_NOT_SUPPORTED",
	resultSystemNotReady:          "CUDA_ERROR_SYSTEM_NOT_READY",
	resultSystemDriverMismatch:    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	resultCompatNotSupported:      "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	resultUnknown:                 "CUDA_ERROR_UNKNOWN",
}

// Error is a failed CUDA driver call. It matches accel.ErrOutOfMemory for
// CUDA_ERROR_OUT_OF_MEMORY and accel.ErrUnavailable for the codes that mean
// there is no usable GPU or driver.
type Error struct {
	Call    string // the driver function: "cuMemAlloc_v2"
	Code    int    // the CUresult
	Name    string // "CUDA_ERROR_OUT_OF_MEMORY"
	Message string // the driver's description, when it gives one
}

func (e *Error) Error() string {
	s := fmt.Sprintf("cuda: %s failed: %s (%d)", e.Call, e.Name, e.Code)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is maps result codes to accel's sentinels.
func (e *Error) Is(target error) bool {
	switch target {
	case accel.ErrOutOfMemory:
		return e.Code == resultOutOfMemory
	case accel.ErrUnavailable:
		switch e.Code {
		case resultNoDevice, resultInvalidDevice, resultStubLibrary, resultDeviceUnavailable,
			resultSystemNotReady, resultSystemDriverMismatch, resultCompatNotSupported,
			resultNotInitialized, resultDeinitialized:
			return true
		}
	}
	return false
}

// newError builds an Error, naming the code with the driver's
// cuGetErrorName/cuGetErrorString when it has them (name and msg may be
// empty) and with resultNames otherwise.
func newError(call string, code int, name, msg string) *Error {
	if name == "" {
		if n, ok := resultNames[code]; ok {
			name = n
		} else {
			name = fmt.Sprintf("CUresult(%d)", code)
		}
	}
	return &Error{Call: call, Code: code, Name: name, Message: msg}
}

// errNoCgo is what every entry point returns in a build without cgo.
var errNoCgo = fmt.Errorf("cuda: zinf was built without cgo (CGO_ENABLED=0), so it cannot load %s; rebuild with CGO_ENABLED=1 and a C compiler to use a GPU: %w",
	DefaultLibrary, accel.ErrUnavailable)

// unavailable wraps err (which says what is missing) so that it matches
// accel.ErrUnavailable.
func unavailable(err error) error {
	if errors.Is(err, accel.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, accel.ErrUnavailable)
}
