//go:build cgo

package gds

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

// The cuFile types zinf needs, declared here so that no cuFile headers are
// required to build. They match cufile.h on 64-bit Linux.
typedef struct { int err; int cu_err; } CUfileError_t; // CUfileOpError, CUresult
typedef void *CUfileHandle_t;
typedef struct {
	int type; // CUfileFileHandleType
	union { int fd; void *handle; } handle;
	const void *fs_ops; // const CUfileFSOps_t *; NULL for kernel filesystems
} CUfileDescr_t;

enum { ZINF_CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1 };

// The layouts the library was built with: an 8-byte error returned by value
// and a 24-byte descriptor with the union 8-byte aligned.
_Static_assert(sizeof(CUfileError_t) == 8, "CUfileError_t is {int err; int cu_err}");
_Static_assert(offsetof(CUfileDescr_t, handle) == 8, "CUfileDescr_t.handle is 8-byte aligned");
_Static_assert(offsetof(CUfileDescr_t, fs_ops) == 16, "CUfileDescr_t.fs_ops follows the union");
_Static_assert(sizeof(CUfileDescr_t) == 24, "CUfileDescr_t is 24 bytes");
_Static_assert(sizeof(off_t) == 8, "off_t is 64-bit");

typedef struct {
	CUfileError_t (*DriverOpen)(void);
	CUfileError_t (*DriverClose)(void);
	CUfileError_t (*HandleRegister)(CUfileHandle_t *, CUfileDescr_t *);
	void (*HandleDeregister)(CUfileHandle_t);
	CUfileError_t (*BufRegister)(const void *, size_t, int);
	CUfileError_t (*BufDeregister)(const void *);
	ssize_t (*Read)(CUfileHandle_t, void *, size_t, off_t, off_t);
	ssize_t (*Write)(CUfileHandle_t, const void *, size_t, off_t, off_t);
	void *BatchIOSetUp; // probed only
} zinf_cufile_api;

// The loader (internal/base/dl) fills this struct as an array of pointers, one
// per entry of cufileSymbols in order; the assertion keeps the two the
// same length.
_Static_assert(sizeof(zinf_cufile_api) == 9 * sizeof(void *), "zinf_cufile_api is 9 pointers");

static CUfileError_t zinf_cufile_driver_open(zinf_cufile_api *a) { return a->DriverOpen(); }
static CUfileError_t zinf_cufile_driver_close(zinf_cufile_api *a) { return a->DriverClose(); }

static CUfileError_t zinf_cufile_handle_register(zinf_cufile_api *a, int fd, uintptr_t *out) {
	CUfileDescr_t d = {0};
	d.type = ZINF_CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = fd;
	d.fs_ops = NULL;
	CUfileHandle_t h = NULL;
	CUfileError_t e = a->HandleRegister(&h, &d);
	*out = (uintptr_t)h;
	return e;
}
static void zinf_cufile_handle_deregister(zinf_cufile_api *a, uintptr_t h) { a->HandleDeregister((CUfileHandle_t)h); }
static CUfileError_t zinf_cufile_buf_register(zinf_cufile_api *a, uintptr_t p, size_t n) {
	return a->BufRegister((const void *)p, n, 0);
}
static CUfileError_t zinf_cufile_buf_deregister(zinf_cufile_api *a, uintptr_t p) {
	return a->BufDeregister((const void *)p);
}
static ssize_t zinf_cufile_read(zinf_cufile_api *a, uintptr_t h, uintptr_t base, size_t n, off_t foff, off_t doff) {
	return a->Read((CUfileHandle_t)h, (void *)base, n, foff, doff);
}
static ssize_t zinf_cufile_write(zinf_cufile_api *a, uintptr_t h, uintptr_t base, size_t n, off_t foff, off_t doff) {
	return a->Write((CUfileHandle_t)h, (const void *)base, n, foff, doff);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/zinfio/zinf/internal/base/dl"
)

type cgoCuFile struct {
	lib string
	api *C.zinf_cufile_api // C memory, never freed: see loadCuFile
}

// cufileSymbols are the library's entry points, in zinf_cufile_api's
// order. cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 (since GDS
// 1.4); older libraries export the plain name only. The batch API is only
// probed.
var cufileSymbols = [...]dl.Symbol{
	{Name: "cuFileDriverOpen", Required: true},
	{Name: "cuFileDriverClose_v2", Fallback: "cuFileDriverClose", Required: true},
	{Name: "cuFileHandleRegister", Required: true},
	{Name: "cuFileHandleDeregister", Required: true},
	{Name: "cuFileBufRegister", Required: true},
	{Name: "cuFileBufDeregister", Required: true},
	{Name: "cuFileRead", Required: true},
	{Name: "cuFileWrite", Required: true},
	{Name: "cuFileBatchIOSetUp"},
}

// The table the loader fills must be exactly zinf_cufile_api.
var (
	_ [unsafe.Sizeof(C.zinf_cufile_api{}) - uintptr(len(cufileSymbols))*unsafe.Sizeof(uintptr(0))]struct{}
	_ [uintptr(len(cufileSymbols))*unsafe.Sizeof(uintptr(0)) - unsafe.Sizeof(C.zinf_cufile_api{})]struct{}
)

// cufiles loads each cuFile library once per process, and never closes it
// (libcufile starts threads that do not survive dlclose). One value per
// path matters: the driver reference counts are kept per library.
var cufiles = dl.NewCache(cufileSymbols[:], func(l *dl.Library) *cgoCuFile {
	return &cgoCuFile{lib: l.Path(), api: (*C.zinf_cufile_api)(l.Table())}
})

// loadCuFile returns the cuFile library at path, loading it on first use.
func loadCuFile(path string) (cufile, error) {
	cf, err := cufiles.Load(path)
	if err != nil {
		var missing *dl.MissingSymbolError
		var open *dl.OpenError
		switch {
		case errors.As(err, &missing):
			return nil, unavailable(fmt.Errorf("gds: %s is not a usable cuFile library: it lacks %s", path, missing.Symbol))
		case errors.As(err, &open):
			return nil, unavailable(fmt.Errorf("gds: cannot load the cuFile library %q (install GPUDirect Storage, e.g. the nvidia-gds or libcufile package, or set %s to its path): %s",
				path, LibraryEnv, open.Reason))
		}
		return nil, unavailable(fmt.Errorf("gds: loading the cuFile library %q: %w", path, err))
	}
	return cf, nil
}

func (c *cgoCuFile) path() string   { return c.lib }
func (c *cgoCuFile) hasBatch() bool { return c.api.BatchIOSetUp != nil }

func check(call string, e C.CUfileError_t) error {
	if e.err == 0 {
		return nil
	}
	return &CuFileError{Call: call, Code: int(e.err), CUDACode: int(e.cu_err)}
}

func (c *cgoCuFile) driverOpen() error {
	return check("cuFileDriverOpen", C.zinf_cufile_driver_open(c.api))
}

func (c *cgoCuFile) driverClose() error {
	return check("cuFileDriverClose_v2", C.zinf_cufile_driver_close(c.api))
}

func (c *cgoCuFile) handleRegister(fd int) (uintptr, error) {
	var h C.uintptr_t
	err := check("cuFileHandleRegister", C.zinf_cufile_handle_register(c.api, C.int(fd), &h))
	return uintptr(h), err
}

func (c *cgoCuFile) handleDeregister(h uintptr) {
	C.zinf_cufile_handle_deregister(c.api, C.uintptr_t(h))
}

func (c *cgoCuFile) bufRegister(p uintptr, n int64) error {
	return check("cuFileBufRegister", C.zinf_cufile_buf_register(c.api, C.uintptr_t(p), C.size_t(n)))
}

func (c *cgoCuFile) bufDeregister(p uintptr) error {
	return check("cuFileBufDeregister", C.zinf_cufile_buf_deregister(c.api, C.uintptr_t(p)))
}

// errnoOf extracts the errno cgo reports for a call (cgo clears errno
// before the call, so it is the call's own).
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	errors.As(err, &errno)
	return errno
}

func (c *cgoCuFile) read(h, base uintptr, size, fileOff, devOff int64) (int64, error) {
	ret, err := C.zinf_cufile_read(c.api, C.uintptr_t(h), C.uintptr_t(base), C.size_t(size), C.off_t(fileOff), C.off_t(devOff))
	return ioResult("cuFileRead", int64(ret), errnoOf(err))
}

func (c *cgoCuFile) write(h, base uintptr, size, fileOff, devOff int64) (int64, error) {
	ret, err := C.zinf_cufile_write(c.api, C.uintptr_t(h), C.uintptr_t(base), C.size_t(size), C.off_t(fileOff), C.off_t(devOff))
	return ioResult("cuFileWrite", int64(ret), errnoOf(err))
}
