package zinf

import (
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/policy"
)

// Default NVMe bandwidth assumptions for plans when nothing is measured:
// conservative figures for one datacenter NVMe drive. `zinf tune` measures
// the real ones.
const (
	DefaultNVMeReadBps  = 2e9
	DefaultNVMeWriteBps = 1.5e9
)

// TiersFor maps a config's tiers to the policy's view of them. Given the
// runtimes opened with cfg, the GPU tier is the device memory they have (a
// CUDA device's capacity when zinf.tiers.gpu_bytes is unset; see
// Runtime.GPUCapacityBytes) and the CPU tier leaves out the pinned staging
// buffers their device I/O holds; without them it is what the config says.
func TiersFor(cfg *config.Config, rts ...*Runtime) policy.Tiers {
	paths := len(cfg.NVMePaths())
	gpuBytes, cpuBytes := tierBytes(cfg, rts)
	return policy.Tiers{GPUBytes: gpuBytes, CPUBytes: cpuBytes,
		NVMeReadBps: DefaultNVMeReadBps * float64(max(paths, 1)), NVMeWriteBps: DefaultNVMeWriteBps * float64(max(paths, 1)), NVMePaths: paths}
}

// HintsFor maps a config's DeepSpeed offload keys to the policy's hints.
func HintsFor(cfg *config.Config, layers int, computePerLayer time.Duration) policy.Hints {
	zo := cfg.ZeroOptimization
	// DeepSpeed counts max_in_cpu and buffer_size in elements.
	elem := int64(ParamDType(cfg).Size())
	return policy.Hints{ParamDevice: string(zo.OffloadParam.Device), OptimizerDevice: string(zo.OffloadOptimizer.Device),
		MaxInCPUBytes: zo.OffloadParam.MaxInCPU * elem, ParamBufferCount: int64(zo.OffloadParam.BufferCount), ParamBufferBytes: zo.OffloadParam.BufferSize * elem,
		OptimizerBufferCount: zo.OffloadOptimizer.BufferCount, Ratio: zo.OffloadOptimizer.Ratio,
		SubGroupElems: zo.SubGroupSize, PrefetchDepth: cfg.Zinf.PrefetchDepth, ComputeSecondsPerLayer: 2 * computePerLayer.Seconds(), Layers: layers}
}

// PlanFor places a model's tensors for this config: what lives on GPU, CPU
// or NVMe, buffer counts, prefetch depth and the predicted step time. Pass
// the runtimes opened with cfg, when there are any, so the plan counts the
// memory they really have (see TiersFor): on a CUDA device without
// zinf.tiers.gpu_bytes, the GPU tier is the device's memory.
func PlanFor(cfg *config.Config, m policy.ModelSpec, computePerLayer time.Duration, rts ...*Runtime) (*policy.Placement, error) {
	rank, _ := cfg.RankWorld()
	if rank >= m.World {
		rank = 0
	}
	return policy.Plan(TiersFor(cfg, rts...), m.Inventory(rank, m.World), HintsFor(cfg, m.Layers, computePerLayer))
}
