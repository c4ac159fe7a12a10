package zinf

import (
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
)

// TiersFor maps a config's tiers to the policy's view of them. Given the
// runtimes opened with cfg, the GPU tier is the device memory they have (a
// CUDA device's capacity when zinf.tiers.gpu_bytes is unset; see
// Runtime.GPUCapacityBytes), the CPU tier leaves out the pinned staging
// buffers their device I/O holds, and the NVMe bandwidth is the one the
// first runtime planned with (Runtime.Bandwidth). Without runtimes it is
// what the config says, and the NVMe bandwidth is the config's figures
// (zinf.bandwidth.read_bytes_per_sec, write_bytes_per_sec) or the defaults
// per path: no file is read and nothing probed (NVMeBandwidth does that).
func TiersFor(cfg *config.Config, rts ...*Runtime) policy.Tiers {
	bw := plan.StaticBandwidth(cfg)
	for _, rt := range rts {
		if rt != nil {
			bw = rt.bandwidth
			break
		}
	}
	gpuBytes, cpuBytes := tierBytes(cfg, rts)
	return plan.Tiers(cfg, bw, gpuBytes, cpuBytes)
}

// PlanFor places a model's tensors for this config with DeepSpeed's
// buffer keys (offload_param.buffer_count and buffer_size,
// offload_optimizer.buffer_count) as the policy reads them: what lives on
// GPU, CPU or NVMe, buffer counts, prefetch depth and the predicted step
// time. Pass the runtimes opened with cfg, when there are any, so the plan
// counts the memory and bandwidth they really have (see TiersFor). What
// Open decides — tiers, pinned reservations, disk — is PlanModel's.
func PlanFor(cfg *config.Config, m policy.ModelSpec, computePerLayer time.Duration, rts ...*Runtime) (*policy.Placement, error) {
	rank, _ := cfg.RankWorld()
	if rank >= m.World {
		rank = 0
	}
	return policy.Plan(TiersFor(cfg, rts...), m.Inventory(rank, m.World), plan.HintsFor(cfg, m.Layers, computePerLayer))
}
