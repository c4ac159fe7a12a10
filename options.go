package zinf

import (
	"log/slog"
	"time"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/trace"
)

// Options adjust Open beyond the config; PlanModel reads the fields a
// plan depends on.
type Options struct {
	// Logger receives warnings and progress. Default slog.Default().
	Logger *slog.Logger
	// Device overrides the device the config selects (several simulated
	// ranks may share one). The Runtime does not close a device it was
	// given.
	Device accel.Device
	// Engine overrides the I/O engine (shared by ranks, or with a fault
	// hook in tests). The Runtime does not close an engine it was given.
	Engine aio.Engine
	// Faults is passed to the engine Open builds (tests).
	Faults aio.FaultHook
	// Rank and WorldSize, when WorldSize > 0, override the config's.
	Rank, WorldSize int
	// PinnedStallTimeout, when > 0, overrides zinf.pinned_stall_timeout:
	// how long a wait for pinned memory may see no release in its region
	// before it fails with buffers.ErrStalled, naming what the pool holds.
	// A wait that can never be served (buffers.ErrDeadlock) is reported
	// at once whatever it says.
	PinnedStallTimeout time.Duration
	// ComputePerLayer is the loop's compute time per layer and pass, when
	// known: the planner sizes the prefetch depth from it and predicts the
	// step time. Default 0: one layer ahead.
	ComputePerLayer time.Duration
	// NoBandwidthProbe never probes an NVMe path's bandwidth at Open,
	// whatever zinf.bandwidth.probe says: the plan uses the configured,
	// tune-file or cached figures, or the defaults (see NVMeBandwidth).
	NoBandwidthProbe bool
	// Bandwidth, when set, is the NVMe bandwidth to plan with, as it is
	// (several ranks of one process may share one NVMeBandwidth call).
	Bandwidth *Bandwidth
	// PrefetchDepth, when > 0, overrides the planned prefetch depth
	// (layers fetched ahead of use), within the prefetch window the pool
	// leaves (Reservations.PrefetchBytes; none at the minimum pool, and
	// then nothing is prefetched); -1 turns prefetching off.
	PrefetchDepth int
	// SerialStep runs the whole optimizer step in Step, even when the
	// plan lets StepTensor overlap it with backward.
	SerialStep bool
	// Inference opens the runtime for forward passes only: Init stores
	// the parameters and nothing else (no optimizer states, no gradient
	// slots, no pinned memory for them); AccumulateGrad, StepTensor and
	// Step are refused.
	Inference bool
	// InPlace says that an inference runtime's parameters will all be
	// given with InitInPlace (read where they lie in the caller's file):
	// the parameter swap store then counts no disk for them, so Open's
	// free-space check does not ask for a second copy of a model the disk
	// already holds. A tensor given with Init instead is written to the
	// swap files as usual, and a write that finds the disk full fails
	// with the store's error. It needs Inference.
	InPlace bool
	// Comm is this rank's handle on the world of ranks (comm.NewMPI when
	// the ranks are processes, comm.NewLocal when they are goroutines of
	// one process); it must be rank Rank of a world of WorldSize. It
	// carries the step's global quantities — with gradient_clipping or
	// fp16 on, Step reduces the gradients' sum of squares (norm and
	// overflow) over the ranks through it, so it is required then at
	// world size > 1 (Open refuses without it) — and ReduceGrad's
	// reduce-scatters and the gathers of GatherLayers. The runtime runs
	// its collectives, in the order the loop asks for them, on a
	// goroutine of its own (Collective queues a loop's own). The Runtime
	// does not close it.
	Comm comm.Comm
	// GatherLayers makes the ranks' partitions whole for the loop:
	// BeginLayer all-gathers the layer's full parameters through Comm
	// (and starts gathering the next layer of the pass, overlapping the
	// loop's compute), ReadParam and ReadParamBytes give full tensors,
	// EndLayer frees them. BeginLayer is then a collective: every rank
	// begins and ends the same layers in the same order. The full
	// parameters of two layers (the largest) take a reservation of the
	// pinned pool (Reservations.GatherBytes). Needs Comm.
	GatherLayers bool
	// TotalSteps is the number of optimizer steps the run takes, for a
	// "scheduler" whose total_num_steps is "auto" (as the Hugging Face
	// integration writes it); Open refuses such a config without it.
	// Default 0: unknown.
	TotalSteps int
	// PieceBytes is the size of the pieces big tensors move in. A
	// parameter partition on NVMe larger than it is streamed: never
	// swapped in whole (BeginLayer does not wait for it, prefetching
	// passes it by), its reads — ReadParam, ReadParamBytes, and only the
	// rows or range asked for with ReadParamRows, ReadParamRange — go to
	// NVMe one piece at a time, and its updates are written piece by
	// piece; a gradient longer than a piece of fp32 is kept and written in
	// pieces; the optimizer's sub-group is at most a piece of gradient.
	// So a tensor's pinned need is a few pieces, not its size (the
	// minimum pool grows with the pieces in flight, not the largest
	// tensor). Rounded up to the swap store's stripe; default 0:
	// zinf.piece_bytes, else DefaultPieceBytes (4 MiB); -1: every tensor
	// moves whole.
	PieceBytes int64
	// Trace, when set, receives the runtime's timeline: each layer's
	// compute and the loop's waits, every swap store read and write, each
	// optimizer step with its sub-groups' read, update and write, each
	// rollback (see package trace; trace.ChromeWriter writes a file
	// Perfetto opens). Default nil: tracing off, at the cost of a nil
	// check.
	Trace trace.Sink
}

// Schedule is the order of work within a step of k micro-batches
// (gradient_accumulation_steps): config.ScheduleLayerMajor or
// config.ScheduleMicroBatchMajor (see zinf.schedule in package config).
type Schedule = config.ScheduleMode

// The two orders a step's micro-batches can run in.
const (
	// LayerMajor runs every micro-batch of a layer while its parameters
	// are in: BeginLayerMicroBatches(ctx, l, k) once per layer and pass.
	LayerMajor = config.ScheduleLayerMajor
	// MicroBatchMajor runs each micro-batch forward and backward through
	// every layer (ZeRO-Infinity's order): BeginLayer once per layer, pass
	// and micro-batch.
	MicroBatchMajor = config.ScheduleMicroBatchMajor
)
