package zinf

// The config in each component's words: pure functions of a config, shared
// by the planner (modelplan.go), Open and the tools. They read no file and
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

// engineOptions is EngineOptions less the O_DIRECT policy (settingsOf
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
// (settingsOf reads them once).
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

// storeOptions are the options of a swap store on paths for cfg (Engine,
// Name and Logger aside).
func storeOptions(cfg *config.Config, paths []string) swapper.StoreOptions {
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

// settings is the config in each component's words, before anything is
// measured or planned: the engine and swap stores Open opens, the device
// it asks for, and the options of what it builds after the plan. Making it
// reads no file and opens nothing.
type settings struct {
	engine aio.Options
	// paramStore is the parameter store's options, optimStore the
	// optimizer and gradient stores' (Engine, Name and Logger aside); no
	// Paths where the config keeps that state in memory.
	paramStore, optimStore swapper.StoreOptions
	nvmePaths              []string // every swap directory (config.Config.NVMePaths)
	dtype                  swapper.DType
	device                 deviceSettings
	gdsMode                string // GDSMode
	gds                    gds.Options
	bounce                 gds.BounceOptions
	sched                  schedule.Schedule
	schedErr               error // why the config's scheduler cannot run (Open reports it)
	scaler                 schedule.LossScalerOptions
	optimizer              optimizer.Options // the config's part: sub-groups, pipeline, buffers, workers, rule
	clip                   float64
	speculate              config.SpeculateMode
	pinnedBytes            config.Size   // zinf.tiers.cpu_pinned_bytes, as the config says it
	pinnedStall            time.Duration // zinf.pinned_stall_timeout
	// maxInCPU is offload_param.max_in_cpu (elements) where parameters
	// live on NVMe, else 0.
	maxInCPU int64
}

// deviceSettings is the device the config selects (see openDevice).
type deviceSettings struct {
	kind      config.Device
	cudaBytes int64 // zinf.tiers.gpu_bytes (0: what the device has)
	simBytes  int64 // the simulated device's capacity
}

// settingsOf is cfg in each component's words, in one pass; log and
// faults go to the engine (and log to the device I/O), totalSteps to the
// learning-rate schedule (see Options.TotalSteps). The config's own
// translations come first, then what the other packages read of it
// (schedule, config, aio), each once.
func settingsOf(cfg *config.Config, log *slog.Logger, faults aio.FaultHook, totalSteps int) settings {
	zo := cfg.ZeroOptimization
	s := settings{engine: engineOptions(cfg, log, faults), dtype: ParamDType(cfg),
		device:  deviceSettings{kind: cfg.Zinf.Device, cudaBytes: int64(cfg.Zinf.Tiers.GPUBytes)},
		gdsMode: GDSMode(cfg), gds: gdsOptions(cfg, log), bounce: BounceOptions(cfg, log),
		clip: cfg.GradientClipping, speculate: cfg.Zinf.Speculate,
		pinnedBytes: cfg.Zinf.Tiers.CPUPinnedBytes, pinnedStall: time.Duration(cfg.Zinf.PinnedStallTimeout),
		optimizer: optimizer.Options{SubGroupSize: int(min(zo.SubGroupSize, 1<<30)), PipelineDepth: cfg.Zinf.PipelineDepth,
			BufferCount: zo.OffloadOptimizer.BufferCount, UpdateWorkers: cfg.Zinf.OptimizerWorkers, Hyper: Hyper(cfg)}}
	if s.speculate == "" {
		s.speculate = config.SpeculateAuto
	}
	if zo.OffloadParam.Device == config.OffloadNVMe {
		s.paramStore = storeOptions(cfg, pathsFor(cfg, zo.OffloadParam.NVMePath))
		s.maxInCPU = zo.OffloadParam.MaxInCPU
	}
	if zo.OffloadOptimizer.Device == config.OffloadNVMe {
		s.optimStore = storeOptions(cfg, pathsFor(cfg, zo.OffloadOptimizer.NVMePath))
	}
	s.sched, s.schedErr = schedule.FromConfig(cfg, totalSteps)
	s.scaler = schedule.LossScalerOptionsOf(cfg)
	s.nvmePaths = cfg.NVMePaths()
	s.gds.Paths = cfg.NVMePaths()
	s.device.simBytes = cfg.GPUBytes(0)
	direct, _ := aio.ParseDirectPolicy(string(cfg.Zinf.Direct))
	s.engine.Direct, s.gds.Direct = direct, direct
	return s
}
