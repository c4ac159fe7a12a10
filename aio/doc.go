// Package aio is zinf's asynchronous I/O engine: it moves tensor bytes
// between pinned host buffers and files on NVMe as fast as the device allows,
// and it never hides an error.
//
// One Engine interface has three backends:
//
//   - "uring": io_uring through raw syscalls (golang.org/x/sys/unix); the
//     default where the kernel allows it.
//   - "libaio": Linux kernel AIO (io_setup/io_submit/io_getevents), no cgo.
//   - "posix": a bounded pool of goroutines doing pread/pwrite; works on any
//     filesystem.
//
// "auto" picks the first of uring, libaio, posix that works and logs why.
//
// A Request is {Op, File, Offset, Buf}. The caller owns the Request struct and
// the buffer until Wait returns; Submit never allocates in steady state. A
// large request is split into BlockSizeBytes pieces, spread over
// IntraOpParallelism workers (one ring each) and kept QueueDepth deep. Every
// completion is checked: short transfers are resubmitted for the remainder,
// EINTR and EAGAIN are retried, EINVAL on an O_DIRECT file is reported as
// ErrAlignment, and any other failure comes back as an *OpError naming the
// operation, path, offset and bytes done.
//
// Files are opened once with OpenFile, which applies the O_DIRECT policy
// (DirectRequired, DirectOptional, DirectOff) and reads the alignment the
// file's filesystem or device demands. Nothing unaligned is ever sent to an
// O_DIRECT file: Submit rejects it with ErrAlignment before any I/O.
//
// Handle offers DeepNVMe's API shape (sync/async pread and pwrite by path
// with file offsets, Wait returning the number of completed requests) for
// users coming from DeepSpeed.
package aio
