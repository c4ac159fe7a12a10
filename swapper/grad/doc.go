// Package grad keeps this rank's gradient partitions while they are
// accumulated over the micro-steps of one optimizer step, writing them
// behind into the swapper.Store (NVMe) as they are produced, the way
// DeepSpeed's ZeRO-Infinity gradient offload does.
//
// # Use
//
//	g, _ := grad.New(grad.Options{Store: st, Pool: pool})
//	g.Register("layer0.w", partitionLen)
//	for micro := range accumulationSteps {
//		... backward ...
//		g.Accumulate(ctx, "layer0.w", partitionGrad) // returns once copied; the write is behind
//	}
//	g.Flush(ctx)                  // every write-behind on disk (or its error)
//	g.Read(ctx, "layer0.w", dst)  // or ReadAsync for the optimizer's read-ahead
//	... optimizer step ...
//	g.Zero()
//
// # Accumulation
//
// The first Accumulate after Zero stores the gradient as it is; later ones
// compute acc[i] = acc[i] + grad[i] in float32, element by element, so the
// result equals the same accumulation done in memory bit for bit. When the
// previous write-behind is done and its pinned copy was given back, the
// accumulated value is read from the store first (read-modify-write).
//
// # Write-behind and errors
//
// Accumulate copies the sum into a pinned pool buffer, starts its write
// and returns. The pinned copy is kept until the write is confirmed: a
// failed write (a full disk, an I/O error) loses nothing. The failure is
// reported, naming the tensor, by the next operation on that tensor that
// waits for the write (Accumulate, Read) or by Flush, exactly once; an
// Accumulate that reports it does not apply its gradient, so the caller may
// retry it. After a failure was reported, the next Accumulate writes the
// new sum and the next Flush writes the pinned copy again: once space
// returns they succeed, and Read returns the correct sum. An Accumulate of
// another gradient that finds no pinned memory free writes such a kept
// copy again itself (reported or not), so a failure reported to a Read
// does not strand the memory that Accumulate needs; if that write fails
// too, the Accumulate returns the failure and may be retried.
//
// Operations on one tensor are ordered (a later one waits for an earlier
// one and its write); different tensors proceed in parallel. Methods are
// safe for concurrent use.
//
// # Memory
//
// Options.KeepInCPUBytes keeps gradients in pinned memory instead of NVMe
// while the budget allows (decided at Register, in registration order,
// which also takes their buffers); with no Store every gradient is kept.
// Other gradients hold pinned memory only while a write is in flight or
// failed, or during an operation. PinnedNeedBytes is the pool a set of
// partitions needs so that no operation can wait forever.
//
// The optimizer reads a gradient one sub-group at a time with ReadRange,
// straight into its own pinned buffer (a ranged store read), so the step
// adds no gradient-sized buffer. With Options.ServeWhileWriting (the
// runtime's setting), a read of a gradient whose write-behind is still in
// flight — the layer just handed over — copies from the pinned copy being
// written instead of waiting for the write and reading the bytes back;
// such a read cannot report that write's failure, which the next
// operation on the gradient or Flush reports (Stats.ServedReads,
// ServedBytes).
package grad
