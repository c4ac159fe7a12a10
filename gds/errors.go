package gds

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/zinfio/zinf/aio"
)

// ErrUnavailable is matched by every error that means GPUDirect Storage
// cannot run here: no cuFile library, no GPU or CUDA driver, the cuFile
// driver failing to open, an unsupported filesystem, or a build without
// cgo. The error's text says which.
var ErrUnavailable = errors.New("gds: GPUDirect Storage unavailable")

// Failed requests are *aio.OpError values (Backend "gds" or "bounce"), so
// errors.Is(err, aio.ErrNoSpace), aio.ErrIO and aio.ErrShortTransfer work
// the same for both paths and for plain aio. Their Err is a *PieceError
// locating the failure; its cause is a syscall.Errno, a *CuFileError, a
// device error or a context error.

// PieceError locates a failure inside a request: the piece's file offset,
// device offset and length.
type PieceError struct {
	FileOffset   int64
	DeviceOffset int64
	Len          int64
	Err          error
}

func (e *PieceError) Error() string {
	return fmt.Sprintf("piece at file offset %d, device offset %d (%d bytes): %v", e.FileOffset, e.DeviceOffset, e.Len, e.Err)
}

// Unwrap returns the cause.
func (e *PieceError) Unwrap() error { return e.Err }

// cuFile status codes (cufile.h, enum CUfileOpError).
const (
	cuFileSuccess               = 0
	cuFileDriverNotInitialized  = 5001
	cuFileDriverVersionMismatch = 5004
	cuFileDriverVersionRead     = 5005
	cuFilePlatformNotSupported  = 5007
	cuFileIONotSupported        = 5008
	cuFileDeviceNotSupported    = 5009
	cuFileNVFSDriverError       = 5010
	cuFileCUDADriverError       = 5011
	cuFileDIONotSet             = 5020
	cuFileNVFSSetupError        = 5033
	cuFileIODisabled            = 5034
)

// cuFileNames names CUfileOpError values; cuFile exports no function for
// this (cufile.h's CUFILE_ERRSTR is an inline helper).
var cuFileNames = map[int]string{
	0:    "CU_FILE_SUCCESS",
	5001: "CU_FILE_DRIVER_NOT_INITIALIZED",
	5002: "CU_FILE_DRIVER_INVALID_PROPS",
	5003: "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
	5004: "CU_FILE_DRIVER_VERSION_MISMATCH",
	5005: "CU_FILE_DRIVER_VERSION_READ_ERROR",
	5006: "CU_FILE_DRIVER_CLOSING",
	5007: "CU_FILE_PLATFORM_NOT_SUPPORTED",
	5008: "CU_FILE_IO_NOT_SUPPORTED",
	5009: "CU_FILE_DEVICE_NOT_SUPPORTED",
	5010: "CU_FILE_NVFS_DRIVER_ERROR",
	5011: "CU_FILE_CUDA_DRIVER_ERROR",
	5012: "CU_FILE_CUDA_POINTER_INVALID",
	5013: "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
	5014: "CU_FILE_CUDA_POINTER_RANGE_ERROR",
	5015: "CU_FILE_CUDA_CONTEXT_MISMATCH",
	5016: "CU_FILE_INVALID_MAPPING_SIZE",
	5017: "CU_FILE_INVALID_MAPPING_RANGE",
	5018: "CU_FILE_INVALID_FILE_TYPE",
	5019: "CU_FILE_INVALID_FILE_OPEN_FLAG",
	5020: "CU_FILE_DIO_NOT_SET",
	5022: "CU_FILE_INVALID_VALUE",
	5023: "CU_FILE_MEMORY_ALREADY_REGISTERED",
	5024: "CU_FILE_MEMORY_NOT_REGISTERED",
	5025: "CU_FILE_PERMISSION_DENIED",
	5026: "CU_FILE_DRIVER_ALREADY_OPEN",
	5027: "CU_FILE_HANDLE_NOT_REGISTERED",
	5028: "CU_FILE_HANDLE_ALREADY_REGISTERED",
	5029: "CU_FILE_DEVICE_NOT_FOUND",
	5030: "CU_FILE_INTERNAL_ERROR",
	5031: "CU_FILE_GETNEWFD_FAILED",
	5033: "CU_FILE_NVFS_SETUP_ERROR",
	5034: "CU_FILE_IO_DISABLED",
	5035: "CU_FILE_BATCH_SUBMIT_FAILED",
	5036: "CU_FILE_GPU_MEMORY_PINNING_FAILED",
	5037: "CU_FILE_BATCH_FULL",
	5038: "CU_FILE_ASYNC_NOT_SUPPORTED",
}

// CuFileError is a failed cuFile call: the call, its CUfileOpError code and,
// for CU_FILE_CUDA_DRIVER_ERROR, the CUDA driver's CUresult.
type CuFileError struct {
	Call     string // "cuFileHandleRegister"
	Code     int    // CUfileOpError
	CUDACode int    // CUfileError_t.cu_err, when Code is CU_FILE_CUDA_DRIVER_ERROR
}

// CodeName returns the code's cufile.h name.
func (e *CuFileError) CodeName() string { return cuFileName(e.Code) }

func cuFileName(code int) string {
	if n, ok := cuFileNames[code]; ok {
		return n
	}
	return fmt.Sprintf("CUfileOpError(%d)", code)
}

func (e *CuFileError) Error() string {
	s := fmt.Sprintf("gds: %s failed: %s (%d)", e.Call, e.CodeName(), e.Code)
	if e.CUDACode != 0 {
		s += fmt.Sprintf(", CUDA driver error %d", e.CUDACode)
	}
	return s
}

// Is matches ErrUnavailable for the codes that mean GPUDirect Storage
// cannot work on this machine, device or file.
func (e *CuFileError) Is(target error) bool {
	if target != ErrUnavailable {
		return false
	}
	switch e.Code {
	case cuFileDriverNotInitialized, cuFileDriverVersionMismatch, cuFileDriverVersionRead,
		cuFilePlatformNotSupported, cuFileDeviceNotSupported, cuFileNVFSDriverError,
		cuFileNVFSSetupError, cuFileIODisabled:
		return true
	}
	return false
}

// ioResult interprets cuFileRead/cuFileWrite's return: bytes moved (>= 0),
// or -1 with errno set for a system error, or the negated CUfileOpError.
// Some versions return a negated errno instead of -1; values below the
// cuFile range are read that way.
func ioResult(call string, ret int64, errno syscall.Errno) (int64, error) {
	switch {
	case ret >= 0:
		return ret, nil
	case ret == -1:
		if errno == 0 {
			errno = syscall.EIO
		}
		return 0, errno
	case -ret >= 5000:
		return 0, &CuFileError{Call: call, Code: int(-ret)}
	default:
		return 0, syscall.Errno(-ret)
	}
}

// opError builds the error for a failed request.
func opError(backend, op string, f *File, fileOff, n, done int64, cause error) error {
	e := &aio.OpError{Op: op, Offset: fileOff, Bytes: int(n), Done: done, Backend: backend, Err: cause}
	if f != nil && f.af != nil {
		e.Path, e.Direct = f.Path(), f.Direct()
	}
	return e
}

// unavailable wraps err so that it matches ErrUnavailable.
func unavailable(err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, ErrUnavailable)
}

// errNoCgo is what every cuFile entry point returns in a build without cgo.
var errNoCgo = fmt.Errorf("gds: zinf was built without cgo (CGO_ENABLED=0), so it cannot load %s; rebuild with CGO_ENABLED=1 and a C compiler to use GPUDirect Storage: %w",
	DefaultLibrary, ErrUnavailable)

// nvidiaFSModule is where the nvidia-fs kernel module appears when loaded;
// tests point it elsewhere.
var nvidiaFSModule = "/sys/module/nvidia_fs"

// driverOpenHint says what a failing cuFileDriverOpen most likely lacks.
func driverOpenHint(code int) string {
	if _, err := os.Stat(nvidiaFSModule); err != nil {
		return fmt.Sprintf("the nvidia-fs kernel module is not loaded (%s is missing; load it with `modprobe nvidia_fs`, or enable cuFile's compatibility mode with \"allow_compat_mode\": true in cufile.json)", nvidiaFSModule)
	}
	switch code {
	case cuFileDriverVersionMismatch, cuFileDriverVersionRead:
		return "the nvidia-fs kernel module's version does not match libcufile"
	case cuFilePlatformNotSupported:
		return "this platform does not support GPUDirect Storage"
	case cuFileCUDADriverError:
		return "the CUDA driver failed inside cuFile"
	}
	return "see cufile.log in the working directory for cuFile's own diagnosis"
}
