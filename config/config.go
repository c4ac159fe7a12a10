package config

import (
	_ "embed"
	"path/filepath"
	"time"
)

// Config is one zinf config: the DeepSpeed keys zinf acts on plus zinf's own
// section. Parse and Load fill every field, defaults included; Default
// returns the embedded demo config. A Config built by hand should start from
// one of those, since the zero values of several fields are invalid (a zero
// queue depth, for one).
//
// The doc comment of each field names its JSON key and default; the package
// documentation has the same as one table.
type Config struct {
	// ZeroOptimization is "zero_optimization": ZeRO stage and offload.
	ZeroOptimization Zero
	// AIO is the top-level "aio" section: how swaps are issued.
	AIO AIO
	// Zinf is the "zinf" section: what DeepSpeed's config does not express.
	Zinf Zinf
	// Optimizer is "optimizer": type and hyper-parameters.
	Optimizer Optimizer
	// BF16 is "bf16.enabled" (old name "bfloat16.enabled"). Default false.
	BF16 bool
	// FP16 is "fp16.enabled". Default false. At most one of BF16 and FP16.
	FP16 bool
	// GradientAccumulationSteps is "gradient_accumulation_steps": micro-steps
	// whose gradients are summed before one optimizer step. Default 1.
	GradientAccumulationSteps int
	// GradientAccumulationAuto is gradient_accumulation_steps "auto"
	// (DeepSpeed's spelling): the planner picks the micro-batches a
	// layer-major step needs for its compute to cover its NVMe traffic
	// (policy.Placement.MicroBatchesToHideIO); GradientAccumulationSteps
	// stays 1 then. A number is the user's k and is kept as given.
	GradientAccumulationAuto bool
	// MicroBatch is "train_micro_batch_size_per_gpu". Default 1.
	MicroBatch int
	// GradientClipping is "gradient_clipping": the largest global L2 norm
	// of the gradients (over every rank) an optimizer step applies; larger
	// gradients are scaled down to it. 0 turns clipping off. >= 0. Default
	// 0.
	GradientClipping float64
	// CPUCheckpointing is "activation_checkpointing.cpu_checkpointing":
	// DeepSpeed's checkpointed activations in CPU memory. Under
	// zinf.activations.device auto it puts the activation tier in pinned
	// memory (zinf.Runtime.OpenActivations). activation_checkpointing's
	// other keys are accepted and not acted on. Default false.
	CPUCheckpointing bool
	// LossScaling is the loss-scaling keys of "fp16" (loss_scale,
	// initial_scale_power, loss_scale_window, hysteresis,
	// consecutive_hysteresis, min_loss_scale); they act when FP16 is true.
	LossScaling LossScaling
	// Scheduler is "scheduler": the learning-rate schedule. Default none
	// (the learning rate stays optimizer.params.lr).
	Scheduler Scheduler

	// Warnings holds notices about a config that was nonetheless accepted:
	// old key names, deprecated forms, Hugging Face "auto" values, and one
	// line listing the DeepSpeed keys zinf accepted but does not act on.
	// Parse fills it; it is never written back out.
	Warnings []string
	// Ignored lists, as dotted paths, the DeepSpeed keys that were accepted
	// but are not acted on (the same keys as the "ignored" warning).
	Ignored []string
	// Source is the path the config was loaded from; empty for Parse and
	// Default.
	Source string
	// envProblems holds rank / world size values from the environment
	// that could not be read;
	// Validate reports them.
	envProblems []Problem
}

// Zero is the "zero_optimization" section. DeepSpeed's defaults apply.
type Zero struct {
	// Stage is "stage", the ZeRO stage 0..3. Default 0. Parameter offload
	// and NVMe optimizer offload need stage 3; CPU optimizer offload needs
	// stage 1 or more.
	Stage int
	// SubGroupSize is "sub_group_size": parameters (elements, not bytes) per
	// optimizer sub-group, the unit the optimizer swapper reads, updates and
	// writes back. Default 1e9.
	SubGroupSize int64
	// OffloadParam is "offload_param".
	OffloadParam OffloadParam
	// OffloadOptimizer is "offload_optimizer".
	OffloadOptimizer OffloadOptimizer
}

// OffloadDevice says where offloaded tensors live.
type OffloadDevice string

// The offload devices DeepSpeed defines and zinf supports.
const (
	OffloadNone OffloadDevice = "none" // stay on the accelerator
	OffloadCPU  OffloadDevice = "cpu"  // host memory
	OffloadNVMe OffloadDevice = "nvme" // swap files under nvme_path
)

// OffloadParam is "zero_optimization.offload_param": where ZeRO-3
// partitioned parameters live.
type OffloadParam struct {
	// Device is "device": none, cpu or nvme. Default none.
	Device OffloadDevice
	// NVMePath is "nvme_path", the directory for parameter swap files.
	// Required when Device is nvme, unless zinf.nvme_paths is set. Default
	// empty.
	NVMePath string
	// BufferCount is "buffer_count": pinned buffers for parameter swaps.
	// Default 5.
	BufferCount int
	// BufferSize is "buffer_size": elements per parameter swap buffer.
	// Default 1e8.
	BufferSize int64
	// MaxInCPU is "max_in_cpu": parameter elements kept in pinned host
	// memory in front of NVMe. Default 1e9.
	MaxInCPU int64
	// PinMemory is "pin_memory": page-locked host buffers. Default false.
	PinMemory bool
}

// OffloadOptimizer is "zero_optimization.offload_optimizer": where fp32
// master weights and optimizer state live.
type OffloadOptimizer struct {
	// Device is "device": none, cpu or nvme. Default none.
	Device OffloadDevice
	// NVMePath is "nvme_path", the directory for optimizer swap files.
	// Required when Device is nvme, unless zinf.nvme_paths is set. Default
	// empty.
	NVMePath string
	// BufferCount is "buffer_count": pinned buffers for optimizer swaps.
	// DeepSpeed advises at least the tensors per parameter (4 for Adam:
	// weight, gradient, exp_avg, exp_avg_sq). Default 4.
	BufferCount int
	// PinMemory is "pin_memory". Default false.
	PinMemory bool
	// PipelineRead is "pipeline_read": read sub-group i+1 while updating i.
	// Default false. See Zinf.PipelineDepth for how zinf uses it.
	PipelineRead bool
	// PipelineWrite is "pipeline_write": write sub-group i-1 while
	// updating i. Default false. See Zinf.PipelineDepth.
	PipelineWrite bool
	// FastInit is "fast_init": initialize optimizer state on NVMe without
	// staging it through host memory first. Default false.
	FastInit bool
	// Ratio is "ratio": the fraction of optimizer state offloaded, in
	// (0, 1]; below 1 needs stage 3. Default 1.
	Ratio float64
}

// AIO is the top-level "aio" section, as DeepSpeed's DeepNVMe reads it.
type AIO struct {
	// BlockSize is "block_size": bytes per I/O request a large swap is
	// split into. A power of two or a multiple of 4096. Default 1MiB.
	BlockSize Size
	// QueueDepth is "queue_depth": requests kept in flight per ring or
	// worker, 1..4096. Default 8.
	QueueDepth int
	// IntraOpParallelism is "intra_op_parallelism" (old name
	// "thread_count", read with a warning): rings or workers one swap is
	// spread over, 1..64. Default 1.
	IntraOpParallelism int
	// SingleSubmit is "single_submit": submit requests one at a time
	// instead of in batches. Default false.
	SingleSubmit bool
	// OverlapEvents is "overlap_events": submit new requests while reaping
	// completions. Default true.
	OverlapEvents bool
	// UseGDS is "use_gds": DeepSpeed's GPUDirect Storage switch. When
	// zinf.gds is absent, true means zinf.gds "auto". Default false.
	UseGDS bool
}

// DirectMode is the O_DIRECT policy for swap files.
type DirectMode string

// The O_DIRECT policies.
const (
	DirectRequired DirectMode = "required" // fail if O_DIRECT cannot be used
	DirectOptional DirectMode = "optional" // probe, fall back with a warning
	DirectOff      DirectMode = "off"      // buffered I/O through the page cache
)

// Backend names an aio engine.
type Backend string

// The aio backends.
const (
	BackendAuto   Backend = "auto"   // the best that works here
	BackendURing  Backend = "uring"  // io_uring
	BackendLibaio Backend = "libaio" // Linux kernel AIO
	BackendPosix  Backend = "posix"  // goroutines doing pread/pwrite
)

// GDSMode is zinf's GPUDirect Storage policy.
type GDSMode string

// The GDS policies.
const (
	GDSOff      GDSMode = "off"      // bounce through pinned host memory
	GDSAuto     GDSMode = "auto"     // cuFile when available, else bounce
	GDSRequired GDSMode = "required" // fail if cuFile is unavailable
)

// Device names the accelerator implementation.
type Device string

// The devices.
const (
	DeviceAuto Device = "auto" // CUDA when a GPU works, else sim
	DeviceSim  Device = "sim"  // host memory with a capacity budget
	DeviceCUDA Device = "cuda" // a real GPU through libcudart
)

// DefaultSimGPUBytes is the GPU tier capacity used for the simulated device
// when zinf.tiers.gpu_bytes is 0.
const DefaultSimGPUBytes = GiB

// Zinf is the "zinf" section: zinf's additions to DeepSpeed's schema.
// DeepSpeed ignores unknown top-level keys, so one file can serve both.
type Zinf struct {
	// Tiers is "tiers": capacities.
	Tiers Tiers
	// NVMePaths is "nvme_paths": directories swap files are striped over.
	// Default empty: use the offload nvme_path keys (see Config.NVMePaths).
	NVMePaths []string
	// Checksums is "checksums": checksum every swapped-out tensor and verify
	// it on swap-in. Default true.
	Checksums bool
	// Direct is "direct": O_DIRECT policy. Default optional.
	Direct DirectMode
	// Backend is "backend": aio engine. Default auto.
	Backend Backend
	// PipelineDepth is "pipeline_depth", 0..16: sub-groups the optimizer
	// reads ahead of and writes behind the one it updates; 0 runs read,
	// update and write in sequence. When absent, or "auto", it is 1 with
	// PipelineDepthAuto set, except 0 when offload_optimizer sets both
	// pipeline_read and pipeline_write to false explicitly (DeepSpeed's
	// unpipelined swapper). Pipelining never changes results, only
	// overlap.
	PipelineDepth int
	// PipelineDepthAuto is "pipeline_depth" "auto", the default: the
	// planner raises the depth from PipelineDepth to the one that keeps
	// about aio.queue_depth x aio.block_size of sub-groups read ahead and
	// as many written behind (plan.AutoPipelineBytes: depth 1 for
	// sub-groups of that size and more, up to 16 for small ones), and
	// offload_optimizer.buffer_count to the 2*depth+1 buffer sets that
	// depth uses, as far as the pool has room beyond its minimum and the
	// prefetch window (at most a sixteenth of it); the plan's notes say
	// what it took. A number turns it off.
	PipelineDepthAuto bool
	// GDS is "gds": GPUDirect Storage policy. When absent it is auto if
	// aio.use_gds is true, else off.
	GDS GDSMode
	// Device is "device": accelerator implementation. Default auto.
	Device Device
	// Rank is "rank": this process's data-parallel rank. When absent it is
	// read from the launcher's environment (RANK, else
	// OMPI_COMM_WORLD_RANK, else SLURM_PROCID: see Launchers), else 0.
	Rank int
	// WorldSize is "world_size": data-parallel processes. When absent it is
	// read from the launcher's environment (WORLD_SIZE, else
	// OMPI_COMM_WORLD_SIZE, else SLURM_NTASKS), else 1.
	WorldSize int
	// SwapFileBytes is "swap_file_bytes": size each swap file is
	// preallocated to. Default 0: files grow as tensors are added.
	SwapFileBytes Size
	// Preallocate is "preallocate": a training runtime reserves (with
	// fallocate) the swap file space its plan counts at Open, so that
	// writes during training overwrite reserved space instead of growing
	// the files. Default true.
	Preallocate bool
	// PieceBytes is "piece_bytes": tensors larger than it move in pieces
	// of it (see zinf.Options.PieceBytes, which overrides it). Default 0:
	// 4 MiB; a size above the largest tensor moves every tensor whole.
	PieceBytes Size
	// PrefetchDepth is "prefetch_depth": layers fetched ahead of use.
	// Default 0: the policy decides from the NVMe bandwidth (see
	// Bandwidth).
	PrefetchDepth int
	// NVMeTBW is "nvme_tbw": the endurance rating of the NVMe drives
	// under the swap paths (bytes written over their life, from the
	// datasheet, e.g. "600TB"), for zinf plan, train and doctor to say
	// what a run's writes cost them. Default 0: not given.
	NVMeTBW Size
	// OptimizerWorkers is "optimizer_workers", 0..1024: the most
	// goroutines (cores) one optimizer sub-group's update is split over
	// (optimizer.Options.UpdateWorkers). Default 0: GOMAXPROCS. The split
	// never changes results and needs no pinned memory.
	OptimizerWorkers int
	// OptimizerStates is "optimizer_states": how the optimizer's states
	// (Adam's exp_avg and exp_avg_sq) are stored, on NVMe and in pinned
	// memory: "fp32" (the default), "bf16" (2 bytes an element) or "8bit"
	// (blockwise, 1 byte an element plus an fp32 absmax per 256;
	// optimizer.StateFormat). The fp32 master weights stay fp32. The
	// compressed formats are for Adam and AdamW only.
	OptimizerStates OptimizerStates
	// OptimizerStatesFP32 is "optimizer_states_fp32": tensor name
	// patterns ('*' any characters, '/' included; '?' one: e.g. "*embed*",
	// optimizer.MatchName) whose states stay fp32
	// when OptimizerStates is bf16 or 8bit, as bitsandbytes keeps
	// embeddings in 32-bit states: a table whose rows get gradients now
	// and then trains badly on 8-bit moments. Tensors of fewer than 4096
	// elements stay fp32 too (optimizer.MinCompressedElems). Default none.
	OptimizerStatesFP32 []string
	// Speculate is "speculate": with gradient_clipping or fp16 on, whether
	// each layer's optimizer update still starts during the backward pass
	// (and is rolled back when the step turns out to need clipping or to
	// overflow). Default auto.
	Speculate SpeculateMode
	// PinnedGrads is "pinned_grads": whether gradients the pinned pool
	// has room for stay in pinned memory through the step, where the
	// optimizer's update reads them, instead of being written to NVMe
	// and read back. Default auto.
	PinnedGrads PinnedGradsMode
	// OverlapUpdate is "overlap_update": Step returns once the step is
	// decided and its update goes on in the background, each layer's new
	// parameters visible as soon as they are written, so the next step's
	// forward starts while its last layers are still updating. Default
	// false (Step returns once the whole update is committed).
	OverlapUpdate bool
	// Schedule is "schedule": the order of work within a step of several
	// micro-batches (gradient_accumulation_steps): layer-major (every
	// micro-batch of a layer while its parameters are in: one parameter
	// read per pass and one gradient write per step), micro-batch-major
	// (ZeRO-Infinity's: every micro-batch through every layer), or auto
	// (the planner predicts both and picks). Default auto.
	Schedule ScheduleMode
	// Bandwidth is "bandwidth": where the planner gets each NVMe path's
	// read and write bandwidth.
	Bandwidth Bandwidth
	// PinnedStallTimeout is "pinned_stall_timeout", 1s..24h: how long a
	// wait for pinned memory may see no release in its region before it
	// fails naming what the pool holds (buffers.Options.StallTimeout). A
	// wait that can never be served is reported at once whatever it says.
	// Default 2m.
	PinnedStallTimeout Duration
	// CommStallTimeout is "comm_stall_timeout", 1s..24h: how long a
	// collective waits for the other ranks (comm.MPIOptions and
	// comm.LocalOptions StallTimeout). Default 10m.
	CommStallTimeout Duration
	// CommHeartbeatTimeout is "comm_heartbeat_timeout", 1s..1h: how long
	// a rank waiting in a collective tolerates silence from another
	// rank's process (one per process under mpirun) before the job fails
	// naming it (comm.MPIOptions.HeartbeatTimeout): a rank stopped with
	// SIGSTOP or hung is named within that. Default 10s.
	CommHeartbeatTimeout Duration
	// KVCache is "kv_cache": where a generation's attention key/value
	// cache lives (see zinf.Runtime.OpenKVCache).
	KVCache KVCache
	// Activations is "activations": where the activations a loop hands to
	// zinf between a layer's forward and its backward live (see
	// zinf.Runtime.OpenActivations).
	Activations Activations
}

// KVCacheDevice is "zinf.kv_cache.device": the tier of a generation's KV
// cache.
type KVCacheDevice string

// The KV cache tiers.
const (
	// KVCacheAuto keeps the cache in memory while it fits in
	// zinf.kv_cache.bytes (0: always), else on NVMe.
	KVCacheAuto KVCacheDevice = "auto"
	// KVCacheMemory keeps the cache in ordinary (Go heap) memory, at most
	// zinf.kv_cache.bytes of it (0: no limit).
	KVCacheMemory KVCacheDevice = "memory"
	// KVCacheCPU keeps the cache in pinned host memory of its own,
	// zinf.kv_cache.bytes of it (0: what the cache needs).
	KVCacheCPU KVCacheDevice = "cpu"
	// KVCacheNVMe keeps the cache in swap files, each layer's read back
	// into pinned memory just ahead of use and written behind it;
	// zinf.kv_cache.bytes is that pinned memory (0: what it needs, three
	// layers: in use, read ahead, written behind).
	KVCacheNVMe KVCacheDevice = "nvme"
)

// ActivationsDevice is "zinf.activations.device": the tier of the
// activations (or checkpointed layer inputs) a step keeps between a
// layer's forward and its backward.
type ActivationsDevice string

// The activation tiers.
const (
	// ActivationsAuto keeps activations in memory while they fit
	// zinf.activations.memory_bytes (0: always), then in pinned memory
	// while they fit zinf.activations.cpu_bytes, then on NVMe.
	ActivationsAuto ActivationsDevice = "auto"
	// ActivationsMemory keeps them in ordinary (Go heap) memory.
	ActivationsMemory ActivationsDevice = "memory"
	// ActivationsCPU keeps them in pinned host memory of their own, at
	// most zinf.activations.cpu_bytes (DeepSpeed's
	// activation_checkpointing.cpu_checkpointing).
	ActivationsCPU ActivationsDevice = "cpu"
	// ActivationsNVMe writes them behind to swap files and reads them back
	// ahead of the backward pass that needs them.
	ActivationsNVMe ActivationsDevice = "nvme"
)

// Activations is "zinf.activations".
type Activations struct {
	// Device is "device". Default auto.
	Device ActivationsDevice
	// MemoryBytes is "memory_bytes": the activations kept in memory under
	// auto. Default 0: no limit.
	MemoryBytes Size
	// CPUBytes is "cpu_bytes": the pinned memory of the cpu tier, and
	// under auto of the pinned entries and the nvme staging together.
	// Default 0: 64 MiB. The nvme device pins its staging only.
	CPUBytes Size
}

// KVCache is "zinf.kv_cache".
type KVCache struct {
	// Device is "device". Default auto.
	Device KVCacheDevice
	// Bytes is "bytes": the cache's budget on its tier (see the devices).
	// Default 0.
	Bytes Size
}

// The defaults of the zinf section's timeouts.
const (
	DefaultPinnedStallTimeout   = Duration(2 * time.Minute)
	DefaultCommStallTimeout     = Duration(10 * time.Minute)
	DefaultCommHeartbeatTimeout = Duration(10 * time.Second)
)

// Bandwidth is "zinf.bandwidth": the NVMe bandwidth the planner predicts
// with and sizes prefetching from. For each NVMe path the figure comes
// from, in order: ReadBytesPerSec and WriteBytesPerSec when set; the
// entry for the path in File; the probe cache in the path (a measurement
// no older than a week); a short probe of the path when Probe is true
// (then cached there); else a conservative default. Several paths add up
// (swap files are striped over them).
type Bandwidth struct {
	// ReadBytesPerSec and WriteBytesPerSec are "read_bytes_per_sec" and
	// "write_bytes_per_sec": each NVMe path's sequential bandwidth in
	// bytes per second, written as sizes ("3GB" is 3e9 bytes/s). Both or
	// neither. Default 0: not given.
	ReadBytesPerSec, WriteBytesPerSec Size
	// File is "file": a results file written by `zinf tune
	// --bandwidth-file`. A relative name is read relative to the config
	// file's directory. Default empty.
	File string
	// Probe is "probe": measure a path that nothing above gives a figure
	// for, at Open (about ProbeBytes written and read, at most a few
	// seconds; the result is cached in the path for a week). Default true.
	Probe bool
	// ProbeBytes is "probe_bytes": bytes each probe writes and then reads,
	// 1MiB..1GiB. Default 16MiB.
	ProbeBytes Size
}

// BandwidthFile returns zinf.bandwidth.file as a path to open: relative
// names are taken relative to the directory of the config file (Source),
// or the working directory for a config that was not loaded from a file.
// It is empty when the key is not set.
func (c *Config) BandwidthFile() string {
	f := c.Zinf.Bandwidth.File
	if f == "" || filepath.IsAbs(f) || c.Source == "" {
		return f
	}
	return filepath.Join(filepath.Dir(c.Source), f)
}

// Tiers is "zinf.tiers": memory budgets per tier.
type Tiers struct {
	// GPUBytes is "gpu_bytes": the GPU tier capacity. Default 0: the
	// device's free memory for cuda, DefaultSimGPUBytes for sim (see
	// Config.GPUBytes).
	GPUBytes Size
	// CPUPinnedBytes is "cpu_pinned_bytes": the pinned host buffer pool
	// budget. Default 256MiB.
	CPUPinnedBytes Size
}

// OptimizerType names an optimizer.
type OptimizerType string

// The optimizers zinf implements. Config files may spell them in any case,
// as DeepSpeed allows; Parse stores these spellings.
const (
	OptimizerAdam    OptimizerType = "Adam"
	OptimizerAdamW   OptimizerType = "AdamW"
	OptimizerSGD     OptimizerType = "SGD"     // torch.optim.SGD, as DeepSpeed passes it through
	OptimizerAdagrad OptimizerType = "Adagrad" // DeepSpeed's Adagrad (torch.optim.Adagrad's rule)
	OptimizerLion    OptimizerType = "Lion"    // DeepSpeed's Lion
)

// Optimizer is the "optimizer" section. The defaults are PyTorch's and
// DeepSpeed's for each type; a key of "params" that the type does not have
// is refused, naming the types it belongs to.
type Optimizer struct {
	// Type is "type": Adam, AdamW, SGD, Adagrad or Lion (any case). Default
	// Adam.
	Type OptimizerType
	// LR is "params.lr", >= 0. Default 1e-3 (Adam, AdamW, SGD), 1e-2
	// (Adagrad), 1e-4 (Lion).
	LR float64
	// Betas is "params.betas" (Adam, AdamW, Lion), each in [0, 1). Default
	// [0.9, 0.999]; Lion [0.9, 0.99].
	Betas [2]float64
	// Eps is "params.eps" (Adam, AdamW, Adagrad), > 0. Default 1e-8;
	// Adagrad 1e-10.
	Eps float64
	// WeightDecay is "params.weight_decay", >= 0. Default 0.
	WeightDecay float64
	// AdamWMode is "params.adam_w_mode". As in DeepSpeed, whose Adam
	// defaults to decoupled weight decay, type Adam with AdamWMode true
	// behaves as AdamW. Default true. See DecoupledWeightDecay.
	AdamWMode bool
	// Momentum, Dampening and Nesterov are "params.momentum",
	// "params.dampening" and "params.nesterov" (SGD): momentum >= 0,
	// dampening finite; Nesterov needs momentum > 0 and dampening 0.
	// Defaults 0, 0, false.
	Momentum, Dampening float64
	Nesterov            bool
	// LRDecay and InitialAccumulatorValue are "params.lr_decay" and
	// "params.initial_accumulator_value" (Adagrad), >= 0. Defaults 0.
	LRDecay, InitialAccumulatorValue float64
}

// DecoupledWeightDecay reports whether weight decay is applied to the
// weights directly (AdamW) rather than added to the gradient (classic Adam
// with L2): true for type AdamW, and for type Adam with adam_w_mode true.
func (o Optimizer) DecoupledWeightDecay() bool {
	return o.Type == OptimizerAdamW || o.AdamWMode
}

// HasBetas reports whether the optimizer has (beta1, beta2), which
// OneCycle's momentum cycling sets.
func (o Optimizer) HasBetas() bool {
	return o.Type == OptimizerAdam || o.Type == OptimizerAdamW || o.Type == OptimizerLion
}

// defaults returns a Config holding every documented default, before any
// file or environment is read.
func defaults() *Config {
	return &Config{
		ZeroOptimization: Zero{
			Stage:        0,
			SubGroupSize: 1e9,
			OffloadParam: OffloadParam{
				Device:      OffloadNone,
				BufferCount: 5,
				BufferSize:  1e8,
				MaxInCPU:    1e9,
			},
			OffloadOptimizer: OffloadOptimizer{
				Device:      OffloadNone,
				BufferCount: 4,
				Ratio:       1,
			},
		},
		AIO: AIO{
			BlockSize:          MiB,
			QueueDepth:         8,
			IntraOpParallelism: 1,
			OverlapEvents:      true,
		},
		Zinf: Zinf{
			Tiers:             Tiers{CPUPinnedBytes: 256 * MiB},
			Checksums:         true,
			Preallocate:       true,
			Direct:            DirectOptional,
			Backend:           BackendAuto,
			PipelineDepth:     1,
			PipelineDepthAuto: true,
			GDS:               GDSOff,
			Device:            DeviceAuto,
			WorldSize:         1,
			Speculate:         SpeculateAuto,
			PinnedGrads:       PinnedGradsAuto,
			Schedule:          ScheduleAuto,
			OptimizerStates:   OptimizerStatesFP32,
			Bandwidth:         Bandwidth{Probe: true, ProbeBytes: 16 * MiB},
			KVCache:           KVCache{Device: KVCacheAuto},
			Activations:       Activations{Device: ActivationsAuto},

			PinnedStallTimeout:   DefaultPinnedStallTimeout,
			CommStallTimeout:     DefaultCommStallTimeout,
			CommHeartbeatTimeout: DefaultCommHeartbeatTimeout,
		},
		Optimizer: Optimizer{
			Type:      OptimizerAdam,
			LR:        1e-3,
			Betas:     [2]float64{0.9, 0.999},
			Eps:       1e-8,
			AdamWMode: true,
		},
		GradientAccumulationSteps: 1,
		MicroBatch:                1,
		LossScaling: LossScaling{
			InitialScalePower: 16,
			LossScaleWindow:   1000,
			Hysteresis:        2,
			MinLossScale:      1,
		},
		Scheduler: Scheduler{
			WarmupMaxLR:        0.001,
			WarmupNumSteps:     1000,
			WarmupType:         WarmupLog,
			CosMinRatio:        0.0001,
			CycleFirstStepSize: 2000,
			CycleMomentum:      true,
			CycleMinMom:        0.8,
			CycleMaxMom:        0.9,
		},
	}
}

//go:embed default.json
var defaultJSON []byte

// DefaultJSON returns a copy of the embedded default config file, the one
// Default parses.
func DefaultJSON() []byte { return append([]byte(nil), defaultJSON...) }

// Default returns the embedded default config used by `make demo` and the
// examples: the simulated device, ZeRO stage 3 with parameters and optimizer
// state offloaded to NVMe, and sizes small enough for a laptop.
//
// Its nvme_path keys are empty on purpose: the caller supplies a scratch
// directory (usually a temporary one) with SetScratchDir. Until then
// Validate reports the missing paths.
//
// Rank and world size come from the launcher's environment (RANK and
// WORLD_SIZE, Open MPI's or Slurm's) as for any config.
func Default() *Config {
	c, problems, _ := decode(defaultJSON)
	if len(problems) != 0 {
		// The file is part of the binary and covered by tests.
		panic("config: embedded default.json is broken: " + (&Error{Problems: problems}).Error())
	}
	return c
}

// NeedsScratchDir reports whether an offload device is nvme with no
// directory to put swap files in: neither its nvme_path nor zinf.nvme_paths
// is set.
func (c *Config) NeedsScratchDir() bool {
	if len(c.Zinf.NVMePaths) > 0 {
		return false
	}
	z := &c.ZeroOptimization
	return z.OffloadParam.Device == OffloadNVMe && z.OffloadParam.NVMePath == "" ||
		z.OffloadOptimizer.Device == OffloadNVMe && z.OffloadOptimizer.NVMePath == ""
}

// SetScratchDir fills dir into every empty nvme_path of an offload section
// whose device is nvme, when zinf.nvme_paths is not set. It is how the
// caller of Default supplies the directory for swap files.
func (c *Config) SetScratchDir(dir string) {
	if len(c.Zinf.NVMePaths) > 0 {
		return
	}
	z := &c.ZeroOptimization
	if z.OffloadParam.Device == OffloadNVMe && z.OffloadParam.NVMePath == "" {
		z.OffloadParam.NVMePath = dir
	}
	if z.OffloadOptimizer.Device == OffloadNVMe && z.OffloadOptimizer.NVMePath == "" {
		z.OffloadOptimizer.NVMePath = dir
	}
}

// NVMePaths returns the directories swap files are striped over: zinf.nvme_paths
// when set, else the nvme_path of each offload section whose device is nvme
// (parameters first), without duplicates. The result is a fresh slice; it is
// empty when nothing is offloaded to NVMe.
func (c *Config) NVMePaths() []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p == "" {
			return
		}
		k := filepath.Clean(p)
		if !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	if len(c.Zinf.NVMePaths) > 0 {
		for _, p := range c.Zinf.NVMePaths {
			add(p)
		}
		return out
	}
	z := &c.ZeroOptimization
	if z.OffloadParam.Device == OffloadNVMe {
		add(z.OffloadParam.NVMePath)
	}
	if z.OffloadOptimizer.Device == OffloadNVMe {
		add(z.OffloadOptimizer.NVMePath)
	}
	return out
}

// RankWorld returns this process's rank and the world size: zinf.rank and
// zinf.world_size, which Parse resolves from the RANK and WORLD_SIZE
// environment variables when the file does not set them.
func (c *Config) RankWorld() (rank, world int) {
	return c.Zinf.Rank, c.Zinf.WorldSize
}

// GPUBytes returns the GPU tier capacity to use: zinf.tiers.gpu_bytes when
// set; otherwise deviceFreeBytes when the caller knows it (a real GPU's free
// memory); otherwise DefaultSimGPUBytes.
func (c *Config) GPUBytes(deviceFreeBytes int64) int64 {
	switch {
	case c.Zinf.Tiers.GPUBytes > 0:
		return int64(c.Zinf.Tiers.GPUBytes)
	case deviceFreeBytes > 0:
		return deviceFreeBytes
	default:
		return int64(DefaultSimGPUBytes)
	}
}
