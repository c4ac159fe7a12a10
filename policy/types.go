package policy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/tensor"
)

// Sentinel errors callers branch on.
var (
	// ErrInvalid: an input (tiers, inventory, hints, model spec) is malformed.
	ErrInvalid = errors.New("policy: invalid input")
	// ErrNoFit: what the hints ask for does not fit in a tier. The error is a
	// *CapacityError saying how many bytes are needed and how many there are.
	ErrNoFit = errors.New("policy: does not fit")
)

// Bounds on the inputs, far above any real model, that keep every byte
// count and the simulation within int64 and memory.
const (
	// MaxBytes bounds a tensor, the sum of an inventory and a hinted size.
	MaxBytes = int64(1) << 55
	// MaxLayers bounds Hints.Layers and Tensor.Layer+1.
	MaxLayers = 1 << 20
)

// Tiers describes the memory and storage a placement may use.
type Tiers struct {
	// GPUBytes is the GPU tier capacity (accelerator memory the tensors and
	// the working set may use).
	GPUBytes int64
	// CPUBytes is the pinned host memory budget: CPU-resident tensors, the
	// parameter cache in front of NVMe and every swap buffer count against it.
	CPUBytes int64
	// NVMeReadBps and NVMeWriteBps are the NVMe bandwidths in bytes/s, summed
	// over the striped paths. 0 = unknown: NVMe time is not predicted.
	NVMeReadBps, NVMeWriteBps float64
	// NVMeBandwidthSource says where the NVMe bandwidths come from (a
	// measurement, the config, a default), for the table. Empty: not said.
	NVMeBandwidthSource string
	// PCIeBps is the host<->device copy bandwidth in bytes/s. 0 = unlimited
	// (the simulated device, whose copies are memory copies).
	PCIeBps float64
	// NVMePaths is the number of NVMe paths the swap files are striped over
	// (for the table; the bandwidths above already sum over them).
	NVMePaths int
	// PoolGranuleBytes is the pinned pool's allocation granule: buffers
	// held at once are counted with the pool's block rule
	// (buffers.SpanBytes) at this granule. 0 = buffers.DefaultMinBufferBytes;
	// otherwise a power of two.
	PoolGranuleBytes int64
}

// Kind is what a tensor is for.
type Kind uint8

const (
	// Param is a (partitioned) model parameter in the training dtype.
	Param Kind = iota
	// Grad is a gradient partition (fp32).
	Grad
	// OptimState is an optimizer state partition: fp32 master weights,
	// Adam's exp_avg and exp_avg_sq.
	OptimState
	numKinds
)

// String returns "param", "grad" or "optimizer".
func (k Kind) String() string {
	switch k {
	case Param:
		return "param"
	case Grad:
		return "grad"
	case OptimState:
		return "optimizer"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Tensor is one entry of the inventory a placement is planned for.
type Tensor struct {
	// Name identifies the tensor; unique in an inventory.
	Name string
	// Bytes is the tensor's size on this rank (its ZeRO-3 partition).
	Bytes int64
	// Kind says what it is for.
	Kind Kind
	// Layer is the layer the tensor belongs to, 0-based.
	Layer int
	// Order is the tensor's first use in a step, ascending.
	Order int
}

// Hints are the user's wishes, with DeepSpeed's semantics
// (zero_optimization.offload_param and offload_optimizer). Sizes are bytes:
// the caller converts DeepSpeed's element counts with the dtype's size.
type Hints struct {
	// ParamDevice is where parameters live: "none" (or "") keeps them on
	// the GPU, "cpu" in pinned host memory, "nvme" on NVMe, swapped in for
	// each use.
	ParamDevice string
	// OptimizerDevice is where optimizer states and gradient partitions
	// live, with the same words as ParamDevice.
	OptimizerDevice string
	// MaxInCPUBytes is the budget of parameters kept in pinned host memory
	// in front of NVMe (offload_param.max_in_cpu). 0 = no cache. The
	// policy uses less when the CPU budget cannot hold it.
	MaxInCPUBytes int64
	// ParamBufferCount and ParamBufferBytes are offload_param.buffer_count
	// and buffer_size: pinned buffers for parameter swap-ins. 0 = the
	// policy decides.
	ParamBufferCount, ParamBufferBytes int64
	// OptimizerBufferCount is offload_optimizer.buffer_count. 0 = the
	// policy decides.
	OptimizerBufferCount int
	// Ratio is offload_optimizer.ratio: the fraction of optimizer state
	// bytes offloaded, in (0, 1]; the rest stays on the GPU. 0 = 1.
	Ratio float64
	// PrefetchDepth is how many layers ahead parameters are fetched.
	// 0 = the policy decides.
	PrefetchDepth int
	// ComputeSecondsPerLayer is the forward+backward compute time of one
	// layer, used to size the prefetch depth and predict the step time.
	ComputeSecondsPerLayer float64
	// SubGroupElems is the optimizer's sub-group size in elements
	// (zero_optimization.sub_group_size): optimizer buffers hold at most
	// one sub-group. 0 = whole tensors.
	SubGroupElems int64
	// Layers is the number of layers. 0 = one more than the largest
	// Tensor.Layer of the inventory.
	Layers int
	// MicroBatches is the micro-batches of a step
	// (gradient_accumulation_steps): ComputeSecondsPerLayer is per
	// micro-batch, and the prediction counts k of them. 0 = 1.
	MicroBatches int
	// Costs are the CPU costs on the I/O path the prediction adds (all 0:
	// none modelled). A runtime measures them while it trains (see
	// Placement.WithCosts).
	Costs Costs
	// GradWriteBehinds is how many gradient write-behinds can be in
	// flight at once when gradients are handed over one at a time
	// (micro-batch-major, and layer-major at one micro-batch): a hand-off
	// takes a pinned buffer, which the write that many hand-offs before
	// gives back. The runtime's reservations set it (see
	// Placement.WithGradWriteBehinds). 0 = 1.
	GradWriteBehinds int
	// KeptGrads names the parameters whose gradients stay in pinned
	// memory for the whole step although the gradients' home is NVMe
	// (zinf.pinned_grads; plan.Reservations.GradKept): the update reads
	// them there, so the prediction counts for them neither a
	// write-behind nor a read-back (see Placement.WithKeptGrads). They
	// still cross PCIe and are handed off as any host gradient. nil:
	// every NVMe gradient takes the round trip.
	KeptGrads []string
	// Schedule is the order of a step's micro-batches: ScheduleLayerMajor,
	// ScheduleMicroBatchMajor, or "" / ScheduleAuto for the one predicted
	// faster (micro-batch-major at one micro-batch, where they are the
	// same order).
	Schedule string
}

// Costs are CPU costs of a step that ride on its NVMe traffic and its
// gradient hand-offs, each a rate measured on the machine (0: not
// modelled).
type Costs struct {
	// ChecksumBytesPerSec is the rate the stores compute and verify
	// CRC-32C (zinf.checksums): every NVMe byte read is verified and every
	// byte written summed after its I/O, on the path of whoever waits for
	// it, so the prediction adds bytes / rate to each transfer.
	ChecksumBytesPerSec float64
	// HandOffBytesPerSec is the rate a gradient hand-off copies or adds a
	// gradient into its pinned sum (AccumulateGrad's arithmetic, which the
	// loop waits for): each layer's gradient bytes, once per micro-batch.
	HandOffBytesPerSec float64
	// OptimizerComputeSeconds is the optimizer's arithmetic per step
	// (Adam and its copies on the update goroutine), added to the
	// optimizer step: its reads, updates and writes run one sub-group
	// after another.
	OptimizerComputeSeconds float64
}

// The orders a step's micro-batches can run in (Hints.Schedule,
// Placement.Schedule); the words of zinf.schedule.
const (
	ScheduleAuto            = "auto"
	ScheduleLayerMajor      = "layer-major"
	ScheduleMicroBatchMajor = "micro-batch-major"
)

// Device words of Hints.ParamDevice and Hints.OptimizerDevice.
const (
	DeviceNone = "none"
	DeviceCPU  = "cpu"
	DeviceNVMe = "nvme"
)

// CapacityError says that a tier cannot hold what the hints ask for.
type CapacityError struct {
	Tier tensor.Tier
	// What is needed, in words, with its parts.
	What string
	// NeedBytes is what is needed; HaveBytes what the tier offers.
	NeedBytes, HaveBytes int64
	// Hint says what to change, or is empty.
	Hint string
}

// Error reports the tier, the need and the capacity in bytes and in
// human-readable units.
func (e *CapacityError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy: %s tier too small: %s need %s (%d bytes), %s (%d bytes) available",
		e.Tier, e.What, FormatBytes(e.NeedBytes), e.NeedBytes, FormatBytes(e.HaveBytes), e.HaveBytes)
	if e.Hint != "" {
		b.WriteString("; ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

// Is reports ErrNoFit.
func (e *CapacityError) Is(target error) bool { return target == ErrNoFit }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// FormatBytes renders n in binary units with one decimal ("1.5 GiB",
// "512 B").
func FormatBytes(n int64) string {
	return units.FormatBytes(n)
}
