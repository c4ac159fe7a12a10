// Package cuda drives a real NVIDIA GPU as an accel.Device through the CUDA
// driver API, loaded at run time.
//
// Use:
//
//	dev, err := cuda.Open(cuda.Options{Ordinal: 0})
//	if errors.Is(err, accel.ErrUnavailable) {
//		// no GPU here: err says what is missing; use accel.NewSim instead
//	}
//	defer dev.Close()
//
// Probe reports the device's name, memory and driver version without
// keeping it open, for diagnostics (`zinf doctor`).
//
// # Why the driver API, loaded with dlopen
//
// The library is libcuda.so.1, which the NVIDIA driver installs: it is
// present wherever a GPU works, whereas the runtime (libcudart) comes with a
// toolkit version that must match. zinf is built without CUDA headers or
// libraries and links nothing from CUDA: it opens the library with dlopen,
// resolves the entry points with dlsym, and calls them through C function
// pointers. The same binary therefore runs on machines without a GPU (Open
// fails with accel.ErrUnavailable, saying whether the library, the driver
// or the device is missing) and on GPU machines with any recent driver.
// Options.Library or $ZINF_CUDA_LIBRARY point at another library; the
// tests use that to load a stand-in built from testdata/cuda_standin.c, so
// the bindings run on every CI machine.
//
// cgo plus dlopen rather than a pure-Go loader: calling C functions from Go
// without cgo means reimplementing the C calling convention, thread-local
// storage and signal handling that the driver relies on (it starts threads
// and keeps the current context in thread-local storage). cgo gets all of
// that right and costs a C compiler at build time only. A build with
// CGO_ENABLED=0 still compiles: Open and Probe then fail with an error
// matching accel.ErrUnavailable that says the binary was built without cgo.
//
// # Contexts and threads
//
// The Device uses the GPU's primary context, shared with any other CUDA
// library in the process. A CUDA context is current per OS thread, and
// goroutines move between threads, so each driver call is made from a C
// helper that first makes the context current, in the same cgo call: no
// method depends on the calling thread, and none locks one. WithContext
// runs a function on a locked thread with the context current, for code
// that calls other CUDA libraries (package gds uses it for cuFile).
//
// # Caveats
//
//   - Host buffers handed to CopyToDevice/CopyFromDevice must stay valid
//     until the stream is synchronized; for truly asynchronous DMA they
//     should be registered with RegisterHost (the buffers pool's memory is
//     mmap'ed outside the Go heap, which is what RegisterHost expects).
//   - Free does not wait for copies in flight on the memory: synchronize
//     the streams that use it first.
//   - Every CUresult is checked; failures are *Error values naming the
//     call and the code (CUDA_ERROR_OUT_OF_MEMORY matches
//     accel.ErrOutOfMemory).
//   - The library is loaded once per process and never unloaded.
package cuda
