package plan

// The config in each component's words: pure functions of a config, shared
// by the planner (plan.go), zinf.Open and the tools. They read no file and
// open nothing.

import (
	"log/slog"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/schedule"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// ParamDType is the parameter dtype a config asks for: bf16 or fp16 when
// enabled, else fp32.
func ParamDType(cfg *config.Config) swapper.DType {
	switch {
	case cfg.BF16:
		return swapper.BFloat16
	case cfg.FP16:
		return swapper.Float16
	}
	return swapper.Float32
}

// EngineOptions maps the config's aio section and zinf's I/O keys to engine
// options.
func EngineOptions(cfg *config.Config, log *slog.Logger, faults aio.FaultHook) aio.Options {
	o := engineOptions(cfg, log, faults)
	o.Direct, _ = aio.ParseDirectPolicy(string(cfg.Zinf.Direct))
	return o
}

// engineOptions is EngineOptions less the O_DIRECT policy (SettingsOf
// parses it once for the engine and GPUDirect Storage).
func engineOptions(cfg *config.Config, log *slog.Logger, faults aio.FaultHook) aio.Options {
	a := cfg.AIO
	return aio.Options{Backend: string(cfg.Zinf.Backend), BlockSizeBytes: int(a.BlockSize), QueueDepth: a.QueueDepth,
		IntraOpParallelism: a.IntraOpParallelism, SingleSubmit: a.SingleSubmit, SerialEvents: !a.OverlapEvents,
		Logger: log, Faults: faults}
}

// Hyper maps the config's optimizer section to the optimizer's rule and
// hyperparameters (float32, rounded once).
func Hyper(cfg *config.Config) optimizer.Hyper {
	o := cfg.Optimizer
	h := optimizer.Hyper{LR: float32(o.LR), Beta1: float32(o.Betas[0]), Beta2: float32(o.Betas[1]), Eps: float32(o.Eps),
		WeightDecay: float32(o.WeightDecay), AdamW: o.DecoupledWeightDecay()}
	switch o.Type {
	case config.OptimizerSGD:
		h = optimizer.Hyper{Rule: optimizer.RuleSGD, LR: float32(o.LR), WeightDecay: float32(o.WeightDecay),
			Momentum: float32(o.Momentum), Dampening: float32(o.Dampening), Nesterov: o.Nesterov}
	case config.OptimizerAdagrad:
		h = optimizer.Hyper{Rule: optimizer.RuleAdagrad, LR: float32(o.LR), Eps: float32(o.Eps), WeightDecay: float32(o.WeightDecay),
			LRDecay: o.LRDecay, InitialAccumulatorValue: float32(o.InitialAccumulatorValue)}
	case config.OptimizerLion:
		h = optimizer.Hyper{Rule: optimizer.RuleLion, LR: float32(o.LR), Beta1: float32(o.Betas[0]), Beta2: float32(o.Betas[1]),
			WeightDecay: float32(o.WeightDecay)}
	}
	return h
}

// StateFormatOf is the optimizer's state format zinf.optimizer_states
// names (fp32 for an empty or unknown word, which Validate refuses).
func StateFormatOf(cfg *config.Config) optimizer.StateFormat {
	f, err := optimizer.ParseStateFormat(string(cfg.Zinf.OptimizerStates))
	if err != nil {
		return optimizer.FormatFP32
	}
	return f
}

// StateFormatForOf is the optimizer's per-tensor rule for cfg's
// compressed states (nil for fp32): optimizer.KeepFP32 with
// zinf.optimizer_states_fp32's patterns, tensors under
// optimizer.MinCompressedElems elements in fp32 too.
func StateFormatForOf(cfg *config.Config) func(name string, elems int) optimizer.StateFormat {
	f := StateFormatOf(cfg)
	if f == optimizer.FormatFP32 {
		return nil
	}
	return optimizer.KeepFP32(f, optimizer.MinCompressedElems, cfg.Zinf.OptimizerStatesFP32)
}

// SubGroupSizeOf is the optimizer's sub-group size for cfg:
// zero_optimization.sub_group_size capped at 2^30 elements and, with 8-bit
// states, rounded down to a multiple of their block
// (optimizer.Blockwise8BlockSize; at least one block), so that sub-groups
// start blocks, as optimizer.Options.Validate requires.
func SubGroupSizeOf(cfg *config.Config) int {
	return subGroupSize(cfg.ZeroOptimization.SubGroupSize, StateFormatOf(cfg))
}

func subGroupSize(elems int64, f optimizer.StateFormat) int {
	n := int(min(elems, 1<<30))
	if f.Encoding == optimizer.EncodingBlockwise8 {
		n = max(n/optimizer.Blockwise8BlockSize, 1) * optimizer.Blockwise8BlockSize
	}
	return n
}

// optimizerOptions is the config's part of the optimizer's options, the
// state format read once.
func optimizerOptions(cfg *config.Config) optimizer.Options {
	f := StateFormatOf(cfg)
	o := optimizer.Options{SubGroupSize: subGroupSize(cfg.ZeroOptimization.SubGroupSize, f), PipelineDepth: cfg.Zinf.PipelineDepth,
		BufferCount: cfg.ZeroOptimization.OffloadOptimizer.BufferCount, UpdateWorkers: cfg.Zinf.OptimizerWorkers, Hyper: Hyper(cfg),
		StateFormat: f}
	if f != optimizer.FormatFP32 {
		o.StateFormatFor = optimizer.KeepFP32(f, optimizer.MinCompressedElems, cfg.Zinf.OptimizerStatesFP32)
	}
	return o
}

func pathsFor(cfg *config.Config, fallback string) []string {
	if len(cfg.Zinf.NVMePaths) > 0 {
		return cfg.Zinf.NVMePaths
	}
	return []string{fallback}
}

// GDSMode returns the GPUDirect Storage mode the config selects: zinf.gds
// ("off", "auto" or "required"), or, when that is empty (a Config built in
// code rather than parsed), "auto" if aio.use_gds is true and "off"
// otherwise. Parsing already maps use_gds to "auto" when zinf.gds is absent.
func GDSMode(cfg *config.Config) string {
	switch m := cfg.Zinf.GDS; {
	case m != "":
		return string(m)
	case cfg.AIO.UseGDS:
		return gds.ModeAuto
	}
	return gds.ModeOff
}

// GDSOptions maps the config's aio section to the cuFile engine's options:
// pieces of aio.block_size (rounded up to a multiple of 4096, as cuFile
// and O_DIRECT need), aio.intra_op_parallelism of them in flight, the
// O_DIRECT policy of zinf.direct, and the swap directories for
// Available's filesystem check.
func GDSOptions(cfg *config.Config, log *slog.Logger) gds.Options {
	o := gdsOptions(cfg, log)
	o.Direct, _ = aio.ParseDirectPolicy(string(cfg.Zinf.Direct))
	o.Paths = cfg.NVMePaths()
	return o
}

// gdsOptions is GDSOptions less the O_DIRECT policy and the paths
// (SettingsOf reads them once).
func gdsOptions(cfg *config.Config, log *slog.Logger) gds.Options {
	return gds.Options{BlockSizeBytes: roundUp4K(int64(cfg.AIO.BlockSize)), Parallelism: min(max(cfg.AIO.IntraOpParallelism, 1), gds.MaxParallelism),
		Logger: log}
}

// BounceOptions maps the config's aio section to the bounce path's
// options: staging buffers of aio.block_size (rounded up to a multiple of
// 4096), aio.intra_op_parallelism slots, each holding two of them.
func BounceOptions(cfg *config.Config, log *slog.Logger) gds.BounceOptions {
	return gds.BounceOptions{BlockSizeBytes: roundUp4K(int64(cfg.AIO.BlockSize)), Parallelism: min(max(cfg.AIO.IntraOpParallelism, 1), gds.MaxParallelism),
		Logger: log}
}

func roundUp4K(n int64) int64 { return max((n+4095)/4096*4096, 4096) }

// StoreOptions are the options of a swap store on paths for cfg (Engine,
// Name and Logger aside).
func StoreOptions(cfg *config.Config, paths []string) swapper.StoreOptions {
	return swapper.StoreOptions{Paths: paths, Checksums: cfg.Zinf.Checksums, ReserveBytes: int64(cfg.Zinf.SwapFileBytes)}
}

// HintsFor maps a config's DeepSpeed offload keys to the policy's hints.
func HintsFor(cfg *config.Config, layers int, computePerLayer time.Duration) policy.Hints {
	zo := cfg.ZeroOptimization
	// DeepSpeed counts max_in_cpu and buffer_size in elements.
	elem := int64(ParamDType(cfg).Size())
	return policy.Hints{ParamDevice: string(zo.OffloadParam.Device), OptimizerDevice: string(zo.OffloadOptimizer.Device),
		MaxInCPUBytes: zo.OffloadParam.MaxInCPU * elem, ParamBufferCount: int64(zo.OffloadParam.BufferCount), ParamBufferBytes: zo.OffloadParam.BufferSize * elem,
		OptimizerBufferCount: zo.OffloadOptimizer.BufferCount, Ratio: zo.OffloadOptimizer.Ratio,
		SubGroupElems: zo.SubGroupSize, PrefetchDepth: cfg.Zinf.PrefetchDepth, ComputeSecondsPerLayer: 2 * computePerLayer.Seconds(), Layers: layers,
		MicroBatches: max(cfg.GradientAccumulationSteps, 1), Schedule: string(cfg.Zinf.Schedule)}
}

// Settings is the config in each component's words, before anything is
// measured or planned: the engine and swap stores zinf.Open opens, the
// device it asks for, and the options of what it builds after the plan.
// Making it reads no file and opens nothing.
type Settings struct {
	Engine aio.Options
	// ParamStore is the parameter store's options, OptimStore the
	// optimizer and gradient stores' (Engine, Name and Logger aside); no
	// Paths where the config keeps that state in memory.
	ParamStore, OptimStore swapper.StoreOptions
	NVMePaths              []string // every swap directory (config.Config.NVMePaths)
	// Bandwidth is what measuring the NVMe bandwidth reads of the config.
	Bandwidth BandwidthSettings
	DType     swapper.DType
	Device    DeviceSettings
	GDSMode   string // GDSMode
	GDS       gds.Options
	Bounce    gds.BounceOptions
	Scaler    schedule.LossScalerOptions
	// Optimizer is the config's part of the optimizer's options:
	// sub-groups, pipeline, buffers, workers, rule.
	Optimizer   optimizer.Options
	Clip        float64 // gradient_clipping
	Speculate   config.SpeculateMode
	PinnedBytes config.Size   // zinf.tiers.cpu_pinned_bytes, as the config says it
	PinnedStall time.Duration // zinf.pinned_stall_timeout
	// MaxInCPU is offload_param.max_in_cpu (elements) where parameters
	// live on NVMe, else 0.
	MaxInCPU int64
}

// DeviceSettings is the device the config selects.
type DeviceSettings struct {
	Kind      config.Device
	CUDABytes int64 // zinf.tiers.gpu_bytes (0: what the device has)
	SimBytes  int64 // the simulated device's capacity
}

// SettingsOf is cfg in each component's words, in one pass. The config's
// own translations come first, then what the other packages read of it
// (schedule, config, aio), each once. What the caller gives beside the
// config (the logger of the engine and the device I/O, an engine's fault
// hook, the run's total steps for the learning-rate schedule) is the
// builder's, not the settings'.
func SettingsOf(cfg *config.Config) Settings {
	zo := cfg.ZeroOptimization
	s := Settings{Engine: engineOptions(cfg, nil, nil), DType: ParamDType(cfg),
		Device:  DeviceSettings{Kind: cfg.Zinf.Device, CUDABytes: int64(cfg.Zinf.Tiers.GPUBytes)},
		GDSMode: GDSMode(cfg), GDS: gdsOptions(cfg, nil), Bounce: BounceOptions(cfg, nil),
		Clip: cfg.GradientClipping, Speculate: cfg.Zinf.Speculate,
		PinnedBytes: cfg.Zinf.Tiers.CPUPinnedBytes, PinnedStall: time.Duration(cfg.Zinf.PinnedStallTimeout)}
	if s.Speculate == "" {
		s.Speculate = config.SpeculateAuto
	}
	if zo.OffloadParam.Device == config.OffloadNVMe {
		s.ParamStore = StoreOptions(cfg, pathsFor(cfg, zo.OffloadParam.NVMePath))
		s.MaxInCPU = zo.OffloadParam.MaxInCPU
	}
	if zo.OffloadOptimizer.Device == config.OffloadNVMe {
		s.OptimStore = StoreOptions(cfg, pathsFor(cfg, zo.OffloadOptimizer.NVMePath))
	}
	s.Optimizer = optimizerOptions(cfg)
	s.Scaler = schedule.LossScalerOptionsOf(cfg)
	s.NVMePaths = cfg.NVMePaths()
	s.Bandwidth = BandwidthSettings{Config: cfg.Zinf.Bandwidth, File: cfg.BandwidthFile(), Paths: s.NVMePaths}
	s.GDS.Paths = s.NVMePaths
	s.Device.SimBytes = cfg.GPUBytes(0)
	direct, _ := aio.ParseDirectPolicy(string(cfg.Zinf.Direct))
	s.Engine.Direct, s.GDS.Direct = direct, direct
	s.Bandwidth.Engine = s.Engine
	return s
}
