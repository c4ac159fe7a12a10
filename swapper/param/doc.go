// Package param swaps ZeRO-3 partitioned parameters between NVMe, pinned
// host memory and the accelerator, as DeepSpeed's partitioned parameter
// swapper does for offload_param.
//
// Each rank owns 1/world of every parameter (Partition gives its element
// range). A parameter is registered on a tier: TierGPU and TierCPU
// partitions live in device or pinned memory for the whole run; TierNVMe
// partitions live in the swapper.Store and are swapped in on demand.
//
// # Use
//
//	s, _ := param.New(param.Options{Store: st, Pool: pool, DType: swapper.BFloat16, BufferCount: 4})
//	s.Register("layer0.w", 4096*4096, swapper.TierNVMe)
//	s.Init(ctx, "layer0.w", values) // this rank's partition, fp32
//
//	s.Prefetch("layer1.w")             // async, overlaps with compute on layer0
//	s.Wait(ctx, "layer0.w")            // barrier for this set only
//	s.ReadFloat32(ctx, "layer0.w", w)  // use it
//	s.Release("layer0.w")              // no write-back: params are read-only
//
//	w, _ := s.StageUpdate(ctx, "layer0.w", newValues) // from the optimizer
//	... stage every update of the step ...
//	if err := s.CommitUpdates(); err != nil { s.DiscardUpdates() }
//
// # States
//
// An NVMe partition is OnNVMe, InFlight (a swap-in was requested and has not
// finished) or Resident (in a pinned pool buffer). Prefetch moves OnNVMe to
// InFlight; the swap-in completes in the background; Wait blocks until the
// named partitions are Resident, demand-fetching any that nobody asked for
// (a demand miss, which jumps ahead of queued prefetches). Release drops the
// resident copy without writing it back. Options.BufferCount bounds how many
// partitions are InFlight or Resident at once; further requests queue and
// wait for a Release, they never fail for it. The pool's budget bounds them
// too: a swap-in waits for pool memory like any other Acquire. Slots are
// granted in request order, waited-for partitions first, and swap-ins ask
// the pool for memory in the order they were requested (one whose
// goroutine runs early waits for those before it to ask); when a waited-for
// swap-in is starved of a slot or of pool memory, a partition that was
// prefetched but not yet waited for or read gives way (preemption: it goes
// back to OnNVMe, or to the CPU cache), so over-eager prefetching, or
// consuming prefetches in another order, never deadlocks. Stats counts
// the preempted bytes (PreemptedBytes): read, given back, read again.
//
// The pool hands out a buffer from a free, aligned power-of-two block
// (buffers.SpanBytes), so free bytes are not enough: small partitions
// scattered over a region can leave no block for a large one. Wait
// therefore claims its set all at once, when every partition of it is
// resident, waiting for the largest first; until then a larger waited-for
// swap-in that the pool cannot place sends the smaller ones of a set back
// (and Wait fetches them again), a partition never giving way to one of
// its size or smaller. A staged update (StageUpdate, StageRange) that
// waits for memory makes unclaimed prefetches, and the smaller partitions
// of a Wait in progress, give way the same way (a step overlapping the
// backward pass stages one layer while BeginLayer waits for the next, and
// the pool serves the Wait's last partition only after the update queued
// before it), and while it or a waited-for swap-in waits, released
// partitions go back to the pool, not to the CPU cache.
//
// # CPU cache
//
// With Options.MaxInCPUBytes > 0, released partitions stay in a ristretto
// cache of pinned buffers (cost in bytes, IgnoreInternalCost), so a later
// swap-in of the same partition costs no I/O (DeepSpeed's max_in_cpu). Cache
// values are reference counted: eviction drops the cache's reference, and a
// buffer is returned to the pool only when no resident copy or reader still
// uses it. When the pool runs dry, a swap-in or a staged update evicts
// cached partitions (until the pool can serve it, or none is left) before
// it waits.
//
// # Device-resident swap-ins
//
// With Options.DeviceIO (DeepSpeed's use_gds for parameters), an NVMe
// partition swaps into device memory instead of a pinned buffer: the swap-in
// allocates it on Options.Device and reads it from the swap files with the
// DeviceIO, by GPUDirect Storage (gds.Engine) or through pinned staging
// buffers (gds.Bounce, which works with the simulated device too).
// ReadFloat32 copies it device -> host. Slots, prefetching, preemption and
// updates work as for pinned copies; a full device makes a swap-in wait
// while partitions this swapper holds may still be released, and fail with
// a clear error otherwise. The store's checksums are not verified on these
// swap-ins (the bytes never pass through host memory), and the CPU cache
// holds no device copies.
//
// # Updates
//
// Parameters change only at an optimizer step, and a step either happens
// as a whole or not at all: StageUpdate converts and writes each new
// partition aside (NVMe: copy-on-write to a staging name; CPU and GPU: new
// buffers), CommitUpdates waits for the staged writes and, only if all of
// them succeeded, makes them current at once (store.Rename), bumping each
// partition's generation so that stale resident copies, in-flight reads and
// cache entries are never served again. DiscardUpdates throws the staged
// updates away; the current values are untouched.
//
// # Snapshots
//
// Snapshot takes a consistent, read-only view of CPU- and GPU-tier
// partitions for an asynchronous checkpoint. CPU-tier copies are
// copy-on-write (a commit installs the staged buffer and never writes the
// current one), so the snapshot only retains their current buffers: it
// costs no copy, and the buffers a commit replaces stay allocated until
// the snapshot is released. GPU-tier partitions are copied to host
// buffers. NVMe partitions are not snapshotted here: their store pins its
// own versions (swapper.Store.Pin).
//
// # Caveats
//
//   - The store key of a partition is its name prefixed by
//     Options.KeyPrefix; staged updates use the key plus "@next.<seq>".
//   - A resident partition that is updated by CommitUpdates (or Init) is
//     swapped in again in the background; ReadFloat32 waits for it.
//   - BufferCount is a promise the caller keeps too: holding BufferCount
//     partitions that were waited for and waiting for one more, without
//     releasing any, waits until the context is done.
package param
