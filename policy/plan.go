package policy

import (
	"fmt"
	"github.com/zinfio/zinf/buffers"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/zinfio/zinf/tensor"
)

// Usage counts tensors and their bytes.
type Usage struct {
	Tensors int
	Bytes   int64
}

// Placement is the outcome of Plan: where each tensor lives, the pinned
// buffers the swaps need, how far ahead parameters are fetched, and the
// predicted step time.
type Placement struct {
	// Tier maps every tensor of the inventory to its home tier.
	Tier map[string]tensor.Tier
	// BytesPerTier sums the tensors homed on each tier. Swap buffers and the
	// GPU working set are not tensors: see PinnedBytes and GPUWorkingBytes.
	BytesPerTier map[tensor.Tier]int64
	// PerKind breaks BytesPerTier down by kind.
	PerKind map[Kind]map[tensor.Tier]Usage
	// Offloaded is, per kind present, the fraction of its bytes not on the
	// GPU.
	Offloaded map[Kind]float64

	// ParamBufferCount pinned buffers of ParamBufferBytes each receive
	// parameters swapped in from NVMe: one layer in use plus PrefetchDepth
	// layers ahead. Both are 0 when no parameter lives on NVMe.
	ParamBufferCount int
	ParamBufferBytes int64
	// OptimizerBufferCount pinned buffers of OptimizerBufferBytes each stage
	// optimizer states and gradients swapped to and from NVMe. Both are 0
	// when none lives on NVMe.
	OptimizerBufferCount int
	OptimizerBufferBytes int64
	// ParamCacheBytes is the part of the CPU tier holding parameters that
	// offload_param.device "nvme" would otherwise swap (max_in_cpu).
	ParamCacheBytes int64
	// PinnedBytes is the pinned host memory the placement uses: CPU-tier
	// tensors plus every swap buffer. It never exceeds Tiers.CPUBytes.
	PinnedBytes int64
	// GPUWorkingBytes is GPU memory for offloaded tensors in use: two layers
	// of offloaded parameters (the one computing and the next arriving) and
	// one layer of offloaded gradients before they are copied out.
	// BytesPerTier[TierGPU]+GPUWorkingBytes never exceeds Tiers.GPUBytes.
	GPUWorkingBytes int64

	// PrefetchDepth is how many layers ahead of the one computing the
	// offloaded parameters are fetched.
	PrefetchDepth int
	// PrefetchBudgetBytes bounds the bytes fetched but not yet in use:
	// the parameter buffers beyond those of the layer in use.
	PrefetchBudgetBytes int64
	// OverlapStep says whether the optimizer step may overlap the backward
	// pass (each layer updated as soon as its gradient is final): true
	// when backward's and the optimizer's pinned working sets, together
	// OverlapStepBytes, fit the CPU budget.
	OverlapStep      bool
	OverlapStepBytes int64

	// Predicted is the predicted step time, in the order Schedule says.
	Predicted StepPrediction
	// Schedule is the order of the step's micro-batches the plan chose
	// (ScheduleLayerMajor or ScheduleMicroBatchMajor): the hint, or under
	// auto the one predicted faster; MicroBatches is their number.
	Schedule     string
	MicroBatches int
	// PredictedLayerMajor and PredictedMicroBatchMajor are the step
	// predicted in each order (Predicted is one of them): the same
	// compute, and each order's NVMe traffic.
	PredictedLayerMajor, PredictedMicroBatchMajor StepPrediction
	// NVMeDiskBytes is, when the caller sets it (zinf does), the disk the
	// swap files may reach: the NVMe tensors with the copies copy-on-write
	// keeps during a step, padded to the device and summed over paths.
	// BytesPerTier[TierNVMe] counts each tensor once. 0 = not known.
	NVMeDiskBytes int64
	// PinnedRows is, when the caller sets it (zinf does, from the pinned
	// pool's reservations, which are what it enforces), what the table
	// shows on the CPU tier instead of the planned parameter and optimizer
	// buffers.
	PinnedRows []PinnedRow
	// Notes explain decisions that differ from the hints, and warnings.
	Notes []string

	// Tiers and Hints are the inputs; Layers the layer count used.
	Tiers  Tiers
	Hints  Hints
	Layers int

	inv  []Tensor // sorted by Order, then Name
	size map[string]int64
}

// SizeOf returns the bytes of a tensor of the planned inventory, or 0 for
// a name it does not list.
// PinnedRow is one line of pinned memory in the table: what it holds and
// its bytes.
type PinnedRow struct {
	What  string
	Bytes int64
}

func (p *Placement) SizeOf(name string) int64 {
	return p.size[name]
}

// NVMeParamsByLayer returns, per layer, the names of the parameters homed
// on NVMe in order of use: the layers argument of NewScheduler.
func (p *Placement) NVMeParamsByLayer() [][]string {
	out := make([][]string, p.Layers)
	for _, t := range p.inv {
		if t.Kind == Param && p.Tier[t.Name] == tensor.TierNVMe {
			out[t.Layer] = append(out[t.Layer], t.Name)
		}
	}
	return out
}

// Optimizer tensor names end in one of these; a gradient in gradSuffix.
// Tensors sharing the stem belong to one parameter's optimizer group, so
// they are offloaded together when Hints.Ratio < 1.
var optimSuffixes = []string{".master", ".exp_avg_sq", ".exp_avg"}

const gradSuffix = ".grad"

// owner returns the name of the parameter a tensor belongs to.
func owner(t Tensor) string {
	switch t.Kind {
	case OptimState:
		for _, s := range optimSuffixes {
			if strings.HasSuffix(t.Name, s) {
				return strings.TrimSuffix(t.Name, s)
			}
		}
	case Grad:
		return strings.TrimSuffix(t.Name, gradSuffix)
	}
	return t.Name
}

func parseDevice(key, v string) (tensor.Tier, error) {
	switch v {
	case "", DeviceNone:
		return tensor.TierGPU, nil
	case DeviceCPU:
		return tensor.TierCPU, nil
	case DeviceNVMe:
		return tensor.TierNVMe, nil
	}
	return 0, invalidf("%s %q: want none, cpu or nvme", key, v)
}

func validFloat(key string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return invalidf("%s %v: want a finite number >= 0", key, v)
	}
	return nil
}

func validate(t Tiers, inv []Tensor, h Hints) error {
	var errs []string
	add := func(err error) {
		if err != nil {
			errs = append(errs, strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
		}
	}
	if t.GPUBytes < 0 {
		add(invalidf("tiers GPUBytes %d: want >= 0", t.GPUBytes))
	}
	if t.CPUBytes < 0 {
		add(invalidf("tiers CPUBytes %d: want >= 0", t.CPUBytes))
	}
	add(validFloat("tiers NVMeReadBps", t.NVMeReadBps))
	add(validFloat("tiers NVMeWriteBps", t.NVMeWriteBps))
	add(validFloat("tiers PCIeBps", t.PCIeBps))
	if t.NVMePaths < 0 {
		add(invalidf("tiers NVMePaths %d: want >= 0", t.NVMePaths))
	}
	if g := t.PoolGranuleBytes; g < 0 || g > 1<<30 || g&(g-1) != 0 {
		add(invalidf("tiers PoolGranuleBytes %d: want 0 (the pool's default) or a power of two up to 1 GiB", g))
	}
	_, err := parseDevice("offload_param.device", h.ParamDevice)
	add(err)
	_, err = parseDevice("offload_optimizer.device", h.OptimizerDevice)
	add(err)
	if h.MaxInCPUBytes < 0 {
		add(invalidf("offload_param.max_in_cpu %d bytes: want >= 0", h.MaxInCPUBytes))
	}
	if h.ParamBufferCount < 0 || h.ParamBufferCount > math.MaxInt32 {
		add(invalidf("offload_param.buffer_count %d: want 0 (the policy decides) or a positive count", h.ParamBufferCount))
	}
	if h.ParamBufferBytes < 0 {
		add(invalidf("offload_param.buffer_size %d bytes: want 0 (the policy decides) or a positive size", h.ParamBufferBytes))
	}
	if h.OptimizerBufferCount < 0 || h.OptimizerBufferCount > math.MaxInt32 {
		add(invalidf("offload_optimizer.buffer_count %d: want 0 (the policy decides) or a positive count", h.OptimizerBufferCount))
	}
	if math.IsNaN(h.Ratio) || h.Ratio < 0 || h.Ratio > 1 {
		add(invalidf("offload_optimizer.ratio %v: want a fraction in (0, 1] (0 = 1)", h.Ratio))
	}
	if h.PrefetchDepth < 0 {
		add(invalidf("prefetch depth %d: want 0 (the policy decides) or a positive count", h.PrefetchDepth))
	}
	add(validFloat("compute seconds per layer", h.ComputeSecondsPerLayer))
	if h.Layers < 0 || h.Layers > MaxLayers {
		add(invalidf("layers %d: want 0..%d (0 = from the inventory)", h.Layers, MaxLayers))
	}
	if h.MicroBatches < 0 || h.MicroBatches > math.MaxInt32 {
		add(invalidf("gradient_accumulation_steps %d: want 0 (= 1) or a positive count", h.MicroBatches))
	}
	switch h.Schedule {
	case "", ScheduleAuto, ScheduleLayerMajor, ScheduleMicroBatchMajor:
	default:
		add(invalidf("zinf.schedule %q: want %s, %s or %s", h.Schedule, ScheduleAuto, ScheduleLayerMajor, ScheduleMicroBatchMajor))
	}
	if h.MaxInCPUBytes > MaxBytes || h.ParamBufferBytes > MaxBytes {
		add(invalidf("offload_param sizes max_in_cpu %d, buffer_size %d bytes: want at most %d", h.MaxInCPUBytes, h.ParamBufferBytes, MaxBytes))
	}
	var total int64
	seen := make(map[string]bool, len(inv))
	for i, x := range inv {
		switch {
		case x.Name == "":
			add(invalidf("tensor %d has no name", i))
		case seen[x.Name]:
			add(invalidf("tensor %q is listed twice", x.Name))
		case x.Bytes < 0 || x.Bytes > MaxBytes:
			add(invalidf("tensor %q: bytes %d: want 0..%d", x.Name, x.Bytes, MaxBytes))
		case x.Kind >= numKinds:
			add(invalidf("tensor %q: kind %d: want Param, Grad or OptimState", x.Name, x.Kind))
		case x.Layer < 0 || x.Layer >= MaxLayers:
			add(invalidf("tensor %q: layer %d: want 0..%d", x.Name, x.Layer, MaxLayers-1))
		case h.Layers > 0 && x.Layer >= h.Layers:
			add(invalidf("tensor %q: layer %d: the hints say %d layers", x.Name, x.Layer, h.Layers))
		}
		seen[x.Name] = true
		if x.Bytes > 0 && x.Bytes <= MaxBytes {
			total = min(total+x.Bytes, MaxBytes+1)
		}
	}
	if total > MaxBytes {
		add(invalidf("inventory holds more than %d bytes", MaxBytes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(errs, "; "))
	}
	return nil
}

// planner carries Plan's state between its steps.
type planner struct {
	t     Tiers
	h     Hints
	inv   []Tensor // sorted by Order, then Name
	tier  []tensor.Tier
	L     int
	notes []string
	// granule is the pinned pool's allocation granule (Tiers.PoolGranuleBytes).
	granule int
}

func (pl *planner) notef(format string, args ...any) {
	pl.notes = append(pl.notes, fmt.Sprintf(format, args...))
}

// Plan decides where each tensor of inv lives, how many pinned buffers the
// NVMe swaps get, how far ahead parameters are prefetched, and predicts the
// step time.
//
// Rules, in order:
//
//  1. Parameters go where Hints.ParamDevice says; optimizer states and
//     gradients where Hints.OptimizerDevice says, for the fraction Ratio of
//     the optimizer state bytes (whole parameters' groups, first used
//     first, until at least Ratio is offloaded); the rest stays on the GPU.
//  2. The GPU must hold its tensors plus the working set of offloaded
//     tensors in use (see Placement.GPUWorkingBytes); if not, Plan returns
//     a *CapacityError (errors.Is ErrNoFit). Nothing moves off the GPU
//     unless the hints say so.
//  3. Pinned host memory must hold the CPU-tier tensors plus the minimum
//     swap buffers: one layer's parameters (one buffer per NVMe parameter
//     of the largest layer, each the size of the largest NVMe parameter)
//     and one parameter's optimizer group. If not, a *CapacityError.
//  4. The prefetch depth is the hint, or the smallest depth whose exposed
//     I/O is as low as any depth gives (a simulation of Scheduler over the
//     NVMe and PCIe bandwidths and the compute time per layer). Parameter
//     buffers grow to hold it; the depth and the buffer counts shrink,
//     down to the minimum, to fit the pinned budget, with a note.
//  5. Optimizer buffers default to three groups (read ahead, update,
//     write behind), shrunk to fit.
//  6. What is left of the pinned budget caches parameters in front of NVMe,
//     up to Hints.MaxInCPUBytes, spread over the pass (see spreadCache).
func Plan(t Tiers, inv []Tensor, h Hints) (*Placement, error) {
	if err := validate(t, inv, h); err != nil {
		return nil, err
	}
	pl := &planner{t: t, h: h, granule: buffers.DefaultMinBufferBytes}
	if t.PoolGranuleBytes > 0 {
		pl.granule = int(t.PoolGranuleBytes)
	}
	pl.inv = append([]Tensor(nil), inv...)
	sort.SliceStable(pl.inv, func(i, j int) bool {
		if pl.inv[i].Order != pl.inv[j].Order {
			return pl.inv[i].Order < pl.inv[j].Order
		}
		return pl.inv[i].Name < pl.inv[j].Name
	})
	pl.L = h.Layers
	for _, x := range pl.inv {
		if x.Layer+1 > pl.L {
			pl.L = x.Layer + 1
		}
	}
	return pl.plan()
}

func (pl *planner) plan() (*Placement, error) {
	paramTier, _ := parseDevice("", pl.h.ParamDevice)
	optTier, _ := parseDevice("", pl.h.OptimizerDevice)
	ratio := pl.h.Ratio
	if ratio == 0 {
		ratio = 1
	}

	// Rule 1: homes.
	pl.tier = make([]tensor.Tier, len(pl.inv))
	offloadedGroup := pl.optimizerGroups(optTier, ratio)
	for i, x := range pl.inv {
		switch {
		case x.Kind == Param:
			pl.tier[i] = paramTier
		case offloadedGroup[owner(x)]:
			pl.tier[i] = optTier
		default:
			pl.tier[i] = tensor.TierGPU
		}
	}

	// Rule 2: the GPU.
	var gpuBytes [numKinds]int64
	offParam := make([]int64, pl.L)
	offGrad := make([]int64, pl.L)
	for i, x := range pl.inv {
		if pl.tier[i] == tensor.TierGPU {
			gpuBytes[x.Kind] += x.Bytes
			continue
		}
		switch x.Kind {
		case Param:
			offParam[x.Layer] += x.Bytes
		case Grad:
			offGrad[x.Layer] += x.Bytes
		}
	}
	working := 2*maxOf(offParam) + maxOf(offGrad)
	gpuNeed := gpuBytes[Param] + gpuBytes[Grad] + gpuBytes[OptimState] + working
	if gpuNeed > pl.t.GPUBytes {
		return nil, &CapacityError{
			Tier: tensor.TierGPU,
			What: fmt.Sprintf("parameters %s + gradients %s + optimizer states %s kept on GPU + working set %s",
				FormatBytes(gpuBytes[Param]), FormatBytes(gpuBytes[Grad]), FormatBytes(gpuBytes[OptimState]), FormatBytes(working)),
			NeedBytes: gpuNeed,
			HaveBytes: pl.t.GPUBytes,
			Hint:      gpuHint(pl.h, paramTier, optTier, ratio),
		}
	}

	// Rule 3: the minimum pinned memory.
	var cpuTensors int64
	for i, x := range pl.inv {
		if pl.tier[i] == tensor.TierCPU {
			cpuTensors += x.Bytes
		}
	}
	pb := pl.paramBuffers(true)
	ob := pl.optimizerBuffers()
	// Gradients written behind to NVMe hold a pinned copy each while their
	// write is in flight, and the next one accumulates meanwhile: two
	// buffers of the largest offloaded gradient.
	var gradBuf int64
	for i, x := range pl.inv {
		if x.Kind == Grad && pl.tier[i] == tensor.TierNVMe {
			gradBuf = max(gradBuf, x.Bytes)
		}
	}
	// zinf's pinned pool is a buddy allocator: buffers held at once are
	// only sure to be served when the budget holds their blocks (the
	// pool's rule, buffers.SpanBytes), so the minimum counts blocks.
	minPinned := cpuTensors + mulSat(int64(pb.perLayer), pl.blockOf(pb.bytes)) + mulSat(int64(ob.perGroup), pl.blockOf(ob.bytes)) + 2*pl.blockOf(gradBuf)
	if minPinned > pl.t.CPUBytes {
		return nil, &CapacityError{
			Tier: tensor.TierCPU,
			What: fmt.Sprintf("tensors kept in pinned memory %s + parameter buffers %d x %s (one layer) + optimizer buffers %d x %s (one parameter's group) + gradient write-behind buffers 2 x %s, each buffer counted as the pool's block for it (buffers.SpanBytes)",
				FormatBytes(cpuTensors), pb.perLayer, FormatBytes(pb.bytes), ob.perGroup, FormatBytes(ob.bytes), FormatBytes(gradBuf)),
			NeedBytes: minPinned,
			HaveBytes: pl.t.CPUBytes,
			Hint:      cpuHint(cpuTensors),
		}
	}

	// Rule 4: prefetch depth and parameter buffers.
	model := pl.model()
	depth := 0
	if paramTier != tensor.TierGPU && pl.L > 1 {
		maxDepth := pl.L - 1
		if paramTier == tensor.TierCPU {
			maxDepth = 1 // the GPU working set double-buffers
		}
		switch {
		case pl.h.PrefetchDepth > 0:
			depth = pl.h.PrefetchDepth
			if depth > maxDepth {
				pl.notef("prefetch depth %d capped at %d: %s", depth, maxDepth, depthCapWhy(paramTier, pl.L))
				depth = maxDepth
			}
		case paramTier == tensor.TierNVMe && pl.t.NVMeReadBps == 0:
			depth = min(DefaultPrefetchDepth, maxDepth)
			pl.notef("prefetch depth %d by default: the NVMe read bandwidth is unknown", depth)
		default:
			depth = model.autoDepth(maxDepth)
		}
	}
	paramCount := 0
	if pb.perLayer > 0 {
		want := (depth + 1) * pb.perLayer
		if pl.h.ParamBufferCount > 0 {
			want = int(pl.h.ParamBufferCount)
			if want < pb.perLayer {
				pl.notef("offload_param.buffer_count %d raised to %d: the largest layer has %d parameters on NVMe, one buffer each",
					want, pb.perLayer, pb.perLayer)
				want = pb.perLayer
			}
		}
		avail := pl.t.CPUBytes - cpuTensors - 2*pl.blockOf(gradBuf) - int64(ob.perGroup)*pl.blockOf(ob.bytes)
		fit := int(min(avail/pl.blockOf(pb.bytes), math.MaxInt32))
		paramCount = want
		if fit < want {
			paramCount = fit
			pl.notef("parameter buffers cut from %d to %d x %s to fit the %s pinned budget",
				want, paramCount, FormatBytes(pb.bytes), FormatBytes(pl.t.CPUBytes))
		}
		if d := paramCount/pb.perLayer - 1; d < depth {
			pl.notef("prefetch depth %d reduced to %d: %d parameter buffers hold %s",
				depth, d, paramCount, plural(paramCount/pb.perLayer, "layer"))
			depth = d
		}
	}

	// Rule 5: optimizer buffers.
	optCount := 0
	if ob.perGroup > 0 {
		want := 3 * ob.perGroup
		if pl.h.OptimizerBufferCount > 0 {
			want = pl.h.OptimizerBufferCount
			if want < ob.perGroup {
				pl.notef("offload_optimizer.buffer_count %d raised to %d: one parameter's group has %d tensors on NVMe, one buffer each",
					want, ob.perGroup, ob.perGroup)
				want = ob.perGroup
			}
		}
		avail := pl.t.CPUBytes - cpuTensors - 2*pl.blockOf(gradBuf) - int64(paramCount)*pl.blockOf(pb.bytes)
		fit := int(min(avail/pl.blockOf(ob.bytes), math.MaxInt32))
		optCount = want
		if fit < want {
			optCount = fit
			pl.notef("optimizer buffers cut from %d to %d x %s to fit the %s pinned budget",
				want, optCount, FormatBytes(ob.bytes), FormatBytes(pl.t.CPUBytes))
		}
	}

	// Rule 6: the CPU cache in front of NVMe.
	var cacheBytes int64
	if paramTier == tensor.TierNVMe && pl.h.MaxInCPUBytes > 0 {
		budget := pl.h.MaxInCPUBytes
		avail := pl.t.CPUBytes - cpuTensors - 2*pl.blockOf(gradBuf) - int64(paramCount)*pl.blockOf(pb.bytes) - int64(optCount)*pl.blockOf(ob.bytes)
		cut := avail < budget
		if cut {
			budget = avail
		}
		cacheBytes = pl.spreadCache(budget)
		if cut {
			pl.notef("max_in_cpu cache cut from %s to %s: %s of the %s pinned budget is left after the buffers",
				FormatBytes(pl.h.MaxInCPUBytes), FormatBytes(cacheBytes), FormatBytes(avail), FormatBytes(pl.t.CPUBytes))
		}
		// Fewer parameters left to swap: the buffers shrink to match.
		after := pl.paramBuffers(false)
		switch {
		case after.perLayer == 0:
			if paramCount > 0 {
				pl.notef("every parameter fits in the max_in_cpu cache: no parameter swaps")
			}
			paramCount, depth = 0, 0
			pb = after
		case pl.h.ParamBufferCount == 0:
			paramCount = (depth + 1) * after.perLayer
			pb = after
		default:
			pb.perLayer = after.perLayer
		}
		model = pl.model()
	}

	p := &Placement{
		Tier:                 make(map[string]tensor.Tier, len(pl.inv)),
		BytesPerTier:         map[tensor.Tier]int64{},
		PerKind:              map[Kind]map[tensor.Tier]Usage{},
		Offloaded:            map[Kind]float64{},
		ParamBufferCount:     paramCount,
		OptimizerBufferCount: optCount,
		ParamCacheBytes:      cacheBytes,
		GPUWorkingBytes:      working,
		PrefetchDepth:        depth,
		Tiers:                pl.t,
		Hints:                pl.h,
		Layers:               pl.L,
		inv:                  pl.inv,
		size:                 make(map[string]int64, len(pl.inv)),
	}
	if paramCount > 0 {
		p.ParamBufferBytes = pb.bytes
		p.PrefetchBudgetBytes = int64(paramCount-pb.perLayer) * pb.bytes
	}
	if optCount > 0 {
		p.OptimizerBufferBytes = ob.bytes
	}
	var kindTotal, kindOff [numKinds]int64
	for i, x := range pl.inv {
		tier := pl.tier[i]
		p.Tier[x.Name] = tier
		p.size[x.Name] = x.Bytes
		p.BytesPerTier[tier] += x.Bytes
		m := p.PerKind[x.Kind]
		if m == nil {
			m = map[tensor.Tier]Usage{}
			p.PerKind[x.Kind] = m
		}
		u := m[tier]
		u.Tensors++
		u.Bytes += x.Bytes
		m[tier] = u
		kindTotal[x.Kind] += x.Bytes
		if tier != tensor.TierGPU {
			kindOff[x.Kind] += x.Bytes
		}
	}
	for k := range p.PerKind {
		if kindTotal[k] > 0 {
			p.Offloaded[k] = float64(kindOff[k]) / float64(kindTotal[k])
		}
	}
	p.PinnedBytes = p.BytesPerTier[tensor.TierCPU] +
		int64(p.ParamBufferCount)*p.ParamBufferBytes + int64(p.OptimizerBufferCount)*p.OptimizerBufferBytes

	// Overlapping the optimizer step with backward (each layer's update
	// starts once its gradient is final) holds the optimizer's working set
	// while backward still holds its own: decide it only when both fit.
	var maxGrad, maxParam int64
	for i, x := range pl.inv {
		if pl.tier[i] == tensor.TierGPU {
			continue
		}
		switch x.Kind {
		case Grad:
			maxGrad = max(maxGrad, x.Bytes)
		case Param:
			maxParam = max(maxParam, x.Bytes)
		}
	}
	backward := p.BytesPerTier[tensor.TierCPU] + int64(p.ParamBufferCount)*pl.blockOf(p.ParamBufferBytes) + 2*pl.blockOf(gradBuf)
	stepping := int64(p.OptimizerBufferCount)*pl.blockOf(p.OptimizerBufferBytes) + 2*pl.blockOf(maxGrad) + pl.blockOf(maxParam)
	p.OverlapStepBytes = backward + stepping
	p.OverlapStep = optTier != tensor.TierGPU && p.OverlapStepBytes <= pl.t.CPUBytes
	if optTier != tensor.TierGPU && !p.OverlapStep {
		pl.notef("optimizer step runs after backward: overlapping it with backward needs %s of pinned memory, %s available",
			FormatBytes(p.OverlapStepBytes), FormatBytes(pl.t.CPUBytes))
	}

	if optTier != tensor.TierGPU && ratio < 1 {
		pl.notef("offload_optimizer.ratio %g: %.1f%% of optimizer state bytes on %s, the rest on GPU",
			ratio, 100*p.Offloaded[OptimState], optTier)
	}
	if optTier == tensor.TierGPU && pl.h.Ratio != 0 && pl.h.Ratio != 1 {
		pl.notef("offload_optimizer.ratio %g ignored: offload_optimizer.device is none", pl.h.Ratio)
	}
	if paramTier != tensor.TierNVMe && pl.h.MaxInCPUBytes > 0 {
		pl.notef("max_in_cpu ignored: it caches parameters in front of NVMe, and offload_param.device is %s", deviceWord(paramTier))
	}
	p.MicroBatches = model.micro
	model.overlap = p.OverlapStep
	p.PredictedLayerMajor = model.predictOrder(depth, true)
	p.PredictedMicroBatchMajor = model.predictOrder(depth, false)
	p.Schedule = pl.h.Schedule
	if p.Schedule == "" || p.Schedule == ScheduleAuto {
		p.Schedule = ScheduleMicroBatchMajor
		if model.micro > 1 && p.PredictedLayerMajor.Total < p.PredictedMicroBatchMajor.Total {
			p.Schedule = ScheduleLayerMajor
		}
	}
	p.Predicted = p.PredictedMicroBatchMajor
	if p.Schedule == ScheduleLayerMajor {
		p.Predicted = p.PredictedLayerMajor
	}
	pl.predictionNotes(p)
	p.Notes = pl.notes
	return p, nil
}

func deviceWord(t tensor.Tier) string {
	if t == tensor.TierGPU {
		return DeviceNone
	}
	return t.String()
}

func depthCapWhy(paramTier tensor.Tier, layers int) string {
	if paramTier == tensor.TierCPU {
		return "parameters in pinned memory are copied to the GPU one layer ahead (double buffering)"
	}
	return fmt.Sprintf("the model has %d layers", layers)
}

func cpuHint(cpuTensors int64) string {
	if cpuTensors > 0 {
		return `raise zinf.tiers.cpu_pinned_bytes, or set the offload devices now "cpu" to "nvme"`
	}
	return "raise zinf.tiers.cpu_pinned_bytes"
}

func gpuHint(h Hints, paramTier, optTier tensor.Tier, ratio float64) string {
	var s []string
	if paramTier == tensor.TierGPU {
		s = append(s, `set offload_param.device to "cpu" or "nvme"`)
	}
	if optTier == tensor.TierGPU {
		s = append(s, `set offload_optimizer.device to "cpu" or "nvme"`)
	} else if ratio < 1 {
		s = append(s, "raise offload_optimizer.ratio")
	}
	if len(s) == 0 {
		return "raise zinf.tiers.gpu_bytes"
	}
	return strings.Join(s, ", ")
}

// optimizerGroups returns the owners whose optimizer states and gradients
// are offloaded: all of them at ratio 1, else whole groups in order of
// first use until at least ratio of the optimizer state bytes are.
func (pl *planner) optimizerGroups(optTier tensor.Tier, ratio float64) map[string]bool {
	out := map[string]bool{}
	if optTier == tensor.TierGPU {
		return out
	}
	type group struct {
		name  string
		bytes int64
	}
	var groups []*group
	byName := map[string]*group{}
	var total int64
	for _, x := range pl.inv { // in order of use
		if x.Kind == Param {
			continue
		}
		o := owner(x)
		g := byName[o]
		if g == nil {
			g = &group{name: o}
			byName[o] = g
			groups = append(groups, g)
		}
		if x.Kind == OptimState {
			g.bytes += x.Bytes
			total += x.Bytes
		}
	}
	target := ratio * float64(total)
	var off int64
	for _, g := range groups {
		if ratio < 1 && float64(off) >= target {
			break
		}
		out[g.name] = true
		off += g.bytes
	}
	return out
}

type paramBufs struct {
	perLayer int   // NVMe parameters in the layer with the most
	bytes    int64 // one buffer
}

// paramBuffers sizes the parameter swap buffers over the parameters now on
// NVMe. With hint, an explicit buffer_size smaller than a parameter is
// raised, with a note.
func (pl *planner) paramBuffers(hint bool) paramBufs {
	count := make([]int, pl.L)
	var b paramBufs
	for i, x := range pl.inv {
		if x.Kind != Param || pl.tier[i] != tensor.TierNVMe {
			continue
		}
		count[x.Layer]++
		b.perLayer = max(b.perLayer, count[x.Layer])
		b.bytes = max(b.bytes, x.Bytes)
	}
	if b.perLayer == 0 {
		return paramBufs{}
	}
	if hb := pl.h.ParamBufferBytes; hb > 0 {
		if hb < b.bytes {
			if hint {
				pl.notef("offload_param.buffer_size %s raised to %s: the largest parameter on NVMe",
					FormatBytes(hb), FormatBytes(b.bytes))
			}
		} else {
			b.bytes = hb
		}
	}
	b.bytes = max(b.bytes, 1)
	return b
}

type optBufs struct {
	perGroup int   // NVMe tensors in the largest optimizer group
	bytes    int64 // one buffer
}

func (pl *planner) optimizerBuffers() optBufs {
	count := map[string]int{}
	var b optBufs
	for i, x := range pl.inv {
		if x.Kind == Param || pl.tier[i] != tensor.TierNVMe {
			continue
		}
		o := owner(x)
		count[o]++
		b.perGroup = max(b.perGroup, count[o])
		b.bytes = max(b.bytes, x.Bytes)
	}
	// The optimizer streams states one sub-group at a time, so a buffer
	// holds at most a sub-group of fp32 elements.
	if sg := pl.h.SubGroupElems; sg > 0 {
		b.bytes = min(b.bytes, sg*4)
	}
	if b.perGroup > 0 {
		b.bytes = max(b.bytes, 1)
	}
	return b
}

func maxOf(xs []int64) int64 {
	var m int64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func rate(bytes int64, bps float64) float64 {
	if bytes == 0 || bps <= 0 {
		return 0
	}
	return float64(bytes) / bps
}

// model gathers the per-layer I/O times of the current homes.
func (pl *planner) model() *stepModel {
	m := &stepModel{
		layers:    pl.L,
		micro:     max(pl.h.MicroBatches, 1),
		compute:   pl.h.ComputeSecondsPerLayer,
		fetch:     make([]float64, pl.L),
		gradWrite: make([]float64, pl.L),
		gradRead:  make([]float64, pl.L),
		handOff:   make([]float64, pl.L),
		gradBufs:  max(pl.h.GradWriteBehinds, 1),
	}
	nvmeParam := make([]int64, pl.L)
	hostParam := make([]int64, pl.L)
	nvmeGrad := make([]int64, pl.L)
	hostGrad := make([]int64, pl.L)
	ownerTier := map[string]tensor.Tier{}
	kept := make(map[string]bool, len(pl.h.KeptGrads))
	for _, n := range pl.h.KeptGrads {
		kept[n] = true
	}
	var optRead, optWrite, crossing, stateBytes int64
	// Per layer: the optimizer's NVMe reads and writes, parameters
	// crossing PCIe, optimizer state bytes (its arithmetic's share).
	lRead, lWrite, lCross, lState := make([]int64, pl.L), make([]int64, pl.L), make([]int64, pl.L), make([]int64, pl.L)
	for i, x := range pl.inv {
		tier := pl.tier[i]
		switch x.Kind {
		case Param:
			if tier != tensor.TierGPU {
				hostParam[x.Layer] += x.Bytes
			}
			if tier == tensor.TierNVMe {
				nvmeParam[x.Layer] += x.Bytes
				optWrite += x.Bytes // the updated parameter is written back
				lWrite[x.Layer] += x.Bytes
			}
		case Grad:
			if tier != tensor.TierGPU {
				hostGrad[x.Layer] += x.Bytes
			}
			// A gradient kept in pinned memory (Hints.KeptGrads) is
			// neither written behind nor read back: only its hand-off
			// and PCIe crossing remain.
			if tier == tensor.TierNVMe && !kept[owner(x)] {
				nvmeGrad[x.Layer] += x.Bytes
				optRead += x.Bytes
				lRead[x.Layer] += x.Bytes
			}
		case OptimState:
			ownerTier[owner(x)] = tier
			stateBytes += x.Bytes
			lState[x.Layer] += x.Bytes
			if tier == tensor.TierNVMe {
				optRead += x.Bytes
				optWrite += x.Bytes
				lRead[x.Layer] += x.Bytes
				lWrite[x.Layer] += x.Bytes
			}
		}
	}
	// An updated parameter crosses PCIe when it and its optimizer state
	// are on different sides of it.
	for i, x := range pl.inv {
		if x.Kind != Param {
			continue
		}
		ot, ok := ownerTier[x.Name]
		if ok && (ot == tensor.TierGPU) != (pl.tier[i] == tensor.TierGPU) {
			crossing += x.Bytes
			lCross[x.Layer] += x.Bytes
		}
	}
	m.nvmeRead, m.nvmeWrite = optRead, optWrite
	c := pl.h.Costs
	for l := 0; l < pl.L; l++ {
		m.paramRead += nvmeParam[l]
		m.gradBytes += nvmeGrad[l]
		// Checksums: a fetch is verified, a write summed, a read-back
		// verified, each on the path of its waiter; the loop's transfers
		// count them with the disk's time (measured: apart from it, the
		// prediction of make bench-schedule's layer-major step at four
		// micro-batches ran 20% short).
		m.fetch[l] = rate(nvmeParam[l], pl.t.NVMeReadBps) + rate(hostParam[l], pl.t.PCIeBps) + rate(nvmeParam[l], c.ChecksumBytesPerSec)
		m.gradWrite[l] = rate(nvmeGrad[l], pl.t.NVMeWriteBps) + rate(hostGrad[l], pl.t.PCIeBps) + rate(nvmeGrad[l], c.ChecksumBytesPerSec)
		m.gradRead[l] = rate(nvmeGrad[l], pl.t.NVMeReadBps) + rate(nvmeGrad[l], c.ChecksumBytesPerSec)
		m.handOff[l] = rate(hostGrad[l], c.HandOffBytesPerSec)
	}
	arith := c.OptimizerComputeSeconds
	if !(arith > 0) || math.IsInf(arith, 1) {
		arith = 0
	}
	m.optimizerS = rate(optRead, pl.t.NVMeReadBps) + rate(optWrite, pl.t.NVMeWriteBps) + rate(crossing, pl.t.PCIeBps) +
		rate(optRead+optWrite, c.ChecksumBytesPerSec) + arith
	m.opt = optJobs{read: make([]float64, pl.L), arith: make([]float64, pl.L), write: make([]float64, pl.L),
		readCRC: make([]float64, pl.L), writeCRC: make([]float64, pl.L)}
	for l := 0; l < pl.L; l++ {
		m.opt.read[l] = rate(lRead[l], pl.t.NVMeReadBps)
		m.opt.readCRC[l] = rate(lRead[l], c.ChecksumBytesPerSec)
		m.opt.write[l] = rate(lWrite[l], pl.t.NVMeWriteBps) + rate(lCross[l], pl.t.PCIeBps)
		m.opt.writeCRC[l] = rate(lWrite[l], c.ChecksumBytesPerSec)
		if stateBytes > 0 {
			m.opt.arith[l] = arith * float64(lState[l]) / float64(stateBytes)
		}
	}
	return m
}

func (pl *planner) predictionNotes(p *Placement) {
	anyNVMe := p.BytesPerTier[tensor.TierNVMe] > 0
	if anyNVMe && pl.t.NVMeReadBps == 0 {
		pl.notef("NVMe read bandwidth unknown: NVMe read time not predicted")
	}
	if anyNVMe && pl.t.NVMeWriteBps == 0 {
		pl.notef("NVMe write bandwidth unknown: NVMe write time not predicted")
	}
	if pl.h.ComputeSecondsPerLayer == 0 && pl.L > 0 {
		pl.notef("compute time per layer not given: the prediction counts I/O only and nothing is hidden")
		return
	}
	pr := p.Predicted
	if pr.ParamIO > 0 && pr.ExposedParamIO*10 > pr.ParamIO*3 {
		pl.notef("parameter I/O mostly exposed (%s of %s): reading a layer takes longer than computing it; more NVMe bandwidth (paths) or max_in_cpu would help",
			FormatDuration(pr.ExposedParamIO), FormatDuration(pr.ParamIO))
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// mulSat returns a*b for a, b >= 0, or MaxBytes+1 when that is larger: a
// hinted buffer size times a count must not wrap around.
func mulSat(a, b int64) int64 {
	if a != 0 && b > (MaxBytes+1)/a {
		return MaxBytes + 1
	}
	return min(a*b, MaxBytes+1)
}

// blockOf is the pinned pool's own block rule (buffers.SpanBytes, with the
// pool's granule): the free block a buffer of n bytes needs. Budgets for
// buffers held at the same time count these, as the runtime's reservations
// do, so the plan and the pool agree.
func (pl *planner) blockOf(n int64) int64 {
	return buffers.SpanBytes(min(n, MaxBytes+1), pl.granule)
}

// Adjusted returns a copy of p for a runtime that does not run the plan as
// planned: it prefetches depth layers ahead (0 or less: none; capped at
// the layers there are) and overlaps the optimizer step with backward
// only when overlap is true and p allowed it. PrefetchDepth, OverlapStep
// and Predicted say what the runtime will do, and a note (why, when the
// figures change: depthWhy, overlapWhy) says why they differ from the
// plan. p is not changed; p itself is returned when nothing differs.
// WithCosts returns a copy of p whose predictions (Predicted,
// PredictedLayerMajor, PredictedMicroBatchMajor) add the CPU costs c on
// the I/O path: checksums per NVMe byte, the gradient hand-offs' copies
// and additions, the optimizer's arithmetic (see Costs). Nothing else
// changes: not the homes, the buffers, the depth or the schedule. p is
// not changed.
func (p *Placement) WithCosts(c Costs) *Placement {
	q := *p
	q.Hints.Costs = c
	q.repredict()
	return &q
}

// WithGradWriteBehinds returns a copy of p whose predictions count n
// gradient write-behinds in flight at once (Hints.GradWriteBehinds: the
// runtime's gradient reservation, plan.Reservations.GradInFlight); p
// itself when that is what p counts. Nothing else changes.
func (p *Placement) WithGradWriteBehinds(n int) *Placement {
	if max(n, 1) == max(p.Hints.GradWriteBehinds, 1) {
		return p
	}
	q := *p
	q.Hints.GradWriteBehinds = n
	q.repredict()
	return &q
}

// WithKeptGrads returns a copy of p whose predictions count the
// gradients of the parameters named in keep as kept in pinned memory
// (Hints.KeptGrads: the runtime's reservations, plan.Reservations.GradKept):
// no NVMe write-behind, no read-back by a later micro-batch nor by the
// update. p itself when it already counts exactly those. Nothing else
// changes: homes, depth and the bytes per tier stay as planned.
func (p *Placement) WithKeptGrads(keep []string) *Placement {
	if slices.Equal(keep, p.Hints.KeptGrads) || (len(keep) == 0 && len(p.Hints.KeptGrads) == 0) {
		return p
	}
	q := *p
	q.Hints.KeptGrads = append([]string(nil), keep...)
	q.repredict()
	return &q
}

func (p *Placement) Adjusted(depth int, depthWhy string, overlap bool, overlapWhy string) *Placement {
	depth = max(depth, 0)
	if p.Layers > 0 {
		depth = min(depth, p.Layers-1)
	}
	overlap = overlap && p.OverlapStep
	if depth == p.PrefetchDepth && overlap == p.OverlapStep {
		return p
	}
	q := *p
	q.Notes = append([]string(nil), p.Notes...)
	if depth != p.PrefetchDepth {
		q.PrefetchDepth = depth
		q.Notes = append(q.Notes, fmt.Sprintf("prefetch depth %d, not the planned %d: %s", depth, p.PrefetchDepth, depthWhy))
	}
	if overlap != p.OverlapStep {
		q.OverlapStep = false
		q.Notes = append(q.Notes, fmt.Sprintf("optimizer step runs after backward, not overlapped: %s", overlapWhy))
	}
	q.repredict()
	return &q
}

// repredict predicts p's step again from its inputs, its prefetch depth
// and whether its optimizer step overlaps the backward pass.
func (p *Placement) repredict() {
	m := p.stepModel()
	m.overlap = p.OverlapStep
	p.PredictedLayerMajor, p.PredictedMicroBatchMajor = m.predictOrder(p.PrefetchDepth, true), m.predictOrder(p.PrefetchDepth, false)
	p.Predicted = p.PredictedMicroBatchMajor
	if p.Schedule == ScheduleLayerMajor {
		p.Predicted = p.PredictedLayerMajor
	}
}

// stepModel is the per-layer model of p's step, from its inputs and homes.
func (p *Placement) stepModel() *stepModel {
	pl := &planner{t: p.Tiers, h: p.Hints, inv: p.inv, L: p.Layers, tier: make([]tensor.Tier, len(p.inv))}
	for i, x := range p.inv {
		pl.tier[i] = p.Tier[x.Name]
	}
	return pl.model()
}

// spreadCache homes on the CPU tier (the max_in_cpu cache) NVMe
// parameters of at most budget bytes, spread over the pass (SpreadCache),
// and returns the bytes cached.
func (pl *planner) spreadCache(budget int64) int64 {
	var idx []int
	var sizes []int64
	for i, x := range pl.inv {
		if x.Kind == Param && pl.tier[i] == tensor.TierNVMe {
			idx = append(idx, i)
			sizes = append(sizes, x.Bytes)
		}
	}
	var taken int64
	for j, keep := range SpreadCache(sizes, budget) {
		if keep {
			taken += sizes[j]
			pl.tier[idx[j]] = tensor.TierCPU
		}
	}
	return taken
}

// SpreadCache chooses, of tensors of the given sizes in the order a pass
// uses them, the ones a cache of budget bytes keeps for good: spread
// evenly over the pass. Walking the tensors in order, one is kept while
// the bytes kept stay at the budget's share of the bytes walked (to the
// nearest half tensor) and within the budget. In a pass that uses every
// tensor once (a decoding step), each layer's reads then shrink by about
// that share and overlap the compute of the layers around them; keeping
// the first-used tensors instead would leave whole layers with nothing to
// read while the disk idles under their compute, and the rest to read at
// full size. A size <= 0 is never kept.
func SpreadCache(sizes []int64, budget int64) []bool {
	keep := make([]bool, len(sizes))
	var total int64
	for _, b := range sizes {
		total += max(b, 0)
	}
	if total == 0 || budget <= 0 {
		return keep
	}
	share := min(float64(budget)/float64(total), 1)
	var walked, taken int64
	for i, b := range sizes {
		if b <= 0 {
			continue
		}
		walked += b
		if taken+b > budget || float64(taken)+float64(b)/2 > share*float64(walked) {
			continue
		}
		taken += b
		keep[i] = true
	}
	return keep
}
