// Package gds moves tensor bytes between files on NVMe and device (GPU)
// memory: directly with NVIDIA GPUDirect Storage (cuFile), or through pinned
// host buffers when GPUDirect Storage is not there.
//
// # Use
//
// Select picks the path from the config's mode ("off", "auto", "required"):
//
//	dio, err := gds.Select("auto", dev, gds.SelectOptions{AIO: eng, Pool: pool,
//		GDS: gds.Options{Paths: []string{"/nvme/swap"}}})
//	f, err := dio.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
//	n, err := dio.ReadToDevice(ctx, f, mem, 0, fileOff, size)   // NVMe -> device
//	n, err = dio.WriteFromDevice(ctx, f, mem, 0, fileOff, size) // device -> NVMe
//
// "auto" takes GPUDirect Storage only where cuFile works end to end: its
// library loads, its driver opens, the filesystems of GDS.Paths are ones
// it supports, and it registers a file created in each of them
// (RegistrationCheck: cuFile may refuse every file of a disk, e.g. a
// virtio disk without udev properties, though its driver opens); otherwise
// the bounce path, with one warning saying why. "required" fails instead.
//
// Both paths implement DeviceIO and hand out the same *File type (an
// aio.File plus, for cuFile, its registered handle), so callers do not care
// which one Select chose; a File is used only with the DeviceIO that opened
// it. A request is split into BlockSizeBytes pieces, aligned to multiples of
// the block size in the file, and Parallelism goroutines work through them.
// Failures are *aio.OpError values (Backend "gds" or "bounce") naming the
// operation, path, offset and bytes done, with a *PieceError locating the
// piece; errors.Is works with aio.ErrNoSpace, aio.ErrIO and
// aio.ErrShortTransfer as for plain aio.
//
// # The cuFile Engine
//
// Open(dev, opts) loads libcufile.so.0 (or Options.Library, or
// $ZINF_CUFILE_LIBRARY) at run time and opens the cuFile driver (once per
// process, shared by every Engine). OpenFile registers each file with
// cuFileHandleRegister (an opaque fd, O_DIRECT where the filesystem allows);
// RegisterBuffer registers device allocations with cuFileBufRegister; both
// are cached and released on Close. Pieces are issued with cuFileRead and
// cuFileWrite: short transfers are continued, EINTR and EAGAIN retried, -1
// read as errno and other negative results as CUfileOpError codes. The
// batch API (cuFileBatchIOSetUp and friends) is probed but not used: the
// synchronous calls from Parallelism goroutines already keep several
// transfers in flight, and they need no extra structures whose layout
// changed between cuFile releases.
//
// Available(opts) says whether the Engine can work here, and if not, what
// is missing: the cuFile library (the loader's message), a GPU or CUDA
// driver (accel/cuda's diagnosis), a cuFile driver that opens (with its
// status code name and whether the nvidia-fs kernel module is loaded), or
// filesystem support for the configured paths.
//
// # The bounce path
//
// NewBounce(dev, eng, pool, opts) works with any accel.Device, the
// simulated one included: NVMe -> pinned staging buffer (the aio engine) ->
// device (an asynchronous copy), and back, double-buffered per slot so the
// disk and the device link work at the same time. It handles O_DIRECT
// alignment itself (see Bounce). Its staging buffers come from the buffers
// pool (purpose staging) and are held, and registered with the device,
// until Close.
//
// # Why cgo and dlopen
//
// Like accel/cuda, the cuFile bindings link nothing at build time: the
// library is opened with dlopen and called through C function pointers
// with struct layouts declared (and checked with static assertions) in the
// cgo preamble, so no CUDA or cuFile headers are needed and one binary runs
// with or without GPUDirect Storage. cgo rather than a pure-Go loader
// because cuFile returns structs by value, uses errno and starts its own
// threads, all of which the C toolchain gets right for free. Without cgo
// the package still builds; Available and Open then report that the
// binary was built without cgo, and Select falls back to the bounce path.
//
// # Caveats
//
//   - Close the Engine before the cuda.Device, and deregister a buffer
//     before freeing its memory.
//   - The bounce path widens unaligned writes on O_DIRECT files to whole
//     alignment blocks (read-modify-write); a write that ends past the end
//     of the file extends it to the next alignment boundary, and concurrent
//     writes sharing an alignment block must be ordered by the caller.
//   - Tests run the bindings against stand-in libraries built from
//     testdata/cufile_standin.c and accel/cuda/testdata/cuda_standin.c;
//     the real-GPU tests run with ZINF_GPU_TESTS=1 (GPU_TESTING.md has
//     the whole plan for a GPU machine).
package gds
