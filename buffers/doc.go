// Package buffers provides zinf's pinned host memory: one arena of
// page-aligned memory outside the Go heap, locked into RAM when the memlock
// limit allows, from which reference-counted Buffers are handed out under a
// byte budget. Every byte that moves between NVMe, host and device passes
// through such a buffer: aio reads and writes them (O_DIRECT needs the
// alignment), the swappers keep parameters, optimizer state and gradients in
// them, and a GPU runtime registers the arena once (Pool.Regions) so that
// host-device copies run at full DMA speed. Pool.Register hands the arena
// to anything that registers memory and must be told before it goes away
// (an aio engine: io_uring registered buffers); the pool unregisters it
// before unmapping.
//
// # Use
//
//	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 4 << 30})
//	if err != nil { ... }
//	defer pool.Close()
//
//	buf, err := pool.Acquire(ctx, n, buffers.PurposeParams) // blocks while the budget is spent
//	if err != nil { ... }
//	defer buf.Release()
//	w := buf.Float32() // a view, no copy; buf.Bytes() for I/O
//
// A holder that hands the buffer to someone else for a while (an in-flight
// I/O, a reader on another goroutine) calls Retain first and the other side
// calls Release when done; the memory returns to the pool at the last
// Release and never earlier.
//
// # Design
//
// The arena is a single anonymous mmap of Options.CapacityBytes, so the
// budget is real memory, reserved once, and a runtime can register one region
// with the GPU. Buffers are carved from it by a binary buddy allocator whose
// granule is Options.MinBufferBytes (default 4 KiB, at least a page): a
// request of n bytes takes ceil(n/granule) granules from the smallest free
// power-of-two block that holds them, and the block's unused tail goes back
// to the free lists at once. So Cap() is Len() rounded up to the granule, a
// buffer starts at an address aligned to the granule (page aligned), and
// released neighbours merge back into larger blocks: once enough buffers are
// released a request that fits the budget always succeeds again. The price
// of the buddy scheme is that the largest single buffer is the largest
// power-of-two multiple of the granule within the capacity
// (Pool.MaxBufferBytes); choose a power-of-two capacity to allow a buffer as
// large as the arena. Fixed slots per tensor size were rejected: tensors and
// sub-groups come in many sizes, and slots would strand the budget.
//
// Acquire blocks, honouring its context, while the request does not fit.
// Waiters are served strictly in arrival order (a waiter queue with a
// one-slot channel each, no sync.Cond), so a large request is never starved
// by a stream of small ones; TryAcquire does not jump the queue either.
// Requests that can never fit fail at once with ErrTooLarge. A wait that
// can never be served fails too: Acquire calls whose context names a
// Holder (WithHolder) are tracked by holder, and when every buffer of the
// region a holder waits on is held by holders that wait themselves —
// nobody can release — their waits fail at once with ErrDeadlock, naming
// each holder, what it holds and what it waits for. Any other wait that
// sees no release for Options.StallTimeout fails with ErrStalled. The pool counts
// bytes and buffers per Purpose, tracks the peak, and Close reports leaked
// buffers by purpose.
//
// # Pinning
//
// Under PinAuto (the default) the arena is mlock'ed when RLIMIT_MEMLOCK (or
// CAP_IPC_LOCK) allows; otherwise the pool works unpinned and logs one
// warning naming the limit, the bytes wanted and how to raise it (ulimit -l,
// LimitMEMLOCK= in a systemd unit, docker --ulimit memlock). PinRequired
// turns that into an error wrapping ErrPinned; PinOff never pins.
//
// # Caveats
//
//   - Buffer memory is not zeroed between uses.
//   - Any slice taken from a Buffer is invalid after the last Release; the
//     race detector cannot see accesses to memory outside the Go heap, so
//     such bugs are only caught by Bytes returning nil after release.
//   - Over-releasing a buffer is logged and counted (Stats.Misuses), never a
//     panic, and never corrupts the pool, because a *Buffer is never reused.
//     That is also why Acquire makes one small allocation (the *Buffer);
//     Release and the blocking path allocate nothing in steady state.
//   - Close with buffers outstanding returns an error and leaves the arena
//     mapped until the last of them is released, then unmaps it.
//   - The allocator keeps about 9 bytes of Go-heap metadata per granule
//     (0.2% at 4 KiB granules); raise MinBufferBytes for very large arenas.
//   - Off Unix the arena comes from the Go heap (page aligned) and cannot be
//     pinned.
//
// BFloat16 and Float16 give the 16-bit float formats with correctly rounded
// (round to nearest, ties to even) conversions from float32, exact widening
// to float32, and bulk conversion functions.
package buffers
