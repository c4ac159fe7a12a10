package plan

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// Plan is what zinf.Open decides for a model under a config, for one
// rank (zinf.ModelPlan): where each tensor lives and the predicted step
// (Placement), how the pinned pool is split and its minimum
// (Reservations), the NVMe bandwidth the prediction uses and where it
// comes from (Bandwidth), the free disk each NVMe path needs (Disk), and
// the options of every component zinf.Open builds from it (Components).
// zinf.PlanModel computes it without opening anything; an open zinf.Runtime
// has the same figures (Plan, Reservations, Bandwidth, DiskNeeds).
//
// Sizes that depend on the device (padding, aligned reads) are counted for
// the stores' geometry (Measured.Stores: GeometryOf, an alignment of
// swapper.DefaultDiskAlignment, 4 KiB), so the minimum pool zinf.PlanModel
// reports is the one zinf.Open enforces; Open refuses a device whose
// alignment is larger.
type Plan struct {
	Rank, World  int
	Placement    *policy.Placement
	Reservations Reservations
	Bandwidth    Bandwidth
	// Disk is the free space the swap stores need on each NVMe path, in
	// the config's order (a path that several stores share once, with
	// their needs added): every NVMe tensor with the copies copy-on-write
	// keeps during a step (swapper.CopyOnWriteVersions), padded and
	// striped as the stores do, plus each store's own files. Paths on one
	// filesystem need their sum there. An asynchronous checkpoint holds
	// up to one more copy of what it saves until it is written.
	Disk []swapper.SpaceNeed
	// Preallocate says that Open reserves Disk in the swap files
	// (zinf.preallocate, a training runtime: see Preallocate).
	Preallocate bool
	// Components are the options zinf.Open builds each component from.
	Components Components
}

// DiskBytes is Disk added up.
func (p *Plan) DiskBytes() int64 {
	var n int64
	for _, d := range p.Disk {
		n += d.Bytes
	}
	return n
}

// WriteText renders the plan for people, as `zinf plan` prints it: the
// placement table, each NVMe path's bandwidth with its source, the disk
// each path needs, and the pinned reservations with the minimum pool.
func (p *Plan) WriteText(w io.Writer) error {
	if err := p.Placement.WriteTable(w); err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	if len(p.Bandwidth.Paths) > 0 {
		fmt.Fprintf(bw, "\nnvme bandwidth per path (paths add up: read %s/s, write %s/s):\n%s",
			units.FormatBytes(int64(p.Bandwidth.ReadBps())), units.FormatBytes(int64(p.Bandwidth.WriteBps())), p.Bandwidth)
	}
	if len(p.Disk) > 0 {
		checks := "Open checks it"
		if p.Preallocate {
			checks = "Open checks it and reserves it, zinf.preallocate"
		}
		fmt.Fprintf(bw, "\nnvme disk: free space each path needs (swap files with their copy-on-write copies; %s):\n", checks)
		for _, d := range p.Disk {
			fmt.Fprintf(bw, "  %s: %s (%d bytes)\n", d.Path, units.FormatBytes(d.Bytes), d.Bytes)
		}
	}
	fmt.Fprintf(bw, "\npinned memory by reservation (rank %d of %d):\n%s", p.Rank, p.World, p.Reservations)
	return bw.Flush()
}

// Inputs are a plan's inputs, checked: the config, the model's index, the
// rank and the world size, and the config in each component's words.
type Inputs struct {
	Config      *config.Config
	Model       *Index
	Rank, World int
	Settings    Settings
}

// Given is what zinf.Open and zinf.PlanModel are given beside the config
// and the model that a plan depends on: the rank and world size when
// WorldSize > 0 (else the config's), and the piece size.
type Given struct {
	Rank, WorldSize int
	// PieceBytes is zinf.Options.PieceBytes (0: zinf.piece_bytes, else
	// DefaultPieceBytes; -1: whole): it caps the optimizer's sub-group,
	// which sets the checksum unit of the gradient and optimizer stores.
	PieceBytes int64
}

// Check validates what zinf.Open and zinf.PlanModel are given: the config
// (every problem reported), the model, and the rank and world size; then
// it reads the config in each component's words (SettingsOf).
func Check(cfg *config.Config, m Model, g Given) (*Inputs, error) {
	if cfg == nil {
		return nil, errors.New("zinf: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, world := cfg.RankWorld()
	mi, err := m.Check()
	if err != nil {
		return nil, err
	}
	if g.WorldSize > 0 {
		r, world = g.Rank, g.WorldSize
	}
	if r < 0 || r >= world {
		return nil, fmt.Errorf("zinf: rank %d is outside world size %d", r, world)
	}
	s := SettingsOf(cfg)
	if s.ParamStore.Paths != nil {
		s.ParamStore.ChecksumBytes = ParamChecksumBytes
	}
	if s.OptimStore.Paths != nil {
		pieceBytes := g.PieceBytes
		if pieceBytes == 0 {
			pieceBytes = int64(cfg.Zinf.PieceBytes)
		}
		s.OptimStore.ChecksumBytes = SubGroupChecksumBytes(cfg.ZeroOptimization.SubGroupSize, pieceBytes)
	}
	return &Inputs{Config: cfg, Model: mi, Rank: r, World: world, Settings: s}, nil
}

// SubGroupChecksumBytes is the bytes one checksum covers in the gradient
// and optimizer swap stores (swapper.StoreOptions.ChecksumBytes; the
// store rounds it to its alignment and to a divisor of its stripe): the
// largest power of two that divides a sub-group's gradient bytes (4 an
// element), for sub_group_size subGroupElems (0: the optimizer's default)
// capped at a piece of gradient as the plan caps it (pieceBytes: 0 is
// DefaultPieceBytes, < 0 no pieces). The optimizer reads a gradient one
// sub-group at a time, and a read with checksums covers whole checksum
// units: with one checksum per 1 MiB stripe, sub-groups of 65536 elements
// (256 KiB) were each read as 1 MiB, four times their bytes (bench-llm-big:
// the disk read 1.5x the step's logical bytes). A unit that divides the
// sub-group makes every such read exact.
func SubGroupChecksumBytes(subGroupElems, pieceBytes int64) int64 {
	sg := subGroupElems
	if sg <= 0 {
		sg = optimizer.DefaultSubGroupSize
	}
	if pieceBytes == 0 {
		pieceBytes = DefaultPieceBytes
	}
	if pieceBytes > 0 {
		sg = min(sg, max(pieceBytes/4, 1))
	}
	b := 4 * sg
	return b & -b
}

// Measured is what a plan takes from the machine and the config beside
// the checked Inputs: the NVMe bandwidth (measured, configured or
// cached) and the swap stores' geometry (GeometryOf: a value computed
// from the settings, with no store opened). Make reads nothing else.
type Measured struct {
	Bandwidth Bandwidth
	Stores    Geometry
}

// Options are the caller's choices that a plan depends on (zinf.Options).
type Options struct {
	ComputePerLayer time.Duration // per layer and pass
	Inference       bool
	InPlace         bool  // zinf.Options.InPlace: no disk for the parameters
	Gather          bool  // GatherLayers with a Comm
	PieceBytes      int64 // zinf.Options.PieceBytes as given
}

// Components are the options zinf.Open builds each component from, beside
// the Settings: the tier of each tensor, the optimizer's options (the
// sub-group capped at a piece), how big tensors move, the pinned pool's.
type Components struct {
	Settings
	Tiers     map[string]tensor.Tier
	Optimizer optimizer.Options
	Pieces    Pieces
	Pool      buffers.Options // the pinned pool (Logger aside)
	// Stores is the swap stores' geometry the plan sized with: zinf.Open
	// opens them from its options and refuses a device whose alignment
	// is larger.
	Stores Geometry
	// NVMeLayers are each layer's NVMe tensors, in the order of use: what
	// the scheduler prefetches.
	NVMeLayers [][]string
}

// Make plans placement and prefetch, sizes the pinned reservations and the
// disk each NVMe path needs, and derives every component's options: a pure
// function of its inputs, with no I/O. zinf.Open and zinf.PlanModel share
// it, so they agree.
func Make(in *Inputs, m Measured, o Options) (*Plan, error) {
	cfg, mi, s := in.Config, in.Model, &in.Settings
	placement, err := placementOf(cfg, mi, in.World, o.ComputePerLayer, m.Bandwidth)
	if err != nil {
		return nil, err
	}
	tiers := make(map[string]tensor.Tier, len(mi.Descs))
	for _, d := range mi.Descs {
		t, ok := placement.Tier[d.Name]
		if !ok || (t == tensor.TierNVMe && m.Stores.Param == nil) {
			t = tensor.TierCPU
		}
		tiers[d.Name] = t
	}
	optOpts := s.Optimizer
	// Pinned memory and disk are sized for a device alignment of at least
	// 4 KiB (StoreGeometry.AlignmentBytes), so that a plan gives the figures
	// zinf.Open enforces on any device up to it.
	ps, gs, os, err := m.Stores.sizing()
	if err != nil {
		return nil, fmt.Errorf("zinf: swap store geometry: %w", err)
	}
	var bounce int64
	if mode, _ := gds.ParseMode(s.GDSMode); mode != gds.ModeOff {
		bo := s.Bounce
		bounce = 2 * int64(bo.Parallelism) * buffers.SpanBytes(bo.BlockSizeBytes, int(GranuleBytes(ps, gs, os)))
	}
	dtype := s.DType
	pieceBytes := o.PieceBytes // zinf.Options.PieceBytes, else zinf.piece_bytes
	if pieceBytes == 0 {
		pieceBytes = int64(cfg.Zinf.PieceBytes)
	}
	pcs := planPieces(pieceBytes, bounce > 0, ps, gs, &optOpts)
	if sg := cfg.ZeroOptimization.SubGroupSize; pieceBytes == 0 && sg < optimizer.DefaultSubGroupSize && sg > int64(optOpts.SubGroupSize) {
		// A sub_group_size the user chose, lowered by the default piece:
		// say so (bench-scale's one weight per sub-group, 4M elements, ran
		// 1.34x slower capped at 1M: four times the sub-groups, a quarter
		// of the optimizer's pipeline).
		placement.Notes = append(placement.Notes, fmt.Sprintf("zero_optimization.sub_group_size %d is capped at %d elements, a piece of gradient (zinf.piece_bytes, default %s): set zinf.piece_bytes to %s or more to keep it (the pool's minimum grows with it)",
			sg, optOpts.SubGroupSize, config.Size(DefaultPieceBytes), config.Size(4*sg)))
	}
	if cfg.Zinf.OverlapUpdate && !o.Inference {
		placement.Notes = append(placement.Notes, "zinf.overlap_update: Step returns before the update commits, which runs on under the next forward; the predicted step does not model that overlap (it predicts a Step that waits for the update)")
	}
	rin := reservationInput{cfg: cfg, mi: mi, rank: in.Rank, world: in.World, dtype: dtype, tiers: tiers,
		paramStore: ps, gradStore: gs, optimStore: os, prefetch: placement.PrefetchDepth,
		bounceBytes: bounce, optOpts: optOpts, inference: o.Inference, gather: o.Gather,
		layerMajor: placement.Schedule == policy.ScheduleLayerMajor, micro: placement.MicroBatches, pieces: pcs}
	if cfg.GradientAccumulationAuto {
		// A loop may take more micro-batches than the plan's once it
		// has measured its compute: layer-major then holds a layer's
		// gradients.
		rin.micro = max(rin.micro, AutoMicroBatchesUnmeasured)
	}
	rin.autoDepth = cfg.Zinf.PipelineDepthAuto && !o.Inference
	res := reserve(rin)
	if rin.layerMajor && (cfg.Zinf.Schedule == config.ScheduleAuto || cfg.Zinf.Schedule == "") {
		// Auto works down to micro-batch-major's minimum, which needs
		// less pinned memory: below layer-major's it takes that order.
		rin.layerMajor = false
		mb := reserve(rin)
		lmPool := res.MinPoolBytes
		if res.MinPoolBytes > res.PoolBytes {
			if mb.MinPoolBytes <= mb.PoolBytes {
				placement.Notes = append(placement.Notes, fmt.Sprintf("schedule micro-batch-major, though layer-major is predicted faster (%s vs %s): layer-major holds a layer's gradients in pinned memory and needs a pool of %s, this config has %s",
					policy.FormatDuration(placement.PredictedLayerMajor.Total), policy.FormatDuration(placement.PredictedMicroBatchMajor.Total),
					config.Size(lmPool), config.Size(res.PoolBytes)))
			}
			placement.Schedule, placement.Predicted = policy.ScheduleMicroBatchMajor, placement.PredictedMicroBatchMajor
			res = mb
		} else {
			res.MinPoolBytes = min(res.MinPoolBytes, mb.MinPoolBytes)
		}
		res.LayerMajorPoolBytes = lmPool
	}
	if note := autoPipelineNote(res, optOpts, AutoPipelineBytes(cfg)); note != "" {
		placement.Notes = append(placement.Notes, note)
	}
	if res.OptimizerDepth > 0 {
		optOpts.PipelineDepth, optOpts.BufferCount = res.OptimizerDepth, res.OptimizerBufferCount
	}
	// The prediction counts the write-behinds the gradient reservation
	// holds (more than one when the pool has room), and no NVMe round
	// trip for the gradients it keeps in pinned memory (zinf.pinned_grads).
	placement = placement.WithGradWriteBehinds(res.GradInFlight).WithKeptGrads(res.GradKept)
	p := &Plan{Rank: in.Rank, World: in.World, Placement: placement, Reservations: res, Bandwidth: m.Bandwidth}
	dps := ps
	if o.InPlace {
		dps = nil // read where the caller's file holds them
	}
	p.Disk = DiskNeeds(mi, in.Rank, in.World, dtype, tiers, optOpts, pcs.GradElems, o.Inference, dps, gs, os)
	p.Preallocate = cfg.Zinf.Preallocate && !o.Inference
	placement.NVMeDiskBytes = p.DiskBytes()
	// The policy placed tensors without a pinned budget (the reservations
	// judge pinned memory); its table shows the pool the config gives.
	placement.Tiers.CPUBytes = res.PoolBytes
	placement.PinnedRows = res.rows()
	var resv [buffers.NumPurposes]int64
	resv[buffers.PurposeParams] = res.ParamsBytes()
	resv[buffers.PurposeGradients] = res.GradBytes
	resv[buffers.PurposeOptimizer] = res.OptimizerBytes
	resv[buffers.PurposeCollectives] = res.GatherBytes
	nvmeLayers := make([][]string, len(mi.Layers))
	for l, names := range mi.Layers {
		for _, n := range names {
			if tiers[n] == tensor.TierNVMe {
				nvmeLayers[l] = append(nvmeLayers[l], n)
			}
		}
	}
	p.Components = Components{Settings: *s, Tiers: tiers, Optimizer: optOpts, Pieces: pcs, NVMeLayers: nvmeLayers, Stores: m.Stores,
		Pool: buffers.Options{CapacityBytes: res.PoolBytes, MinBufferBytes: int(res.GranuleBytes), Reservations: resv,
			StallTimeout: s.PinnedStall}}
	return p, nil
}

// DiskNeeds is the free space each store needs on each of its paths to
// hold this rank's NVMe tensors with their copy-on-write copies (see
// swapper.Store.SpaceNeeds), merged by path in the config's order.
func DiskNeeds(mi *Index, rank, world int, dtype tensor.DType, tiers map[string]tensor.Tier,
	oo optimizer.Options, gradPiece int, inference bool, param, grad, optim *swapper.Store) []swapper.SpaceNeed {
	var out []swapper.SpaceNeed
	index := map[string]int{}
	for _, k := range storeKeysOf(mi, rank, world, dtype, tiers, oo, gradPiece, inference, param, grad, optim) {
		for _, n := range k.Store.SpaceNeeds(k.Sizes, k.Versions) {
			if i, ok := index[n.Path]; ok {
				out[i].Bytes += n.Bytes
				continue
			}
			index[n.Path] = len(out)
			out = append(out, n)
		}
	}
	return out
}

// StoreKeys are the logical sizes of the keys one swap store holds at
// once for a rank, and how many versions of each: what DiskNeeds counts,
// and what zinf.Open reserves in the store's swap files with
// zinf.preallocate (swapper.Store.Preallocate), so that the first step's
// staged copies overwrite reserved space instead of growing the files and
// no step runs out of disk on them.
type StoreKeys struct {
	What     string // "parameter", "gradient" or "optimizer"
	Store    *swapper.Store
	Sizes    []int64
	Versions int
}

// KeysOf lists, for each store given (nil ones left out), the keys it
// holds for this rank (see StoreKeys). An inference runtime writes each
// parameter once (one version), or none when they are read in place.
func KeysOf(mi *Index, rank, world int, dtype tensor.DType, tiers map[string]tensor.Tier,
	oo optimizer.Options, gradPiece int, inference bool, param, grad, optim *swapper.Store) []StoreKeys {
	return storeKeysOf(mi, rank, world, dtype, tiers, oo, gradPiece, inference, param, grad, optim)
}

// storeKeysOf lists, for each open store (nil ones left out), the keys it
// holds for this rank: one per NVMe parameter partition, one per gradient
// partition or piece, one per optimizer sub-group record.
func storeKeysOf(mi *Index, rank, world int, dtype tensor.DType, tiers map[string]tensor.Tier,
	oo optimizer.Options, gradPiece int, inference bool, param, grad, optim *swapper.Store) []StoreKeys {
	var paramSizes, gradSizes, optimSizes []int64
	sg := oo.SubGroupSize
	if sg <= 0 {
		sg = optimizer.DefaultSubGroupSize
	}
	for _, d := range mi.Descs {
		lo, hi := Partition(int(mi.Numel[d.Name]), rank, world)
		n := int64(hi - lo)
		if n == 0 {
			continue
		}
		if tiers[d.Name] == tensor.TierNVMe {
			paramSizes = append(paramSizes, n*int64(dtype.Size()))
		}
		if inference {
			continue
		}
		// Gradients the reservations keep in pinned memory
		// (Reservations.GradKept, zinf.pinned_grads) are counted too:
		// the gradient swapper takes a kept gradient's buffer only when
		// the tensor is registered (Runtime.Init, after Open), and
		// without room for it then (grad.Swapper.Register's fallback)
		// that gradient takes the store's round trip after all, in
		// pieces like any other; its disk must already be there.
		if gradPiece > 0 && n > int64(gradPiece) {
			for off := int64(0); off < n; off += int64(gradPiece) {
				gradSizes = append(gradSizes, 4*min(int64(gradPiece), n-off))
			}
		} else {
			gradSizes = append(gradSizes, 4*n)
		}
		// A sub-group's record: the master and the rule's states, as the
		// optimizer lays them out (staggered in large sub-groups).
		for off := int64(0); off < n; off += int64(sg) {
			optimSizes = append(optimSizes, optimizer.LayoutForArrays(int(min(int64(sg), n-off)), 1+oo.Hyper.StateCount()).Bytes)
		}
	}
	// An inference runtime writes each parameter once (Init) and never
	// stages an update: one version, not copy-on-write's two (a tensor
	// read in place, InitInPlace, takes none, but Open cannot know which
	// will be). Its gradient and optimizer stores exist (and take their
	// own files) with nothing written to them.
	paramVersions := swapper.CopyOnWriteVersions
	if inference {
		paramVersions = 1
	}
	var out []StoreKeys
	for _, k := range []StoreKeys{
		{"parameter", param, paramSizes, paramVersions},
		{"gradient", grad, gradSizes, swapper.CopyOnWriteVersions},
		{"optimizer", optim, optimSizes, swapper.CopyOnWriteVersions},
	} {
		if k.Store != nil {
			out = append(out, k)
		}
	}
	return out
}

// placementOf runs the policy over the model's inventory with the NVMe
// bandwidth bw.
func placementOf(cfg *config.Config, mi *Index, world int, computePerLayer time.Duration, bw Bandwidth) (*policy.Placement, error) {
	dtype := ParamDType(cfg)
	inv := SizeStates(cfg, policy.InventoryOf(mi.Descs, mi.Numel, dtype, world))
	h := HintsFor(cfg, len(mi.Layers), computePerLayer)
	// Pinned memory is the reservations' to judge (zinf.Open refuses a pool
	// below their minimum, naming it); the policy places tensors and sizes
	// prefetch without a pinned budget of its own, and buffer counts come
	// from the reservations, not from buffer_count x buffer_size.
	h.ParamBufferCount, h.ParamBufferBytes, h.OptimizerBufferCount = 0, 0, 0
	// max_in_cpu is the parameter swapper's cache, inside the parameters'
	// reservation, not tensors homed on the CPU tier.
	h.MaxInCPUBytes = 0
	tiers := Tiers(cfg, bw, cfg.GPUBytes(0), int64(cfg.Zinf.Tiers.CPUPinnedBytes))
	tiers.CPUBytes = policy.MaxBytes
	p, err := policy.Plan(tiers, inv, h)
	if err != nil || !cfg.GradientAccumulationAuto {
		return p, err
	}
	// gradient_accumulation_steps "auto": the micro-batches whose compute
	// covers a layer-major step's I/O, which does not depend on them (nor
	// do the homes), so one plan tells them; then the plan for them.
	c := p.MicroBatchesToHideIO()
	k, why := c.MicroBatches, c.String()
	if !c.Known() {
		k = AutoMicroBatchesUnmeasured
		why = fmt.Sprintf("%d until the compute per layer is known (zinf.Options.ComputePerLayer, or the loop's measured one: Runtime.MicroBatchesToHideIO); %s", k, why)
	}
	if k != h.MicroBatches {
		h.MicroBatches = k
		if p, err = policy.Plan(tiers, inv, h); err != nil {
			return nil, err
		}
	}
	p.Notes = append(p.Notes, fmt.Sprintf("gradient_accumulation_steps \"auto\": k = %d; %s", k, why))
	return p, nil
}

// SizeStates gives the optimizer states of inv (policy.InventoryOf lists
// Adam's three, in fp32) the states cfg's rule keeps and the size they
// take in cfg's zinf.optimizer_states. States the rule does not keep
// leave the inventory: SGD without momentum keeps only the master, SGD
// with momentum, Adagrad and Lion one state beside it (in the listing
// under ".exp_avg"), Adam and AdamW two. The rest are sized tensor by
// tensor as the optimizer picks their format (StateFormatForOf: fp32 for
// those zinf.optimizer_states_fp32 names and those under
// optimizer.MinCompressedElems elements): the fp32 master stays 4 bytes an
// element, a bf16 moment takes 2, an 8-bit one 1 plus 4 bytes of absmax a
// block. Without it the planner would predict a step with compressed
// states as moving fp32 ones (3.5x the bytes of 8-bit moments), and an SGD
// step as moving Adam's. inv's backing array is reused; the result is
// returned.
func SizeStates(cfg *config.Config, inv []policy.Tensor) []policy.Tensor {
	keep := Hyper(cfg).StateCount()
	formatFor := StateFormatForOf(cfg)
	out := inv[:0]
	for _, x := range inv {
		if x.Kind == policy.OptimState {
			owner, k := "", -1 // k: the state's index beside the master (-1: the master)
			for i, s := range []string{".exp_avg", ".exp_avg_sq"} {
				if o, ok := strings.CutSuffix(x.Name, s); ok {
					owner, k = o, i
				}
			}
			if k >= keep {
				continue // the rule keeps no such state
			}
			if k >= 0 && formatFor != nil {
				n := x.Bytes / 4
				x.Bytes = formatFor(owner, int(n)).StateBytes(n)
			}
		}
		out = append(out, x)
	}
	return out
}

// AutoMicroBatchesUnmeasured is the micro-batches a plan under
// gradient_accumulation_steps "auto" counts while the compute is not known:
// the fewest that one layer-major read of the parameters serves, so that
// the schedule and the pinned reservations are layer-major's. A loop
// measures its compute at them and then takes the planner's k
// (zinf.Runtime.MicroBatchesToHideIO).
const AutoMicroBatchesUnmeasured = 2

// DefaultPieceBytes is zinf.Options.PieceBytes's default: 4 MiB.
const DefaultPieceBytes = 4 << 20

// planPieces resolves zinf.Options.PieceBytes (0: DefaultPieceBytes; < 0:
// off) for the stores, and caps the optimizer's sub-group at a piece of
// gradient so that no sub-group's record or gradient slice is larger.
// Device I/O (GDS) swaps parameters into device memory whole: none are
// streamed then.
func planPieces(pieceBytes int64, deviceIO bool, param, grad *swapper.Store, oo *optimizer.Options) Pieces {
	if pieceBytes == 0 {
		pieceBytes = DefaultPieceBytes
	}
	if pieceBytes < 0 {
		return Pieces{}
	}
	var pc Pieces
	if param != nil && !deviceIO {
		u := param.PieceUnit()
		pc.ParamBytes = max(u, (pieceBytes+u-1)/u*u)
	}
	if grad != nil {
		elems := int(max(pieceBytes/4, 1))
		sg := oo.SubGroupSize
		if sg <= 0 {
			sg = optimizer.DefaultSubGroupSize
		}
		sg = min(sg, elems)
		if oo.StateFormat.Encoding == optimizer.EncodingBlockwise8 {
			sg = max(sg/optimizer.Blockwise8BlockSize, 1) * optimizer.Blockwise8BlockSize // sub-groups start blocks
		}
		oo.SubGroupSize = sg
		pc.GradElems = elems / sg * sg
	}
	return pc
}

// Tiers is the policy's view of cfg's tiers with the GPU tier's and the
// pinned CPU tier's capacities and the NVMe bandwidth given.
func Tiers(cfg *config.Config, bw Bandwidth, gpuBytes, cpuBytes int64) policy.Tiers {
	return policy.Tiers{GPUBytes: gpuBytes, CPUBytes: cpuBytes,
		NVMeReadBps: bw.ReadBps(), NVMeWriteBps: bw.WriteBps(), NVMeBandwidthSource: bw.Source(), NVMePaths: len(bw.Paths),
		PoolGranuleBytes: buffers.DefaultMinBufferBytes}
}

// AutoPipelineBytes is the bytes of sub-group buffers zinf.pipeline_depth
// "auto" keeps read ahead, and as many written behind: the requests the
// I/O engine keeps in flight, aio.queue_depth x aio.block_size (8 MiB by
// default; a larger transfer is split into requests of block_size).
// Sub-groups of that size or more keep depth 1; smaller ones go to the
// disk several at a time. One small sub-group at a time left the disk
// idle most of a step: at zero_optimization.sub_group_size 65536 (768 KiB
// records) and depth 1 the write-behind waited 54-84 s of a 124-layer
// step for one record's write at a time, the disk busy 40%
// (bench-llm-big, 2026-12-08).
func AutoPipelineBytes(cfg *config.Config) int64 {
	if b := int64(cfg.AIO.QueueDepth) * int64(cfg.AIO.BlockSize); b > 0 {
		return b
	}
	return 8 << 20
}

// autoPipelinePoolShare: zinf.pipeline_depth "auto" spends at most a
// sixteenth of a pool of the config's size on the deeper pipeline, so
// that the parameters' cache and prefetch window keep most of what the
// pool has beyond the minimums.
const autoPipelinePoolShare = 16

// autoPipelineNote says what zinf.pipeline_depth "auto" took (res), from
// the configured options oo, or that the pool had no room for it; "" when
// it wanted nothing deeper.
func autoPipelineNote(res Reservations, oo optimizer.Options, target int64) string {
	if res.OptimizerDepth == 0 {
		if res.OptimizerDepthWanted <= oo.PipelineDepth {
			return ""
		}
		return fmt.Sprintf("zinf.pipeline_depth \"auto\": the optimizer's sub-groups are small (zero_optimization.sub_group_size %d) and depth %d would keep %s of them in flight, but the pool (zinf.tiers.cpu_pinned_bytes) has no room for more than depth %d beyond its minimum and the prefetch window",
			oo.SubGroupSize, res.OptimizerDepthWanted, config.Size(target), oo.PipelineDepth)
	}
	room := ""
	if res.OptimizerDepth < res.OptimizerDepthWanted {
		room = fmt.Sprintf(" (%d would keep %s in flight; the pool, zinf.tiers.cpu_pinned_bytes, has room for %d beyond its minimum and the prefetch window)", res.OptimizerDepthWanted, config.Size(target), res.OptimizerDepth)
	}
	return fmt.Sprintf("zinf.pipeline_depth \"auto\": the optimizer reads up to %d sub-groups ahead and writes %d behind (depth %d rather than %d) with %d buffer sets (offload_optimizer.buffer_count raised to them)%s: its sub-groups are small (zero_optimization.sub_group_size %d); set pipeline_depth to a number to choose",
		res.OptimizerDepth, res.OptimizerDepth, res.OptimizerDepth, oo.PipelineDepth, res.OptimizerBufferCount, room, oo.SubGroupSize)
}
