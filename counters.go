package zinf

import (
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
)

// counters are the runtime's own counts that Metrics reports beside the
// layers' (the pool's, the engine's, the swappers' and the stores'): the
// steps taken, the loop's waits, its measured compute, the step outcomes
// and the collectives. Runtime.mu guards them: the loop goroutine adds to
// them, Metrics reads them from any goroutine.
type counters struct {
	stepCount  int
	stepWaitNs int64
	ioWaitNs   int64
	// updateWaitNs is the time the loop waited for a background update
	// to publish a layer's parameters (zinf.overlap_update).
	updateWaitNs int64
	// computeNs and computeUnits measure the loop's compute per layer
	// visit (see Metrics.Compute).
	computeNs    int64
	computeUnits int64
	trainStats   TrainStats
	commStats    CommStats
}

// Metrics is a snapshot of the runtime's counters.
type Metrics struct {
	Steps int
	// IOWait is the time the loop spent blocked in BeginLayer and
	// AccumulateGrad (waiting for swap-ins or write-behind).
	IOWait time.Duration
	// UpdateWait is the time BeginLayer and the parameter reads waited
	// for the last step's update to publish a layer's parameters, with
	// zinf.overlap_update (the part of the update the next forward did
	// not hide).
	UpdateWait time.Duration
	// Reservations is how the pinned pool is split.
	Reservations Reservations
	// Schedule counts the prefetch scheduler's work (demand misses,
	// prefetches).
	Schedule     policy.SchedStats
	BytesRead    int64 // from NVMe, all stores (logical tensor bytes)
	BytesWritten int64 // to NVMe, all stores (logical tensor bytes)
	// DeviceBytesRead and DeviceBytesWritten are what the stores'
	// requests moved on the devices: BytesRead and BytesWritten padded to
	// the alignment, ranged reads widened to whole checksum units — the
	// figure a device's own counters (/sys/block/*/stat) see of zinf.
	DeviceBytesRead, DeviceBytesWritten int64
	ReadOps                             int64
	WriteOps                            int64
	PinnedBytes                         int64 // the pool's capacity
	PinnedInUseBytes                    int64
	PinnedPeakBytes                     int64
	Pinned                              bool // locked in RAM
	DeviceUsedBytes                     int64
	// DeviceName names the device ("none" without one).
	DeviceName string
	// Pool is the pinned pool's own counters: bytes in use and reserved
	// per purpose, waits.
	Pool      buffers.Stats
	Engine    aio.Stats
	Params    param.Stats
	Optimizer optimizer.Stats
	Grads     grad.Stats
	// Train counts applied, skipped and clipped steps, speculation commits
	// and rollbacks, and the current loss scale.
	Train TrainStats
	// Comm counts the collectives through Options.Comm.
	Comm CommStats
	// Compute is the loop's time between BeginLayer and EndLayer, less
	// the time it waited in the runtime meanwhile (AccumulateGrad's
	// hand-offs): the compute the planner predicts with (see
	// Runtime.MeasuredComputePerLayer). ComputeUnits counts the layer
	// visits it covers, each weighted by its micro-batches.
	Compute      time.Duration
	ComputeUnits int64
}

// TrainStats count a Runtime's optimizer steps.
type TrainStats struct {
	// Applied and Skipped count completed steps (Skipped: fp16 overflow);
	// Clipped the applied steps whose gradients were clipped.
	Applied, Skipped, Clipped int
	// Speculated counts the steps with gradient_clipping or fp16 on whose
	// update started during backward; Commits the ones committed as they
	// were, Rollbacks the ones discarded. RollbackTime is the time Step
	// spent discarding them (stopping the pipeline, waiting for its I/O,
	// deleting what it staged); the step run again after a clip rollback
	// is not counted in it.
	Speculated, Commits, Rollbacks int
	RollbackTime                   time.Duration
	// LossScale is the current loss scale (1 without fp16).
	LossScale float64
}

// CommStats counts a rank's collectives through Options.Comm (the
// all-gathers of GatherLayers and the reduce-scatters of ReduceGrad).
// Bytes are payload as the collectives address it: an all-gather of a
// tensor sends this rank's partition to every other rank and receives
// theirs; a reduce-scatter sends every other rank its chunk of each of
// this rank's vectors and receives this rank's chunk of theirs.
type CommStats struct {
	Gathers        int64 // tensors all-gathered
	GatherSent     int64 // bytes
	GatherReceived int64 // bytes
	// GatherWait is the time BeginLayer waited for its layer's gather
	// (zero when the gather ahead finished during the previous layer).
	GatherWait time.Duration
	// GatherTime is the time the gathers took (partition reads and the
	// collectives, overlapped with the loop's compute or not).
	GatherTime time.Duration
	// GatheredAhead counts layers gathered ahead of their BeginLayer.
	GatheredAhead int64

	ReduceScatters        int64 // ReduceGrad calls
	ReduceScatterSent     int64 // bytes
	ReduceScatterReceived int64 // bytes
	ReduceScatterTime     time.Duration
}
