//go:build cgo

package cuda

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// The few CUDA driver API types zinf needs, declared here so that no CUDA
// headers are required to build. They match cuda.h on 64-bit Linux.
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;

enum { ZINF_CU_STREAM_NON_BLOCKING = 0x1, ZINF_CU_MEMHOSTREGISTER_PORTABLE = 0x1 };

// zinf_cuda_api holds the driver's entry points, resolved with dlsym.
typedef struct {
	CUresult (*Init)(unsigned int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceTotalMem)(size_t *, CUdevice);
	CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*PrimaryCtxRelease)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*MemGetInfo)(size_t *, size_t *);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*StreamCreate)(CUstream *, unsigned int);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*StreamQuery)(CUstream);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*MemHostRegister)(void *, size_t, unsigned int);
	CUresult (*MemHostUnregister)(void *);
	CUresult (*GetErrorName)(CUresult, const char **);
	CUresult (*GetErrorString)(CUresult, const char **);
} zinf_cuda_api;

// The loader (internal/base/dl) fills this struct as an array of pointers, one
// per entry of cudaSymbols in driver order; the assertion keeps the two
// the same length.
_Static_assert(sizeof(zinf_cuda_api) == 22 * sizeof(void *), "zinf_cuda_api is 22 function pointers");

// zinf_rc is a call's result and whether it failed making the context
// current (step 1) or in the call itself (step 0).
typedef struct { CUresult rc; int step; } zinf_rc;

#define ZINF_IN_CTX(a, ctx, call) do { \
	zinf_rc r = {0, 1}; \
	r.rc = (a)->CtxSetCurrent((CUcontext)(ctx)); \
	if (r.rc != 0) return r; \
	r.step = 0; \
	r.rc = (call); \
	return r; \
} while (0)

static const char *zinf_cu_error_name(zinf_cuda_api *a, CUresult rc) {
	const char *s = NULL;
	if (a->GetErrorName == NULL || a->GetErrorName(rc, &s) != 0) return NULL;
	return s;
}
static const char *zinf_cu_error_string(zinf_cuda_api *a, CUresult rc) {
	const char *s = NULL;
	if (a->GetErrorString == NULL || a->GetErrorString(rc, &s) != 0) return NULL;
	return s;
}

static CUresult zinf_cu_init(zinf_cuda_api *a) { return a->Init(0); }
static CUresult zinf_cu_driver_version(zinf_cuda_api *a, int *v) { return a->DriverGetVersion(v); }
static CUresult zinf_cu_device_count(zinf_cuda_api *a, int *n) { return a->DeviceGetCount(n); }
static CUresult zinf_cu_device_get(zinf_cuda_api *a, CUdevice *d, int ordinal) { return a->DeviceGet(d, ordinal); }
static CUresult zinf_cu_device_name(zinf_cuda_api *a, char *buf, int len, CUdevice d) { return a->DeviceGetName(buf, len, d); }
static CUresult zinf_cu_device_total_mem(zinf_cuda_api *a, size_t *n, CUdevice d) { return a->DeviceTotalMem(n, d); }
static CUresult zinf_cu_primary_retain(zinf_cuda_api *a, uintptr_t *ctx, CUdevice d) {
	CUcontext c = NULL;
	CUresult rc = a->PrimaryCtxRetain(&c, d);
	*ctx = (uintptr_t)c;
	return rc;
}
static CUresult zinf_cu_primary_release(zinf_cuda_api *a, CUdevice d) { return a->PrimaryCtxRelease(d); }
static CUresult zinf_cu_set_current(zinf_cuda_api *a, uintptr_t ctx) { return a->CtxSetCurrent((CUcontext)ctx); }

static zinf_rc zinf_cu_mem_get_info(zinf_cuda_api *a, uintptr_t ctx, size_t *free, size_t *total) {
	ZINF_IN_CTX(a, ctx, a->MemGetInfo(free, total));
}
static zinf_rc zinf_cu_mem_alloc(zinf_cuda_api *a, uintptr_t ctx, CUdeviceptr *p, size_t n) {
	ZINF_IN_CTX(a, ctx, a->MemAlloc(p, n));
}
static zinf_rc zinf_cu_mem_free(zinf_cuda_api *a, uintptr_t ctx, CUdeviceptr p) {
	ZINF_IN_CTX(a, ctx, a->MemFree(p));
}
static zinf_rc zinf_cu_stream_create(zinf_cuda_api *a, uintptr_t ctx, uintptr_t *s) {
	zinf_rc r = {0, 1};
	r.rc = a->CtxSetCurrent((CUcontext)ctx);
	if (r.rc != 0) return r;
	r.step = 0;
	CUstream st = NULL;
	r.rc = a->StreamCreate(&st, ZINF_CU_STREAM_NON_BLOCKING);
	*s = (uintptr_t)st;
	return r;
}
static zinf_rc zinf_cu_stream_destroy(zinf_cuda_api *a, uintptr_t ctx, uintptr_t s) {
	ZINF_IN_CTX(a, ctx, a->StreamDestroy((CUstream)s));
}
static zinf_rc zinf_cu_stream_sync(zinf_cuda_api *a, uintptr_t ctx, uintptr_t s) {
	ZINF_IN_CTX(a, ctx, a->StreamSynchronize((CUstream)s));
}
static zinf_rc zinf_cu_stream_query(zinf_cuda_api *a, uintptr_t ctx, uintptr_t s) {
	ZINF_IN_CTX(a, ctx, a->StreamQuery((CUstream)s));
}
static zinf_rc zinf_cu_htod_async(zinf_cuda_api *a, uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n, uintptr_t s) {
	ZINF_IN_CTX(a, ctx, a->MemcpyHtoDAsync(dst, src, n, (CUstream)s));
}
static zinf_rc zinf_cu_dtoh_async(zinf_cuda_api *a, uintptr_t ctx, void *dst, CUdeviceptr src, size_t n, uintptr_t s) {
	ZINF_IN_CTX(a, ctx, a->MemcpyDtoHAsync(dst, src, n, (CUstream)s));
}
static zinf_rc zinf_cu_host_register(zinf_cuda_api *a, uintptr_t ctx, void *p, size_t n) {
	ZINF_IN_CTX(a, ctx, a->MemHostRegister(p, n, ZINF_CU_MEMHOSTREGISTER_PORTABLE));
}
static zinf_rc zinf_cu_host_unregister(zinf_cuda_api *a, uintptr_t ctx, void *p) {
	ZINF_IN_CTX(a, ctx, a->MemHostUnregister(p));
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/zinfio/zinf/internal/base/dl"
)

// cgoDriver calls the driver library through the entry points dlsym found.
type cgoDriver struct {
	lib string
	api *C.zinf_cuda_api // C memory, never freed: see loadDriver
}

// cudaSymbols are the driver's entry points, in zinf_cuda_api's order. The
// _v2 entry points are what cuda.h's macros map the plain names to since
// CUDA 3.2 (4.0 for streams, 11.0 for the primary context release); the
// plain name is the fallback for older drivers.
var cudaSymbols = [...]dl.Symbol{
	{Name: "cuInit", Required: true},
	{Name: "cuDriverGetVersion", Required: true},
	{Name: "cuDeviceGetCount", Required: true},
	{Name: "cuDeviceGet", Required: true},
	{Name: "cuDeviceGetName", Required: true},
	{Name: "cuDeviceTotalMem_v2", Fallback: "cuDeviceTotalMem", Required: true},
	{Name: "cuDevicePrimaryCtxRetain", Required: true},
	{Name: "cuDevicePrimaryCtxRelease_v2", Fallback: "cuDevicePrimaryCtxRelease", Required: true},
	{Name: "cuCtxSetCurrent", Required: true},
	{Name: "cuMemGetInfo_v2", Required: true},
	{Name: "cuMemAlloc_v2", Required: true},
	{Name: "cuMemFree_v2", Required: true},
	{Name: "cuStreamCreate", Required: true},
	{Name: "cuStreamDestroy_v2", Fallback: "cuStreamDestroy", Required: true},
	{Name: "cuStreamSynchronize", Required: true},
	{Name: "cuStreamQuery", Required: true},
	{Name: "cuMemcpyHtoDAsync_v2", Required: true},
	{Name: "cuMemcpyDtoHAsync_v2", Required: true},
	{Name: "cuMemHostRegister_v2", Fallback: "cuMemHostRegister", Required: true},
	{Name: "cuMemHostUnregister", Required: true},
	{Name: "cuGetErrorName"},
	{Name: "cuGetErrorString"},
}

// The table the loader fills must be exactly zinf_cuda_api.
var (
	_ [unsafe.Sizeof(C.zinf_cuda_api{}) - uintptr(len(cudaSymbols))*unsafe.Sizeof(uintptr(0))]struct{}
	_ [uintptr(len(cudaSymbols))*unsafe.Sizeof(uintptr(0)) - unsafe.Sizeof(C.zinf_cuda_api{})]struct{}
)

// drivers loads each driver library once per process. Libraries are never
// closed: the CUDA driver keeps threads and state that do not survive
// dlclose, and a process opens at most a handful of them.
var drivers = dl.NewCache(cudaSymbols[:], func(l *dl.Library) *cgoDriver {
	return &cgoDriver{lib: l.Path(), api: (*C.zinf_cuda_api)(l.Table())}
})

// loadDriver returns the driver library at path, loading it on first use.
func loadDriver(path string) (driver, error) {
	d, err := drivers.Load(path)
	if err != nil {
		var missing *dl.MissingSymbolError
		var open *dl.OpenError
		switch {
		case errors.As(err, &missing):
			return nil, unavailable(fmt.Errorf("cuda: %s is not a usable CUDA driver library: it lacks %s", path, missing.Symbol))
		case errors.As(err, &open):
			return nil, unavailable(fmt.Errorf("cuda: cannot load the CUDA driver library %q (is the NVIDIA driver installed? set %s to its path): %s",
				path, LibraryEnv, open.Reason))
		}
		return nil, unavailable(fmt.Errorf("cuda: loading the CUDA driver library %q: %w", path, err))
	}
	return d, nil
}

func (d *cgoDriver) path() string { return d.lib }

// check turns a CUresult into nil or an *Error naming call.
func (d *cgoDriver) check(call string, rc C.CUresult) error {
	if rc == 0 {
		return nil
	}
	var name, msg string
	if s := C.zinf_cu_error_name(d.api, rc); s != nil {
		name = C.GoString(s)
	}
	if s := C.zinf_cu_error_string(d.api, rc); s != nil {
		msg = C.GoString(s)
	}
	return newError(call, int(rc), name, msg)
}

// checkIn is check for a call made in a context.
func (d *cgoDriver) checkIn(call string, r C.zinf_rc) error {
	if r.step == 1 {
		return d.check("cuCtxSetCurrent (before "+call+")", r.rc)
	}
	return d.check(call, r.rc)
}

func (d *cgoDriver) init() error { return d.check("cuInit", C.zinf_cu_init(d.api)) }

func (d *cgoDriver) driverVersion() (int, error) {
	var v C.int
	err := d.check("cuDriverGetVersion", C.zinf_cu_driver_version(d.api, &v))
	return int(v), err
}

func (d *cgoDriver) deviceCount() (int, error) {
	var n C.int
	err := d.check("cuDeviceGetCount", C.zinf_cu_device_count(d.api, &n))
	return int(n), err
}

func (d *cgoDriver) deviceGet(ordinal int) (int32, error) {
	var dev C.CUdevice
	err := d.check("cuDeviceGet", C.zinf_cu_device_get(d.api, &dev, C.int(ordinal)))
	return int32(dev), err
}

func (d *cgoDriver) deviceName(dev int32) (string, error) {
	buf := (*C.char)(C.calloc(256, 1))
	defer C.free(unsafe.Pointer(buf))
	if err := d.check("cuDeviceGetName", C.zinf_cu_device_name(d.api, buf, 255, C.CUdevice(dev))); err != nil {
		return "", err
	}
	return C.GoString(buf), nil
}

func (d *cgoDriver) deviceTotalMem(dev int32) (int64, error) {
	var n C.size_t
	err := d.check("cuDeviceTotalMem_v2", C.zinf_cu_device_total_mem(d.api, &n, C.CUdevice(dev)))
	return int64(n), err
}

func (d *cgoDriver) primaryCtxRetain(dev int32) (uintptr, error) {
	var ctx C.uintptr_t
	err := d.check("cuDevicePrimaryCtxRetain", C.zinf_cu_primary_retain(d.api, &ctx, C.CUdevice(dev)))
	return uintptr(ctx), err
}

func (d *cgoDriver) primaryCtxRelease(dev int32) error {
	return d.check("cuDevicePrimaryCtxRelease_v2", C.zinf_cu_primary_release(d.api, C.CUdevice(dev)))
}

func (d *cgoDriver) setCurrent(ctx uintptr) error {
	return d.check("cuCtxSetCurrent", C.zinf_cu_set_current(d.api, C.uintptr_t(ctx)))
}

func (d *cgoDriver) memGetInfo(ctx uintptr) (int64, int64, error) {
	var free, total C.size_t
	err := d.checkIn("cuMemGetInfo_v2", C.zinf_cu_mem_get_info(d.api, C.uintptr_t(ctx), &free, &total))
	return int64(free), int64(total), err
}

func (d *cgoDriver) memAlloc(ctx uintptr, size int64) (uint64, error) {
	var p C.CUdeviceptr
	err := d.checkIn("cuMemAlloc_v2", C.zinf_cu_mem_alloc(d.api, C.uintptr_t(ctx), &p, C.size_t(size)))
	return uint64(p), err
}

func (d *cgoDriver) memFree(ctx uintptr, p uint64) error {
	return d.checkIn("cuMemFree_v2", C.zinf_cu_mem_free(d.api, C.uintptr_t(ctx), C.CUdeviceptr(p)))
}

func (d *cgoDriver) streamCreate(ctx uintptr) (uintptr, error) {
	var s C.uintptr_t
	err := d.checkIn("cuStreamCreate", C.zinf_cu_stream_create(d.api, C.uintptr_t(ctx), &s))
	return uintptr(s), err
}

func (d *cgoDriver) streamDestroy(ctx, s uintptr) error {
	return d.checkIn("cuStreamDestroy_v2", C.zinf_cu_stream_destroy(d.api, C.uintptr_t(ctx), C.uintptr_t(s)))
}

func (d *cgoDriver) streamSynchronize(ctx, s uintptr) error {
	return d.checkIn("cuStreamSynchronize", C.zinf_cu_stream_sync(d.api, C.uintptr_t(ctx), C.uintptr_t(s)))
}

// cudaErrorNotReady is CUDA_ERROR_NOT_READY: cuStreamQuery's "not yet".
const cudaErrorNotReady = 600

func (d *cgoDriver) streamQuery(ctx, s uintptr) (bool, error) {
	r := C.zinf_cu_stream_query(d.api, C.uintptr_t(ctx), C.uintptr_t(s))
	if r.step == 0 && r.rc == cudaErrorNotReady {
		return false, nil
	}
	if err := d.checkIn("cuStreamQuery", r); err != nil {
		return false, err
	}
	return true, nil
}

// The copies pass host memory to C for the duration of the call, as cgo
// allows; the driver reads or writes it asynchronously afterwards, which is
// why the accel.Device contract makes the caller keep it alive and
// untouched until the stream is synchronized. zinf's host buffers are
// mmap'ed outside the Go heap, so the garbage collector never sees them.

func (d *cgoDriver) memcpyHtoDAsync(ctx uintptr, dst uint64, src []byte, s uintptr) error {
	return d.checkIn("cuMemcpyHtoDAsync_v2", C.zinf_cu_htod_async(d.api, C.uintptr_t(ctx), C.CUdeviceptr(dst),
		unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src)), C.uintptr_t(s)))
}

func (d *cgoDriver) memcpyDtoHAsync(ctx uintptr, dst []byte, src uint64, s uintptr) error {
	return d.checkIn("cuMemcpyDtoHAsync_v2", C.zinf_cu_dtoh_async(d.api, C.uintptr_t(ctx),
		unsafe.Pointer(unsafe.SliceData(dst)), C.CUdeviceptr(src), C.size_t(len(dst)), C.uintptr_t(s)))
}

func (d *cgoDriver) hostRegister(ctx uintptr, b []byte) error {
	return d.checkIn("cuMemHostRegister_v2", C.zinf_cu_host_register(d.api, C.uintptr_t(ctx),
		unsafe.Pointer(unsafe.SliceData(b)), C.size_t(len(b))))
}

func (d *cgoDriver) hostUnregister(ctx uintptr, b []byte) error {
	return d.checkIn("cuMemHostUnregister", C.zinf_cu_host_unregister(d.api, C.uintptr_t(ctx),
		unsafe.Pointer(unsafe.SliceData(b))))
}
