package config

import (
	"bytes"
	"encoding/json"
)

// The wire types fix the key names and order of what MarshalJSON writes.
// They hold every value explicitly, derived ones included (pipeline_depth,
// gds, rank, world_size), so that parsing the output gives back the same
// Config whatever the environment.

type wireConfig struct {
	TrainMicroBatch           int           `json:"train_micro_batch_size_per_gpu"`
	GradientAccumulationSteps any           `json:"gradient_accumulation_steps"` // a number or "auto"
	GradientClipping          float64       `json:"gradient_clipping"`
	Optimizer                 wireOptimizer `json:"optimizer"`
	Scheduler                 *wireSched    `json:"scheduler,omitempty"`
	FP16                      wireFP16      `json:"fp16"`
	BF16                      wireEnabled   `json:"bf16"`
	ZeroOptimization          wireZero      `json:"zero_optimization"`
	AIO                       wireAIO       `json:"aio"`
	Zinf                      wireZinf      `json:"zinf"`
	// ActivationCheckpointing is written only when cpu_checkpointing is on.
	ActivationCheckpointing *struct {
		CPUCheckpointing bool `json:"cpu_checkpointing"`
	} `json:"activation_checkpointing,omitempty"`
}

// wireOptimizer writes the params of its type only (the others are
// refused when read).
type wireOptimizer struct {
	Type   OptimizerType  `json:"type"`
	Params map[string]any `json:"params"`
}

func optimizerWire(o Optimizer) wireOptimizer {
	p := map[string]any{"lr": o.LR, "weight_decay": o.WeightDecay}
	switch o.Type {
	case OptimizerSGD:
		p["momentum"], p["dampening"], p["nesterov"] = o.Momentum, o.Dampening, o.Nesterov
	case OptimizerAdagrad:
		p["eps"], p["lr_decay"], p["initial_accumulator_value"] = o.Eps, o.LRDecay, o.InitialAccumulatorValue
	case OptimizerLion:
		p["betas"] = o.Betas
	default:
		p["betas"], p["eps"], p["adam_w_mode"] = o.Betas, o.Eps, o.AdamWMode
	}
	return wireOptimizer{Type: o.Type, Params: p}
}

type wireEnabled struct {
	Enabled bool `json:"enabled"`
}

type wireFP16 struct {
	Enabled bool `json:"enabled"`
	// The loss-scaling keys are written when they act (fp16 enabled) or
	// differ from their defaults, so that an fp32 or bf16 config reads back
	// without the warning that they do not act.
	*wireScaling
}

type wireScaling struct {
	LossScale             float64 `json:"loss_scale"`
	InitialScalePower     int     `json:"initial_scale_power"`
	LossScaleWindow       int     `json:"loss_scale_window"`
	Hysteresis            int     `json:"hysteresis"`
	ConsecutiveHysteresis bool    `json:"consecutive_hysteresis"`
	MinLossScale          float64 `json:"min_loss_scale"`
}

// wireSched writes the params of its type only (the others are refused
// when read).
type wireSched struct {
	Type   SchedulerType  `json:"type"`
	Params map[string]any `json:"params"`
}

func totalWire(s Scheduler) any {
	if s.TotalNumStepsAuto {
		return "auto"
	}
	return s.TotalNumSteps
}

func schedWire(s Scheduler) *wireSched {
	var p map[string]any
	switch s.Type {
	case SchedulerNone:
		return nil
	case SchedulerWarmupLR, SchedulerWarmupDecayLR:
		p = map[string]any{"warmup_min_lr": s.WarmupMinLR, "warmup_max_lr": s.WarmupMaxLR,
			"warmup_num_steps": s.WarmupNumSteps, "warmup_type": s.WarmupType}
		if s.Type == SchedulerWarmupDecayLR {
			p["total_num_steps"] = totalWire(s)
		}
	case SchedulerWarmupCosineLR:
		p = map[string]any{"warmup_num_steps": s.WarmupNumSteps, "warmup_type": s.WarmupType, "total_num_steps": totalWire(s),
			"warmup_min_ratio": s.WarmupMinRatio, "cos_min_ratio": s.CosMinRatio}
	default: // OneCycle, and a type Validate refuses
		p = map[string]any{"cycle_min_lr": s.CycleMinLR, "cycle_max_lr": s.CycleMaxLR, "decay_lr_rate": s.DecayLRRate,
			"cycle_first_step_size": s.CycleFirstStepSize, "cycle_second_step_size": s.CycleSecondStepSize,
			"cycle_first_stair_count": s.CycleFirstStairCount, "cycle_second_stair_count": s.CycleSecondStairCount,
			"decay_step_size": s.DecayStepSize, "cycle_momentum": s.CycleMomentum, "cycle_min_mom": s.CycleMinMom,
			"cycle_max_mom": s.CycleMaxMom, "decay_mom_rate": s.DecayMomRate}
	}
	return &wireSched{Type: s.Type, Params: p}
}

type wireZero struct {
	Stage            int                  `json:"stage"`
	SubGroupSize     int64                `json:"sub_group_size"`
	OffloadParam     wireOffloadParam     `json:"offload_param"`
	OffloadOptimizer wireOffloadOptimizer `json:"offload_optimizer"`
}

type wireOffloadParam struct {
	Device      OffloadDevice `json:"device"`
	NVMePath    string        `json:"nvme_path"`
	BufferCount int           `json:"buffer_count"`
	BufferSize  int64         `json:"buffer_size"`
	MaxInCPU    int64         `json:"max_in_cpu"`
	PinMemory   bool          `json:"pin_memory"`
}

type wireOffloadOptimizer struct {
	Device        OffloadDevice `json:"device"`
	NVMePath      string        `json:"nvme_path"`
	BufferCount   int           `json:"buffer_count"`
	PinMemory     bool          `json:"pin_memory"`
	PipelineRead  bool          `json:"pipeline_read"`
	PipelineWrite bool          `json:"pipeline_write"`
	FastInit      bool          `json:"fast_init"`
	Ratio         float64       `json:"ratio"`
}

type wireAIO struct {
	BlockSize          Size `json:"block_size"`
	QueueDepth         int  `json:"queue_depth"`
	IntraOpParallelism int  `json:"intra_op_parallelism"`
	SingleSubmit       bool `json:"single_submit"`
	OverlapEvents      bool `json:"overlap_events"`
	UseGDS             bool `json:"use_gds"`
}

type wireZinf struct {
	Tiers struct {
		GPUBytes       Size `json:"gpu_bytes"`
		CPUPinnedBytes Size `json:"cpu_pinned_bytes"`
	} `json:"tiers"`
	NVMePaths     []string   `json:"nvme_paths,omitempty"`
	Checksums     bool       `json:"checksums"`
	Direct        DirectMode `json:"direct"`
	Backend       Backend    `json:"backend"`
	PipelineDepth any        `json:"pipeline_depth"` // a number or "auto"
	GDS           GDSMode    `json:"gds"`
	Device        Device     `json:"device"`
	Rank          int        `json:"rank"`
	WorldSize     int        `json:"world_size"`
	SwapFileBytes Size       `json:"swap_file_bytes"`
	// Preallocate is written only when false (its default is true), so
	// files stay as they were.
	Preallocate *bool `json:"preallocate,omitempty"`
	// PieceBytes is written only when set, so files stay as they were.
	PieceBytes    Size          `json:"piece_bytes,omitempty"`
	PrefetchDepth int           `json:"prefetch_depth"`
	Speculate     SpeculateMode `json:"speculate"`
	// PinnedGrads is written only when it is not auto, so files stay as they were.
	PinnedGrads PinnedGradsMode `json:"pinned_grads,omitempty"`
	// OverlapUpdate is written only when set, so files stay as they were.
	OverlapUpdate bool `json:"overlap_update,omitempty"`
	// Schedule is written only when it is not auto, so files stay as they were.
	Schedule ScheduleMode `json:"schedule,omitempty"`
	// OptimizerWorkers is written only when set, so files stay as they were.
	OptimizerWorkers int `json:"optimizer_workers,omitempty"`
	// OptimizerStates is written only when it is not fp32, so files stay
	// as they were.
	OptimizerStates     OptimizerStates `json:"optimizer_states,omitempty"`
	OptimizerStatesFP32 []string        `json:"optimizer_states_fp32,omitempty"`
	Bandwidth           struct {
		ReadBytesPerSec  Size   `json:"read_bytes_per_sec"`
		WriteBytesPerSec Size   `json:"write_bytes_per_sec"`
		File             string `json:"file,omitempty"`
		Probe            bool   `json:"probe"`
		ProbeBytes       Size   `json:"probe_bytes"`
	} `json:"bandwidth"`
	// NVMeTBW too.
	NVMeTBW Size `json:"nvme_tbw,omitempty"`
	KVCache struct {
		Device KVCacheDevice `json:"device"`
		Bytes  Size          `json:"bytes"`
	} `json:"kv_cache"`
	// Activations is written only when set, so files stay as they were.
	Activations *struct {
		Device      ActivationsDevice `json:"device,omitempty"`
		MemoryBytes Size              `json:"memory_bytes,omitempty"`
		CPUBytes    Size              `json:"cpu_bytes,omitempty"`
	} `json:"activations,omitempty"`
	// The timeouts are written only when not the default.
	PinnedStallTimeout   *Duration `json:"pinned_stall_timeout,omitempty"`
	CommStallTimeout     *Duration `json:"comm_stall_timeout,omitempty"`
	CommHeartbeatTimeout *Duration `json:"comm_heartbeat_timeout,omitempty"`
}

func aioWire(a AIO) wireAIO {
	return wireAIO{
		BlockSize:          a.BlockSize,
		QueueDepth:         a.QueueDepth,
		IntraOpParallelism: a.IntraOpParallelism,
		SingleSubmit:       a.SingleSubmit,
		OverlapEvents:      a.OverlapEvents,
		UseGDS:             a.UseGDS,
	}
}

// MarshalJSON writes the config as a complete config file that Parse reads
// back to an equal Config: every key zinf acts on, with its effective value,
// under DeepSpeed's key names, plus the "zinf" section. Sizes are written as
// numbers of bytes. Warnings, ignored keys and Source are not written.
func (c *Config) MarshalJSON() ([]byte, error) {
	var w wireConfig
	w.TrainMicroBatch = c.MicroBatch
	w.GradientAccumulationSteps = c.GradientAccumulationSteps
	if c.GradientAccumulationAuto {
		w.GradientAccumulationSteps = "auto"
	}
	w.Optimizer = optimizerWire(c.Optimizer)
	w.GradientClipping = c.GradientClipping
	if c.CPUCheckpointing {
		w.ActivationCheckpointing = &struct {
			CPUCheckpointing bool `json:"cpu_checkpointing"`
		}{true}
	}
	w.Scheduler = schedWire(c.Scheduler)
	l := c.LossScaling
	w.FP16.Enabled = c.FP16
	if c.FP16 || l != defaults().LossScaling {
		w.FP16.wireScaling = &wireScaling{LossScale: l.LossScale, InitialScalePower: l.InitialScalePower, LossScaleWindow: l.LossScaleWindow,
			Hysteresis: l.Hysteresis, ConsecutiveHysteresis: l.ConsecutiveHysteresis, MinLossScale: l.MinLossScale}
	}
	w.BF16.Enabled = c.BF16
	z := c.ZeroOptimization
	w.ZeroOptimization = wireZero{
		Stage:        z.Stage,
		SubGroupSize: z.SubGroupSize,
		OffloadParam: wireOffloadParam(z.OffloadParam),
		OffloadOptimizer: wireOffloadOptimizer{
			Device:        z.OffloadOptimizer.Device,
			NVMePath:      z.OffloadOptimizer.NVMePath,
			BufferCount:   z.OffloadOptimizer.BufferCount,
			PinMemory:     z.OffloadOptimizer.PinMemory,
			PipelineRead:  z.OffloadOptimizer.PipelineRead,
			PipelineWrite: z.OffloadOptimizer.PipelineWrite,
			FastInit:      z.OffloadOptimizer.FastInit,
			Ratio:         z.OffloadOptimizer.Ratio,
		},
	}
	w.AIO = aioWire(c.AIO)
	zi := c.Zinf
	w.Zinf.Tiers.GPUBytes = zi.Tiers.GPUBytes
	w.Zinf.Tiers.CPUPinnedBytes = zi.Tiers.CPUPinnedBytes
	w.Zinf.NVMePaths = zi.NVMePaths
	w.Zinf.Checksums = zi.Checksums
	w.Zinf.Direct = zi.Direct
	w.Zinf.Backend = zi.Backend
	w.Zinf.PipelineDepth = zi.PipelineDepth
	if zi.PipelineDepthAuto {
		w.Zinf.PipelineDepth = "auto"
	}
	w.Zinf.GDS = zi.GDS
	w.Zinf.Device = zi.Device
	w.Zinf.Rank = zi.Rank
	w.Zinf.WorldSize = zi.WorldSize
	w.Zinf.SwapFileBytes = zi.SwapFileBytes
	if !zi.Preallocate {
		w.Zinf.Preallocate = new(bool)
	}
	w.Zinf.PieceBytes = zi.PieceBytes
	w.Zinf.PrefetchDepth = zi.PrefetchDepth
	w.Zinf.OptimizerWorkers = zi.OptimizerWorkers
	if zi.OptimizerStates != OptimizerStatesFP32 {
		w.Zinf.OptimizerStates = zi.OptimizerStates
	}
	w.Zinf.OptimizerStatesFP32 = zi.OptimizerStatesFP32
	w.Zinf.Speculate = zi.Speculate
	if zi.PinnedGrads != PinnedGradsAuto {
		w.Zinf.PinnedGrads = zi.PinnedGrads
	}
	w.Zinf.OverlapUpdate = zi.OverlapUpdate
	if zi.Schedule != ScheduleAuto {
		w.Zinf.Schedule = zi.Schedule
	}
	w.Zinf.Bandwidth.ReadBytesPerSec = zi.Bandwidth.ReadBytesPerSec
	w.Zinf.Bandwidth.WriteBytesPerSec = zi.Bandwidth.WriteBytesPerSec
	w.Zinf.Bandwidth.File = zi.Bandwidth.File
	w.Zinf.Bandwidth.Probe = zi.Bandwidth.Probe
	w.Zinf.Bandwidth.ProbeBytes = zi.Bandwidth.ProbeBytes
	w.Zinf.NVMeTBW = zi.NVMeTBW
	w.Zinf.KVCache.Device = zi.KVCache.Device
	w.Zinf.KVCache.Bytes = zi.KVCache.Bytes
	if a := zi.Activations; a != (Activations{}) && a != (Activations{Device: ActivationsAuto}) {
		w.Zinf.Activations = &struct {
			Device      ActivationsDevice `json:"device,omitempty"`
			MemoryBytes Size              `json:"memory_bytes,omitempty"`
			CPUBytes    Size              `json:"cpu_bytes,omitempty"`
		}{a.Device, a.MemoryBytes, a.CPUBytes}
	}
	for _, d := range []struct {
		v, def Duration
		p      **Duration
	}{{zi.PinnedStallTimeout, DefaultPinnedStallTimeout, &w.Zinf.PinnedStallTimeout},
		{zi.CommStallTimeout, DefaultCommStallTimeout, &w.Zinf.CommStallTimeout},
		{zi.CommHeartbeatTimeout, DefaultCommHeartbeatTimeout, &w.Zinf.CommHeartbeatTimeout}} {
		if d.v != d.def {
			v := d.v
			*d.p = &v
		}
	}
	return marshalIndent(w)
}

// AIOSection renders a as a config fragment, the form `zinf tune` prints:
//
//	{
//	  "aio": {
//	    "block_size": 1048576,
//	    "queue_depth": 8,
//	    "intra_op_parallelism": 1,
//	    "single_submit": false,
//	    "overlap_events": true,
//	    "use_gds": false
//	  }
//	}
//
// Keys are DeepSpeed's (intra_op_parallelism, not the old thread_count),
// numbers are JSON numbers and switches JSON booleans, so the fragment can be
// pasted into a ds_config.json and is itself a config Parse accepts. It
// returns an *Error when a breaks the aio rules of Validate.
func AIOSection(a AIO) ([]byte, error) {
	c := defaults()
	c.AIO = a
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return marshalIndent(struct {
		AIO wireAIO `json:"aio"`
	}{aioWire(a)})
}

func marshalIndent(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
