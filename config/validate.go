package config

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Validate checks every field and the rules between fields, and returns an
// *Error listing all problems at once, or nil. Parse and Load call it; call
// it again after changing a Config in code.
//
// Beyond each field's type, range and allowed words (see the reference
// table in the package documentation), it enforces:
//   - offload_param needs ZeRO stage 3 (DeepSpeed's rule); offload_optimizer
//     needs stage 1 or more, and stage 3 for nvme or for a ratio below 1;
//   - an offload device "nvme" needs a directory: its nvme_path or
//     zinf.nvme_paths;
//   - rank < world_size;
//   - fp16 and bf16 are not both enabled;
//   - zinf.gds "required" needs a device that can be CUDA and O_DIRECT not
//     turned off.
func (c *Config) Validate() error {
	var k checker
	z := &c.ZeroOptimization
	k.limit("zero_optimization.stage", int64(z.Stage))
	k.limit("zero_optimization.sub_group_size", z.SubGroupSize)

	// offload_param.
	op := &z.OffloadParam
	k.enum("zero_optimization.offload_param.device", string(op.Device))
	if op.Device == OffloadCPU || op.Device == OffloadNVMe {
		if z.Stage != 3 {
			k.add("zero_optimization.offload_param.device", strconv.Quote(string(op.Device)),
				fmt.Sprintf("needs zero_optimization.stage 3 (stage is %d)", z.Stage), "")
		}
	}
	c.checkPath(&k, "offload_param", op.Device, op.NVMePath)
	k.limit("zero_optimization.offload_param.buffer_count", int64(op.BufferCount))
	k.limit("zero_optimization.offload_param.buffer_size", op.BufferSize)
	k.limit("zero_optimization.offload_param.max_in_cpu", op.MaxInCPU)

	// offload_optimizer.
	oo := &z.OffloadOptimizer
	k.enum("zero_optimization.offload_optimizer.device", string(oo.Device))
	switch {
	case oo.Device == OffloadNVMe && z.Stage != 3:
		k.add("zero_optimization.offload_optimizer.device", strconv.Quote(string(oo.Device)),
			fmt.Sprintf("needs zero_optimization.stage 3 (stage is %d)", z.Stage), "")
	case oo.Device == OffloadCPU && z.Stage == 0:
		k.add("zero_optimization.offload_optimizer.device", strconv.Quote(string(oo.Device)),
			"needs zero_optimization.stage 1, 2 or 3 (stage is 0)", "")
	}
	c.checkPath(&k, "offload_optimizer", oo.Device, oo.NVMePath)
	k.limit("zero_optimization.offload_optimizer.buffer_count", int64(oo.BufferCount))
	if !(oo.Ratio > 0 && oo.Ratio <= 1) {
		k.add("zero_optimization.offload_optimizer.ratio", formatFloat(oo.Ratio), "is out of range", "greater than 0, at most 1")
	} else if oo.Ratio < 1 && z.Stage != 3 {
		k.add("zero_optimization.offload_optimizer.ratio", formatFloat(oo.Ratio),
			fmt.Sprintf("below 1 needs zero_optimization.stage 3 (stage is %d)", z.Stage), "")
	}

	// aio.
	a := &c.AIO
	if bs := int64(a.BlockSize); bs <= 0 || bs%4096 != 0 && bs&(bs-1) != 0 {
		k.add("aio.block_size", strconv.FormatInt(bs, 10), "is not allowed", "a power of two or a multiple of 4096")
	}
	k.limit("aio.queue_depth", int64(a.QueueDepth))
	k.limit("aio.intra_op_parallelism", int64(a.IntraOpParallelism))

	// optimizer and training.
	o := &c.Optimizer
	k.enum("optimizer.type", string(o.Type))
	// The optimizer computes in float32: a value that float32 cannot hold
	// (beyond 3.4e38, or so small it becomes 0) would change meaning.
	k.float32Key("optimizer.params.lr", o.LR, o.LR >= 0, ">= 0")
	for i, b := range o.Betas {
		key := fmt.Sprintf("optimizer.params.betas[%d]", i)
		switch {
		case !(b >= 0 && b < 1):
			k.add(key, formatFloat(b), "is out of range", ">= 0 and < 1")
		case float32(b) >= 1 || !fitsFloat32(b):
			k.add(key, formatFloat(b), "is out of range: it rounds to "+formatFloat(float64(float32(b)))+" as the float32 the optimizer computes with",
				">= 0 and < 1; as a float32: 0, or from 1.4e-45 to 0.99999994")
		}
	}
	k.float32Key("optimizer.params.eps", o.Eps, o.Eps > 0, "> 0")
	k.float32Key("optimizer.params.weight_decay", o.WeightDecay, o.WeightDecay >= 0, ">= 0")
	if c.BF16 && c.FP16 {
		k.add("bf16.enabled", "true", "conflicts with fp16.enabled true", "at most one of bf16 and fp16")
	}
	k.limit("gradient_accumulation_steps", int64(c.GradientAccumulationSteps))
	k.limit("train_micro_batch_size_per_gpu", int64(c.MicroBatch))

	c.validateTraining(&k)

	// zinf.
	zi := &c.Zinf
	k.limit("zinf.tiers.gpu_bytes", int64(zi.Tiers.GPUBytes))
	k.limit("zinf.tiers.cpu_pinned_bytes", int64(zi.Tiers.CPUPinnedBytes))
	seen := map[string]bool{}
	for i, p := range zi.NVMePaths {
		key := fmt.Sprintf("zinf.nvme_paths[%d]", i)
		switch {
		case strings.TrimSpace(p) == "":
			k.add(key, strconv.Quote(p), "is empty", "a directory")
		case seen[filepath.Clean(p)]:
			k.add(key, strconv.Quote(p), "is listed twice", "")
		default:
			k.checkSwapDir(key, p)
		}
		seen[filepath.Clean(p)] = true
	}
	k.enum("zinf.direct", string(zi.Direct))
	k.enum("zinf.backend", string(zi.Backend))
	k.limit("zinf.pipeline_depth", int64(zi.PipelineDepth))
	k.enum("zinf.gds", string(zi.GDS))
	k.enum("zinf.device", string(zi.Device))
	if zi.GDS == GDSRequired {
		if zi.Device == DeviceSim {
			k.add("zinf.gds", strconv.Quote(string(zi.GDS)), `needs a CUDA device (zinf.device is "sim")`, "")
		}
		if zi.Direct == DirectOff {
			k.add("zinf.gds", strconv.Quote(string(zi.GDS)), `needs O_DIRECT (zinf.direct is "off")`, "")
		}
	}
	k.problems = append(k.problems, c.envProblems...)
	k.limit("zinf.world_size", int64(zi.WorldSize))
	switch {
	case zi.Rank < 0:
		k.limit("zinf.rank", int64(zi.Rank))
	case zi.WorldSize >= 1 && zi.Rank >= zi.WorldSize:
		k.add("zinf.rank", strconv.Itoa(zi.Rank), fmt.Sprintf("is not below zinf.world_size %d", zi.WorldSize),
			rangeText(0, int64(zi.WorldSize)-1))
	}
	k.limit("zinf.swap_file_bytes", int64(zi.SwapFileBytes))
	k.limit("zinf.piece_bytes", int64(zi.PieceBytes))
	k.limit("zinf.prefetch_depth", int64(zi.PrefetchDepth))
	k.limit("zinf.optimizer_workers", int64(zi.OptimizerWorkers))
	bw := &zi.Bandwidth
	k.limit("zinf.bandwidth.read_bytes_per_sec", int64(bw.ReadBytesPerSec))
	k.limit("zinf.bandwidth.write_bytes_per_sec", int64(bw.WriteBytesPerSec))
	switch {
	case bw.ReadBytesPerSec > 0 && bw.WriteBytesPerSec == 0:
		k.add("zinf.bandwidth.write_bytes_per_sec", "0", "is missing: zinf.bandwidth.read_bytes_per_sec is set", "both figures or neither")
	case bw.WriteBytesPerSec > 0 && bw.ReadBytesPerSec == 0:
		k.add("zinf.bandwidth.read_bytes_per_sec", "0", "is missing: zinf.bandwidth.write_bytes_per_sec is set", "both figures or neither")
	}
	if f := bw.File; f != "" && (strings.TrimSpace(f) == "" || strings.ContainsRune(f, 0)) {
		k.add("zinf.bandwidth.file", strconv.Quote(f), "is not a file name", "a path to a `zinf tune --bandwidth-file` result")
	}
	k.limit("zinf.bandwidth.probe_bytes", int64(bw.ProbeBytes))
	k.limit("zinf.nvme_tbw", int64(zi.NVMeTBW))
	k.enum("zinf.kv_cache.device", string(zi.KVCache.Device))
	k.limit("zinf.kv_cache.bytes", int64(zi.KVCache.Bytes))
	k.enum("zinf.activations.device", string(zi.Activations.Device))
	k.limit("zinf.activations.memory_bytes", int64(zi.Activations.MemoryBytes))
	k.limit("zinf.activations.cpu_bytes", int64(zi.Activations.CPUBytes))
	k.durationLimit("zinf.pinned_stall_timeout", zi.PinnedStallTimeout)
	k.durationLimit("zinf.comm_stall_timeout", zi.CommStallTimeout)
	k.durationLimit("zinf.comm_heartbeat_timeout", zi.CommHeartbeatTimeout)

	return errorOf("", k.problems)
}

var devices = []string{string(OffloadNone), string(OffloadCPU), string(OffloadNVMe)}

// intLimits holds the inclusive range of each integer key; Validate checks
// it and the decoder quotes it when a value has the wrong type.
var intLimits = map[string][2]int64{
	"zero_optimization.stage":                          {0, 3},
	"zero_optimization.sub_group_size":                 {1, math.MaxInt64},
	"zero_optimization.offload_param.buffer_count":     {1, math.MaxInt32},
	"zero_optimization.offload_param.buffer_size":      {1, math.MaxInt64},
	"zero_optimization.offload_param.max_in_cpu":       {0, math.MaxInt64},
	"zero_optimization.offload_optimizer.buffer_count": {1, math.MaxInt32},
	"aio.queue_depth":                                  {1, 4096},
	"aio.intra_op_parallelism":                         {1, 64},
	"gradient_accumulation_steps":                      {1, math.MaxInt32},
	"train_micro_batch_size_per_gpu":                   {1, math.MaxInt32},
	"zinf.tiers.gpu_bytes":                             {0, math.MaxInt64},
	"zinf.tiers.cpu_pinned_bytes":                      {1, math.MaxInt64},
	"zinf.pipeline_depth":                              {0, 16},
	"zinf.world_size":                                  {1, math.MaxInt32},
	"zinf.rank":                                        {0, math.MaxInt32},
	"zinf.swap_file_bytes":                             {0, math.MaxInt64},
	"zinf.piece_bytes":                                 {0, 1 << 40},
	"zinf.prefetch_depth":                              {0, 1024},
	"zinf.optimizer_workers":                           {0, 1024},
	"fp16.initial_scale_power":                         {0, 126},
	"fp16.loss_scale_window":                           {1, math.MaxInt32},
	"fp16.hysteresis":                                  {1, math.MaxInt32},
	"scheduler.params.warmup_num_steps":                {1, math.MaxInt32},
	"scheduler.params.total_num_steps":                 {1, math.MaxInt32},
	"scheduler.params.cycle_first_step_size":           {1, math.MaxInt32},
	"scheduler.params.cycle_second_step_size":          {1, math.MaxInt32},
	"scheduler.params.cycle_first_stair_count":         {0, math.MaxInt32},
	"scheduler.params.cycle_second_stair_count":        {0, math.MaxInt32},
	"scheduler.params.decay_step_size":                 {0, math.MaxInt32},
	// 100 GB/s per path is beyond any single device; a larger figure is
	// a typo (bits for bytes, an extra zero).
	"zinf.bandwidth.read_bytes_per_sec":  {0, 100e9},
	"zinf.bandwidth.write_bytes_per_sec": {0, 100e9},
	"zinf.bandwidth.probe_bytes":         {1 << 20, 1 << 30},
	"zinf.nvme_tbw":                      {0, math.MaxInt64},
	"zinf.kv_cache.bytes":                {0, math.MaxInt64},
	"zinf.activations.memory_bytes":      {0, math.MaxInt64},
	"zinf.activations.cpu_bytes":         {0, math.MaxInt64},
}

// enumValues holds the words each string key allows.
var enumValues = map[string][]string{
	"zero_optimization.offload_param.device":     devices,
	"zero_optimization.offload_optimizer.device": devices,
	"optimizer.type":               optimizerTypes,
	"zinf.direct":                  {string(DirectRequired), string(DirectOptional), string(DirectOff)},
	"zinf.backend":                 {string(BackendAuto), string(BackendURing), string(BackendLibaio), string(BackendPosix)},
	"zinf.gds":                     {string(GDSOff), string(GDSAuto), string(GDSRequired)},
	"zinf.device":                  {string(DeviceAuto), string(DeviceSim), string(DeviceCUDA)},
	"zinf.speculate":               {string(SpeculateAuto), string(SpeculateAlways), string(SpeculateNever)},
	"zinf.pinned_grads":            {string(PinnedGradsAuto), string(PinnedGradsOff)},
	"zinf.schedule":                {string(ScheduleAuto), string(ScheduleLayerMajor), string(ScheduleMicroBatchMajor)},
	"zinf.optimizer_states":        {string(OptimizerStatesFP32), string(OptimizerStatesBF16), string(OptimizerStates8Bit)},
	"zinf.kv_cache.device":         {string(KVCacheAuto), string(KVCacheMemory), string(KVCacheCPU), string(KVCacheNVMe)},
	"zinf.activations.device":      {string(ActivationsAuto), string(ActivationsMemory), string(ActivationsCPU), string(ActivationsNVMe)},
	"scheduler.type":               schedulerTypes,
	"scheduler.params.warmup_type": {WarmupLog, WarmupLinear},
}

// allowedFor describes what key accepts, for messages about a value of the
// wrong type.
func allowedFor(key string) string {
	if key == "gradient_accumulation_steps" {
		return `>= 1, or "auto" (the planner picks)`
	}
	if l, ok := intLimits[key]; ok {
		return rangeText(l[0], l[1])
	}
	if e, ok := enumValues[key]; ok {
		return strings.Join(e, ", ")
	}
	return ""
}

// checkPath enforces that an nvme offload has somewhere to put its files,
// and that the directory it names is one for swap files (checkSwapDir).
func (c *Config) checkPath(k *checker, sectionName string, dev OffloadDevice, path string) {
	if path != "" {
		k.checkSwapDir("zero_optimization."+sectionName+".nvme_path", path)
	}
	if dev != OffloadNVMe || path != "" || len(c.Zinf.NVMePaths) > 0 {
		return
	}
	k.add("zero_optimization."+sectionName+".nvme_path", `""`,
		`is empty but device is "nvme"`, "a directory, here or in zinf.nvme_paths")
}

// systemDirs are directories of the operating system that are never a
// place for swap files: the root itself, and the top-level directories
// whose contents the system owns. A path inside one of systemTrees is
// refused too; elsewhere only the directory itself is (/var/tmp and
// /run/user/1000/x are fine, /var is not).
var (
	systemDirs = []string{"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
		"/proc", "/run", "/sbin", "/sys", "/usr", "/var"}
	systemTrees = []string{"/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr"}
)

// checkSwapDir refuses a swap directory that names a system directory
// (systemDirs) or that holds a ".." component: swap files are created,
// rewritten and removed there, so the directory must be the one the user
// means, written as it is. /dev is refused but /dev/shm, a RAM filesystem,
// is a warning at Open (zinf.Open: RAM, not NVMe).
func (k *checker) checkSwapDir(key, path string) {
	for _, part := range strings.Split(filepath.ToSlash(path), "/") {
		if part == ".." {
			k.add(key, strconv.Quote(path), `has a ".." component`, "a directory written without \"..\" (the directory it leads to)")
			return
		}
	}
	clean := filepath.Clean(path)
	if !filepath.IsAbs(clean) {
		return
	}
	system := slices.Contains(systemDirs, clean)
	for _, tree := range systemTrees {
		if strings.HasPrefix(clean, tree+"/") {
			system = true
		}
	}
	if strings.HasPrefix(clean, "/dev/") && clean != "/dev/shm" && !strings.HasPrefix(clean, "/dev/shm/") {
		system = true
	}
	if system {
		k.add(key, strconv.Quote(path), "is a system directory, not one for swap files",
			"a directory on the NVMe drive, such as /local_nvme/zinf (not /, /etc, /usr, /proc, /sys, /dev, /var, ...)")
	}
}

// checker collects problems found by Validate.
type checker struct{ problems []Problem }

func (k *checker) add(key, value, msg, allowed string) {
	k.problems = append(k.problems, Problem{Key: key, Value: value, Msg: msg, Allowed: allowed})
}

func (k *checker) limit(key string, v int64) {
	l := intLimits[key]
	k.intRange(key, v, l[0], l[1])
}

func (k *checker) intRange(key string, v, lo, hi int64) {
	if v < lo || v > hi {
		k.add(key, strconv.FormatInt(v, 10), "is out of range", rangeText(lo, hi))
	}
}

func (k *checker) enum(key, v string) {
	allowed := enumValues[key]
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	k.add(key, strconv.Quote(v), "is not allowed", strings.Join(allowed, ", "))
}

// float32Range says which values a float32 holds, for keys the
// optimizer reads as one.
const float32Range = "as a float32: 0 or a magnitude from 1.4e-45 to 3.4028235e+38"

// fitsFloat32 reports whether v keeps its meaning as a float32: finite,
// and not so small that it rounds to 0.
func fitsFloat32(v float64) bool {
	f := float32(v)
	return !math.IsNaN(v) && !math.IsInf(float64(f), 0) && (v == 0 || f != 0)
}

// float32Key checks a value the optimizer reads as a float32: ok is the
// key's own rule, which allowed describes; a value that keeps the rule but
// that float32 cannot hold (it would become Inf or 0) is refused too,
// saying so.
func (k *checker) float32Key(key string, v float64, ok bool, allowed string) {
	switch {
	case !ok || math.IsInf(v, 0):
		k.add(key, formatFloat(v), "is out of range", allowed)
	case !fitsFloat32(v):
		k.add(key, formatFloat(v), "is out of range: it becomes "+formatFloat(float64(float32(v)))+" as the float32 the optimizer computes with",
			allowed+"; "+float32Range)
	}
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
