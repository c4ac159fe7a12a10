package optimizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// Waiter is an operation in flight; Wait blocks until it is done and
// returns its outcome. It is an alias of the unnamed interface so that any
// package whose methods return interface{ Wait() error } (or an alias of
// it) satisfies ParamSink without importing this package; *swapper.Pending
// is one. A package with its own named waiter type is adapted by SinkOf.
type Waiter = interface{ Wait() error }

var (
	_ Waiter    = (*swapper.Pending)(nil)
	_ ParamSink = sinkAdapter[Waiter]{}
)

// ParamSink receives the updated parameters of a step: the param swapper
// (swapper/param) implements it.
//
// StageUpdate is called once per tensor per step, from the step's update
// goroutine (not Step's caller; with a StepTxn, while the caller's backward
// pass may still be reading parameters), with the tensor's whole new fp32
// partition, in the order the tensors are stepped. The sink converts
// it to the parameter dtype and writes it somewhere invisible to readers
// until CommitUpdates. values is owned by the optimizer and stays valid and
// unchanged until the returned Waiter's Wait returns (so the sink may read
// it asynchronously); the sink must not keep it longer. Wait is called
// exactly once, from another goroutine. A sink that also implements
// RangeSink gets the values one sub-group at a time instead.
//
// After every StageUpdate of a step succeeded, CommitUpdates makes them all
// visible at once; on failure it must leave the previous parameters in
// place. DiscardUpdates drops whatever was staged since the last commit;
// the optimizer calls it when a step fails and after a failed commit. No
// two of these methods are called concurrently by one Optimizer.
type ParamSink interface {
	StageUpdate(ctx context.Context, name string, values []float32) (Waiter, error)
	CommitUpdates() error
	DiscardUpdates()
}

// RangeSink is a ParamSink that takes a tensor's new partition in pieces,
// so that the optimizer never assembles a whole tensor: StageRange is
// called instead of StageUpdate, once per sub-group, with values for
// elements [lo, lo+len(values)) of the partition of n elements. A tensor's
// ranges come in ascending order, back to back, from lo = 0 to the one
// ending at n (the last, after which the tensor's update is staged as
// StageUpdate would have staged it), from the update goroutine; values
// stays valid and unchanged until the returned Waiter's Wait returns. When
// a step fails part way, DiscardUpdates drops the pieces staged so far.
// Empty partitions get no call.
type RangeSink interface {
	ParamSink
	StageRange(ctx context.Context, name string, lo, n int, values []float32) (Waiter, error)
}

// Stager is a ParamSink whose StageUpdate returns its own waiter type W
// instead of Waiter: Go matches method results by identical type, so a
// swapper that declares "type Waiter interface{ Wait() error }" (as
// swapper/param does) is a Stager[param.Waiter] but not a ParamSink.
// SinkOf bridges the two.
type Stager[W Waiter] interface {
	StageUpdate(ctx context.Context, name string, values []float32) (W, error)
	CommitUpdates() error
	DiscardUpdates()
}

// rangeStager is the StageRange of a Stager with its own waiter type.
type rangeStager[W Waiter] interface {
	StageRange(ctx context.Context, name string, lo, n int, values []float32) (W, error)
}

// SinkOf adapts s to a ParamSink, for example
// optimizer.SinkOf[param.Waiter](paramSwapper). When s also has a
// StageRange method (with W results), the ParamSink is a RangeSink.
func SinkOf[W Waiter](s Stager[W]) ParamSink {
	if rs, ok := s.(rangeStager[W]); ok {
		return rangeSinkAdapter[W]{sinkAdapter[W]{s}, rs}
	}
	return sinkAdapter[W]{s}
}

type sinkAdapter[W Waiter] struct{ s Stager[W] }

func (a sinkAdapter[W]) StageUpdate(ctx context.Context, name string, values []float32) (Waiter, error) {
	w, err := a.s.StageUpdate(ctx, name, values)
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (a sinkAdapter[W]) CommitUpdates() error { return a.s.CommitUpdates() }
func (a sinkAdapter[W]) DiscardUpdates()      { a.s.DiscardUpdates() }

type rangeSinkAdapter[W Waiter] struct {
	sinkAdapter[W]
	r rangeStager[W]
}

func (a rangeSinkAdapter[W]) StageRange(ctx context.Context, name string, lo, n int, values []float32) (Waiter, error) {
	w, err := a.r.StageRange(ctx, name, lo, n, values)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// GradSource provides the gradient partitions at the optimizer step: the
// grad swapper (swapper/grad) implements it. The optimizer reads each
// sub-group's slice of a gradient straight into the pinned buffer the
// sub-group's update uses, so its pinned memory is bounded by the
// sub-group size, never by the largest tensor.
//
// ReadRange reads elements [lo, hi) of the named tensor's gradient into
// dst, the start of a pinned pool buffer (aligned as pool buffers are) of
// at least RangeBufferBytes(lo, hi) bytes, and returns the hi-lo values,
// which must lie inside dst (a source reading from an aligned store reads
// the aligned span around the range into dst and returns the part holding
// the range). It is called once per sub-group per step attempt, from one
// of the step's goroutines at a time (never Step's caller), and must return
// the same values when a failed step is retried. With a StepTxn a tensor's
// reads come soon after StepTxn.Tensor handed it over, while the caller may
// still be accumulating the gradients of tensors not handed over yet.
// RangeBufferBytes must not depend on anything but lo and hi and must be
// at least 4*(hi-lo); PinnedNeedBytes counts it.
type GradSource interface {
	ReadRange(ctx context.Context, name string, lo, hi int, dst []byte) ([]float32, error)
	RangeBufferBytes(lo, hi int) int
}

// RangeRead is a gradient range read in flight (AsyncGradSource): Wait
// returns what GradSource.ReadRange would have. Like Waiter it is an alias
// of an unnamed interface, so a source declares its method with this type
// without importing this package.
type RangeRead = interface{ Wait() ([]float32, error) }

// AsyncGradSource is a GradSource that can start a range read and finish
// it later (the gradient swapper, swapper/grad, is one). The step's
// read-ahead then starts a sub-group's gradient read together with its
// record read and goes on to the next sub-group without waiting for
// either, so several sub-groups' reads are in flight at once; the update
// waits for both. ReadRangeAsync returns errors found before the read at
// once and the read's from Wait; after a nil error, Wait is called exactly
// once, from the step's update or write-behind goroutine, and dst belongs
// to the read until then.
type AsyncGradSource interface {
	GradSource
	ReadRangeAsync(ctx context.Context, name string, lo, hi int, dst []byte) (RangeRead, error)
}

// Defaults used by EnsureDefaults.
const (
	// DefaultSubGroupSize is DeepSpeed's zero_optimization.sub_group_size
	// default (1e9 elements). Real runs choose it so that a few sub-groups'
	// states (12 bytes per element) fit the pinned pool.
	DefaultSubGroupSize = 1_000_000_000
	// DefaultBufferCount is DeepSpeed's offload_optimizer.buffer_count
	// default; EnsureDefaults raises it to 2*PipelineDepth+1 when the
	// pipeline wants more.
	DefaultBufferCount = 4
	// DefaultPrefix names the optimizer's tensors in the store.
	DefaultPrefix = "optimizer"
	// MaxUpdateWorkers bounds Options.UpdateWorkers: more goroutines than
	// any machine has cores for one update only cost memory.
	MaxUpdateWorkers = 1024
)

// Options configure an Optimizer. The zero value of each field means its
// documented default (EnsureDefaults); Pool and Grads are required.
type Options struct {
	// Store keeps the optimizer states on NVMe (offload_optimizer.device
	// "nvme"). Nil keeps them in pinned memory from Pool instead
	// (offload_optimizer.device "cpu"); then each sub-group holds two state
	// copies (the current one and the one a step builds, swapped at commit
	// so a failed step changes nothing), 24 bytes per element.
	Store *swapper.Store
	// Pool provides every pinned buffer the optimizer uses. Required.
	Pool *buffers.Pool
	// Params receives each step's new master weights (staged, then
	// committed with the step). Nil: the parameters are not written back
	// (a test or a benchmark of the optimizer alone).
	Params ParamSink
	// Grads provides the gradients at each step. Required.
	Grads GradSource
	// SubGroupSize is the most elements per sub-group, the unit the step
	// pipeline reads, updates and writes (DeepSpeed's sub_group_size). A
	// sub-group is a consecutive chunk of one tensor's partition: a larger
	// tensor is split into several sub-groups (the last one shorter), and
	// tensors never share one. Default DefaultSubGroupSize.
	SubGroupSize int
	// PipelineDepth is k in "read sub-group i+k ahead while updating i and
	// keep up to k writes of earlier sub-groups in flight behind", each
	// sub-group counted by its pinned block relative to the step's largest
	// (so small sub-groups between large ones count for little). 0 (the
	// default) runs read, update and write one sub-group at a time on the
	// caller's goroutine.
	PipelineDepth int
	// BufferCount is the number of pinned sub-group buffer sets the step
	// may hold at once (DeepSpeed's offload_optimizer.buffer_count),
	// counted as PipelineDepth's windows are (in largest-sub-group
	// equivalents). The
	// pipeline wants 2*PipelineDepth+1 (one updating, k read ahead, k being
	// written); with fewer it waits for a set to be written back before it
	// reads the next (backpressure), so 1 works at any depth. Default
	// max(DefaultBufferCount, 2*PipelineDepth+1).
	BufferCount int
	// Hyper are Adam's hyperparameters; zero fields take their defaults.
	Hyper Hyper
	// StateFormat is how the rule's states (Adam's exp_avg and exp_avg_sq)
	// are stored in the records, on NVMe and in pinned memory; the master
	// is always fp32 (config key zinf.optimizer_states). The zero value is
	// FormatFP32; FormatBF16 and FormatBlockwise8 (8-bit blockwise, see
	// QuantMap) take 2 bytes and 1.016 bytes per element and state instead
	// of 4, and are for Adam (Hyper.Rule RuleAdam) only. With
	// FormatBlockwise8, SubGroupSize must be a multiple of
	// Blockwise8BlockSize, so that every sub-group starts a block and a
	// step gives the bits of Adam8Step on whole tensors. ReadStates,
	// VisitStates and snapshots give such states dequantized (widened) to
	// fp32; LoadStates quantizes (rounds) what it is given.
	StateFormat StateFormat
	// StateFormatFor, when set, picks each tensor's state format at
	// Register from its name and element count, overriding StateFormat
	// (which stays the format the planner's sizes assume narrowest:
	// PinnedNeedBytes then sizes every record as fp32, the widest). It
	// must return a valid format (Register fails otherwise) and only
	// fp32 for another rule than Adam. Compressed states of small tensors
	// and of embedding tables train badly: their blocks mix elements whose
	// gradients differ by more than the maps' range, and an exp_avg_sq
	// coded as zero beside a nonzero exp_avg makes an update of lr*m/eps
	// (bitsandbytes keeps tensors under 4096 elements and embeddings in
	// 32-bit states for that reason); KeepFP32 is such a rule.
	StateFormatFor func(name string, elems int) StateFormat
	// Kernel names the implementation of the update rule the step runs:
	// "auto" (the widest SIMD kernel this CPU runs), "scalar" (the
	// portable reference loop) or a SIMD kernel ("avx2", "avx512"; see
	// Kernels). Every kernel gives the same bits, so it changes speed,
	// never results. Default "" means DefaultKernel: the one the
	// ZINF_OPTIMIZER_KERNEL environment variable names, else auto.
	Kernel string
	// UpdateWorkers is the most goroutines one sub-group's update is split
	// over (chunks of at least 64 Ki elements; elements are independent, so
	// the bits do not depend on it). It needs no pinned memory: the
	// workers share the sub-group's buffer. Default runtime.GOMAXPROCS(0)
	// at EnsureDefaults; 1 updates on the pipeline's goroutine only.
	UpdateWorkers int
	// Prefix names the optimizer's tensors in the store: sub-group j of
	// tensor w is "<Prefix>/w#j". Default DefaultPrefix. Give each
	// Optimizer sharing a Store its own prefix.
	Prefix string
	// Logger receives step failures and rollback problems. Default
	// slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills the zero fields of o with their documented defaults.
func (o *Options) EnsureDefaults() {
	if o.SubGroupSize == 0 {
		o.SubGroupSize = DefaultSubGroupSize
	}
	if o.BufferCount == 0 {
		o.BufferCount = max(DefaultBufferCount, 2*o.PipelineDepth+1)
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.UpdateWorkers == 0 {
		o.UpdateWorkers = runtime.GOMAXPROCS(0)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Hyper.EnsureDefaults()
}

// Validate reports every problem with o at once, naming the field, its
// value and what is allowed.
func (o *Options) Validate() error {
	var errs []error
	bad := func(field string, value any, allowed string) {
		errs = append(errs, fmt.Errorf("optimizer: Options.%s = %v: %s", field, value, allowed))
	}
	if o.Pool == nil {
		bad("Pool", nil, "required: the pinned pool every sub-group buffer comes from")
	}
	if o.Grads == nil {
		bad("Grads", nil, "required: the source of the gradients at each step")
	}
	if o.SubGroupSize < 0 {
		bad("SubGroupSize", o.SubGroupSize, fmt.Sprintf("must be >= 1 (0 means %d)", DefaultSubGroupSize))
	}
	if o.PipelineDepth < 0 {
		bad("PipelineDepth", o.PipelineDepth, "must be >= 0 (0 means no overlap)")
	}
	if o.BufferCount < 0 {
		bad("BufferCount", o.BufferCount, "must be >= 1 (0 means max(4, 2*PipelineDepth+1))")
	}
	if o.UpdateWorkers < 0 || o.UpdateWorkers > MaxUpdateWorkers {
		bad("UpdateWorkers", o.UpdateWorkers, fmt.Sprintf("must be in 0..%d (0 means GOMAXPROCS)", MaxUpdateWorkers))
	}
	if o.Kernel != "" {
		if _, err := KernelByName(o.Kernel); err != nil {
			bad("Kernel", fmt.Sprintf("%q", o.Kernel), err.Error())
		}
	} else if _, err := defaultKernel(); err != nil {
		errs = append(errs, fmt.Errorf("optimizer: environment %w", err))
	}
	if err := o.Hyper.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.StateFormat.Validate(); err != nil {
		bad("StateFormat", o.StateFormat, err.Error())
	} else if o.StateFormat.Encoding != EncodingFP32 {
		if o.Hyper.Rule != RuleAdam {
			bad("StateFormat", o.StateFormat, fmt.Sprintf("compressed states are implemented for Adam only; %s keeps fp32 states (use fp32)", o.Hyper.Rule))
		}
		if o.StateFormat.Encoding == EncodingBlockwise8 && o.SubGroupSize%Blockwise8BlockSize != 0 {
			bad("SubGroupSize", o.SubGroupSize, fmt.Sprintf("with 8-bit states it must be a multiple of %d (the block size), so that sub-groups start blocks", Blockwise8BlockSize))
		}
	}
	if o.Store != nil && o.Pool != nil {
		// Pool buffers start at multiples of the granule; the store's
		// transfers need its device alignment.
		if a := o.Store.Alignment(); int64(o.Pool.MinBufferBytes())%a != 0 {
			bad("Pool", fmt.Sprintf("granule %d", o.Pool.MinBufferBytes()),
				fmt.Sprintf("the pool's MinBufferBytes must be a multiple of the store's alignment (%d)", a))
		}
	}
	return errors.Join(errs...)
}
