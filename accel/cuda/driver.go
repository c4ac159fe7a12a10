package cuda

// driver is the subset of the CUDA driver API zinf calls. Handles are the
// driver's pointers carried as uintptr: they point into the driver's memory,
// never the Go heap. Every method that needs a context takes it and makes it
// current on the calling OS thread in the same C call, so a goroutine that
// migrates between threads cannot run a call in the wrong context.
//
// The cgo build implements it over the library loaded with dlopen; a build
// without cgo has no implementation (loadDriver fails).
type driver interface {
	path() string
	init() error
	driverVersion() (int, error)
	deviceCount() (int, error)
	deviceGet(ordinal int) (int32, error)
	deviceName(dev int32) (string, error)
	deviceTotalMem(dev int32) (int64, error)
	primaryCtxRetain(dev int32) (uintptr, error)
	primaryCtxRelease(dev int32) error
	setCurrent(ctx uintptr) error
	memGetInfo(ctx uintptr) (free, total int64, err error)
	memAlloc(ctx uintptr, size int64) (uint64, error)
	memFree(ctx uintptr, p uint64) error
	streamCreate(ctx uintptr) (uintptr, error)
	streamDestroy(ctx, s uintptr) error
	streamSynchronize(ctx, s uintptr) error
	// streamQuery reports whether the stream's work is done
	// (cuStreamQuery: CUDA_ERROR_NOT_READY is "not yet", not an error).
	streamQuery(ctx, s uintptr) (bool, error)
	memcpyHtoDAsync(ctx uintptr, dst uint64, src []byte, s uintptr) error
	memcpyDtoHAsync(ctx uintptr, dst []byte, src uint64, s uintptr) error
	hostRegister(ctx uintptr, b []byte) error
	hostUnregister(ctx uintptr, b []byte) error
}
