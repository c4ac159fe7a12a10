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
// # Registered buffers and fixed files
//
// On io_uring, memory given to Engine.RegisterMemory (a pinned pool's
// arena: buffers.Pool.Register) is registered with every ring
// (IORING_REGISTER_BUFFERS): the kernel pins those pages once, and every
// piece lying inside one registered region is moved with READ_FIXED or
// WRITE_FIXED instead of having its pages pinned and unpinned per request.
// Every file is given a slot of the ring's fixed-file table on first use
// (IORING_REGISTER_FILES_UPDATE on a sparse table), so the kernel does not
// look the descriptor up per piece; the slot is freed when the File's
// descriptor is closed, and a file that cannot get one (table full) is
// used by its descriptor. Neither changes what a request does. Each
// fallback is explicit and logged once per engine: libaio and posix have
// neither feature (RegisterMemory returns an error matching
// errors.ErrUnsupported); a registration the kernel refuses (ENOMEM when
// the memlock limit is below the arena and the process lacks CAP_IPC_LOCK,
// the same limit that leaves a pool unpinned) moves that memory as
// ordinary memory, and RegisterMemory says why and what to raise.
// Stats.FixedBufferPieces and FixedFilePieces count the pieces that used
// them.
//
// No request is ever left waiting. Whatever a ring reports together with
// an error, its completions are delivered first; then a completion for an
// operation the ring did not hold is logged, counted
// (Stats.StrayCompletions) and ignored; completions the kernel dropped
// (an io_uring CQ overflow it could not even queue) fail exactly the
// requests they belonged to with ErrCompletionLost once every other
// operation is in, and the ring is replaced; a ring that refuses a
// submission fails that batch's requests; and a ring that cannot be reaped
// any more fails every request on it, then and later, with an error
// matching ErrRingFailed that names the backend, the ring and the cause.
// Close therefore always returns.
//
// # Testing every backend
//
// The tests run each capability on every backend the machine supports and
// log, then leave out, those it does not. On CI a misfiring probe would
// then quietly test posix alone, so the environment variable
// ZINF_REQUIRE_BACKENDS (a comma-separated list such as
// "uring,libaio,posix"; "gds" is also understood by the GPUDirect Storage
// tests) makes a listed backend that is unavailable fail the test, with
// the reason, instead of being skipped. The helper lives in
// internal/test/testenv for the tests of every package.
//
// Handle offers DeepNVMe's API shape (sync/async pread and pwrite by path
// with file offsets, Wait returning the number of completed requests) for
// users coming from DeepSpeed.
package aio
