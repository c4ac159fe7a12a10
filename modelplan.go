package zinf

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// ModelPlan is what Open decides for a model under a config, for one
// rank: where each tensor lives and the predicted step (Placement), how
// the pinned pool is split and its minimum (Reservations), the NVMe
// bandwidth the prediction uses and where it comes from (Bandwidth), and
// the free disk each NVMe path needs (Disk). PlanModel computes it without
// opening anything; an open Runtime has the same figures (Plan,
// Reservations, Bandwidth, DiskNeeds).
//
// Sizes that depend on the device (padding, aligned reads) are counted for
// an alignment of swapper.DefaultDiskAlignment (4 KiB) or the device's,
// whichever is larger, so the minimum pool PlanModel reports is the one
// Open enforces on any device of 4 KiB alignment or less.
type ModelPlan struct {
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
}

// DiskBytes is Disk added up.
func (p *ModelPlan) DiskBytes() int64 {
	var n int64
	for _, d := range p.Disk {
		n += d.Bytes
	}
	return n
}

// WriteText renders the plan for people, as `zinf plan` prints it: the
// placement table, each NVMe path's bandwidth with its source, the disk
// each path needs, and the pinned reservations with the minimum pool.
func (p *ModelPlan) WriteText(w io.Writer) error {
	if err := p.Placement.WriteTable(w); err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	if len(p.Bandwidth.Paths) > 0 {
		fmt.Fprintf(bw, "\nnvme bandwidth per path (paths add up: read %s/s, write %s/s):\n%s",
			units.FormatBytes(int64(p.Bandwidth.ReadBps())), units.FormatBytes(int64(p.Bandwidth.WriteBps())), p.Bandwidth)
	}
	if len(p.Disk) > 0 {
		fmt.Fprintf(bw, "\nnvme disk: free space each path needs (swap files with their copy-on-write copies; Open checks it):\n")
		for _, d := range p.Disk {
			fmt.Fprintf(bw, "  %s: %s (%d bytes)\n", d.Path, units.FormatBytes(d.Bytes), d.Bytes)
		}
	}
	fmt.Fprintf(bw, "\npinned memory by reservation (rank %d of %d):\n%s", p.Rank, p.World, p.Reservations)
	return bw.Flush()
}

// PlanOptions adjust PlanModel.
type PlanOptions struct {
	// Rank and WorldSize, when WorldSize > 0, override the config's.
	Rank, WorldSize int
	// ComputePerLayer is the loop's compute time per layer and pass, in
	// seconds (see Options.ComputePerLayer).
	ComputePerLayer float64
	// Inference plans for forward passes only (see Options.Inference).
	Inference bool
	// GatherLayers plans the pinned memory of gathered layers (see
	// Options.GatherLayers: ranks as processes).
	GatherLayers bool
	// Bandwidth, when set, is used as it is; otherwise PlanModel gets it
	// from NVMeBandwidth.
	Bandwidth *Bandwidth
	// NoBandwidthProbe never probes a path (see BandwidthOptions.NoProbe).
	NoBandwidthProbe bool
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
	// PieceBytes is Options.PieceBytes: tensors larger move in pieces
	// (0: zinf.piece_bytes, else DefaultPieceBytes; -1: whole).
	PieceBytes int64
}

// PlanModel computes what Open would decide for model under cfg — the
// placement and predicted step, the pinned reservations and minimum pool,
// the NVMe bandwidth used, the free disk each NVMe path needs — without
// opening a store, a pool or a device. The NVMe paths need not exist;
// the bandwidth of a path that does may be probed (see NVMeBandwidth).
func PlanModel(ctx context.Context, cfg *config.Config, m Model, opts PlanOptions) (*ModelPlan, error) {
	mi, log, rank, world, err := checkInputs(cfg, m, opts.Logger, opts.Rank, opts.WorldSize)
	if err != nil {
		return nil, err
	}
	var bw Bandwidth
	if opts.Bandwidth != nil {
		bw = *opts.Bandwidth
	} else if bw, err = NVMeBandwidth(ctx, cfg, BandwidthOptions{NoProbe: opts.NoBandwidthProbe, Logger: log, deferCache: true}); err != nil {
		return nil, err
	}
	s := settingsOf(cfg, log, nil, 0)
	in := planInput{cfg: cfg, s: &s, mi: mi, rank: rank, world: world, computePerLayer: opts.ComputePerLayer, inference: opts.Inference, bw: bw, pieceBytes: opts.PieceBytes,
		gather: opts.GatherLayers}
	sizing := func(o swapper.StoreOptions) (*swapper.Store, error) {
		return swapper.SizingStore(o, swapper.DefaultDiskAlignment)
	}
	if s.paramStore.Paths != nil {
		if in.param, err = sizing(s.paramStore); err != nil {
			return nil, fmt.Errorf("zinf: param swap store: %w", err)
		}
	}
	if s.optimStore.Paths != nil {
		if in.optim, err = sizing(s.optimStore); err != nil {
			return nil, fmt.Errorf("zinf: optim swap store: %w", err)
		}
		in.grad = in.optim
	}
	pd, err := makePlan(in)
	if err != nil {
		return nil, err
	}
	// Planned: cache what the probe measured (a config refused above
	// leaves nothing in the NVMe paths).
	bw.storeProbes(log)
	pd.plan.Bandwidth.pending = nil
	return pd.plan, nil
}

// checkInputs validates what Open and PlanModel are given: the config
// (every problem reported), the model, and the rank and world size (the
// config's, or rank and worldSize when worldSize > 0). It returns the
// model's index and the logger to use (slog.Default() for nil).
func checkInputs(cfg *config.Config, m Model, logger *slog.Logger, rank, worldSize int) (*modelInfo, *slog.Logger, int, int, error) {
	if cfg == nil {
		return nil, nil, 0, 0, errors.New("zinf: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, 0, 0, err
	}
	mi, err := m.check()
	if err != nil {
		return nil, nil, 0, 0, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	r, world := cfg.RankWorld()
	if worldSize > 0 {
		r, world = rank, worldSize
	}
	if r < 0 || r >= world {
		return nil, nil, 0, 0, fmt.Errorf("zinf: rank %d is outside world size %d", r, world)
	}
	return mi, logger, r, world, nil
}

// planInput is what makePlan needs: the stores are open ones (Open) or
// sizing ones (PlanModel), nil where the config keeps that state in memory;
// of them makePlan reads only the geometry (alignment, stripes, padding).
type planInput struct {
	cfg                *config.Config
	s                  *settings // cfg in each component's words
	mi                 *modelInfo
	rank, world        int
	computePerLayer    float64
	inference          bool
	gather             bool // Options.GatherLayers
	bw                 Bandwidth
	param, grad, optim *swapper.Store
	pieceBytes         int64 // Options.PieceBytes as given
}

// planned is makePlan's result: the plan, and what Open builds from it.
type planned struct {
	*settings
	plan    *ModelPlan
	tiers   map[string]tensor.Tier
	optOpts optimizer.Options
	pieces  pieces
	pool    buffers.Options // the pinned pool (Logger aside)
	// nvmeLayers are each layer's NVMe tensors, in the order of use: what
	// the scheduler prefetches.
	nvmeLayers [][]string
}

// makePlan plans placement and prefetch, sizes the pinned reservations and
// the disk each NVMe path needs. Open and PlanModel share it, so they
// agree.
func makePlan(in planInput) (*planned, error) {
	cfg, mi := in.cfg, in.mi
	placement, err := planModel(cfg, mi, in.rank, in.world, in.computePerLayer, in.bw)
	if err != nil {
		return nil, err
	}
	tiers := make(map[string]tensor.Tier, len(mi.descs))
	for _, d := range mi.descs {
		t, ok := placement.Tier[d.Name]
		if !ok || (t == tensor.TierNVMe && in.param == nil) {
			t = tensor.TierCPU
		}
		tiers[d.Name] = t
	}
	optOpts := in.s.optimizer
	// Pinned memory and disk are sized for a device alignment of at least
	// 4 KiB, so that a plan made before the stores exist (PlanModel) gives
	// the figures Open enforces.
	sizing := func(s *swapper.Store) *swapper.Store {
		if s == nil {
			return nil
		}
		return s.Sizing(swapper.DefaultDiskAlignment)
	}
	ps, gs, os := sizing(in.param), sizing(in.grad), sizing(in.optim)
	var bounce int64
	if mode, _ := gds.ParseMode(in.s.gdsMode); mode != gds.ModeOff {
		bo := in.s.bounce
		bounce = 2 * int64(bo.Parallelism) * buffers.SpanBytes(bo.BlockSizeBytes, int(granuleBytes(ps, gs, os)))
	}
	dtype := in.s.dtype
	pieceBytes := in.pieceBytes // Options.PieceBytes, else zinf.piece_bytes
	if pieceBytes == 0 {
		pieceBytes = int64(cfg.Zinf.PieceBytes)
	}
	pcs := planPieces(pieceBytes, bounce > 0, ps, gs, &optOpts)
	rin := reservationInput{cfg: cfg, mi: mi, rank: in.rank, world: in.world, dtype: dtype, tiers: tiers,
		paramStore: ps, gradStore: gs, optimStore: os, prefetch: placement.PrefetchDepth,
		bounceBytes: bounce, optOpts: optOpts, inference: in.inference, gather: in.gather,
		layerMajor: placement.Schedule == policy.ScheduleLayerMajor, pieces: pcs}
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
	p := &ModelPlan{Rank: in.rank, World: in.world, Placement: placement, Reservations: res, Bandwidth: in.bw}
	p.Disk = diskNeeds(mi, in.rank, in.world, dtype, tiers, optOpts, pcs.gradElems, in.inference, ps, gs, os)
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
	nvmeLayers := make([][]string, len(mi.layers))
	for l, names := range mi.layers {
		for _, n := range names {
			if tiers[n] == tensor.TierNVMe {
				nvmeLayers[l] = append(nvmeLayers[l], n)
			}
		}
	}
	return &planned{settings: in.s, plan: p, tiers: tiers, optOpts: optOpts, pieces: pcs, nvmeLayers: nvmeLayers,
		pool: buffers.Options{CapacityBytes: res.PoolBytes, MinBufferBytes: int(res.GranuleBytes), Reservations: resv,
			StallTimeout: in.s.pinnedStall}}, nil
}

// diskNeeds is the free space each store needs on each of its paths to
// hold this rank's NVMe tensors with their copy-on-write copies (see
// swapper.Store.SpaceNeeds), merged by path in the config's order.
func diskNeeds(mi *modelInfo, rank, world int, dtype tensor.DType, tiers map[string]tensor.Tier,
	oo optimizer.Options, gradPiece int, inference bool, param, grad, optim *swapper.Store) []swapper.SpaceNeed {
	var paramSizes, gradSizes, optimSizes []int64
	sg := oo.SubGroupSize
	if sg <= 0 {
		sg = optimizer.DefaultSubGroupSize
	}
	for _, d := range mi.descs {
		lo, hi := partition(int(mi.numel[d.Name]), rank, world)
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
	var out []swapper.SpaceNeed
	index := map[string]int{}
	add := func(s *swapper.Store, sizes []int64) {
		if s == nil {
			return
		}
		for _, n := range s.SpaceNeeds(sizes, swapper.CopyOnWriteVersions) {
			if i, ok := index[n.Path]; ok {
				out[i].Bytes += n.Bytes
				continue
			}
			index[n.Path] = len(out)
			out = append(out, n)
		}
	}
	add(param, paramSizes)
	if !inference {
		add(grad, gradSizes)
		add(optim, optimSizes)
	} else {
		// The stores exist (and take their own files) even when nothing
		// is written to them.
		add(grad, nil)
		add(optim, nil)
	}
	return out
}

// planModel runs the policy over the model's inventory with the NVMe
// bandwidth bw.
func planModel(cfg *config.Config, mi *modelInfo, rank, world int, computePerLayer float64, bw Bandwidth) (*policy.Placement, error) {
	dtype := ParamDType(cfg)
	inv := policy.InventoryOf(mi.descs, mi.numel, dtype, world)
	h := HintsFor(cfg, len(mi.layers), 0)
	h.ComputeSecondsPerLayer = 2 * computePerLayer
	// Pinned memory is the reservations' to judge (Open refuses a pool
	// below their minimum, naming it); the policy places tensors and sizes
	// prefetch without a pinned budget of its own, and buffer counts come
	// from the reservations, not from buffer_count x buffer_size.
	h.ParamBufferCount, h.ParamBufferBytes, h.OptimizerBufferCount = 0, 0, 0
	// max_in_cpu is the parameter swapper's cache, inside the parameters'
	// reservation, not tensors homed on the CPU tier.
	h.MaxInCPUBytes = 0
	tiers := tiersWith(cfg, bw, nil)
	tiers.CPUBytes = policy.MaxBytes
	return policy.Plan(tiers, inv, h)
}

// ParamChecksumBytes is the bytes one checksum covers in the parameter
// swap store (with zinf.checksums; swapper.StoreOptions.ChecksumBytes):
// reading a few rows of a streamed tensor (ReadParamRows) reads and
// verifies 16 KiB around each, not the 1 MiB stripe. The other stores
// checksum each stripe.
const ParamChecksumBytes = 16 << 10

// DefaultPieceBytes is Options.PieceBytes's default: 4 MiB.
const DefaultPieceBytes = 4 << 20

// planPieces resolves Options.PieceBytes (0: DefaultPieceBytes; < 0:
// off) for the stores, and caps the optimizer's sub-group at a piece of
// gradient so that no sub-group's record or gradient slice is larger.
// Device I/O (GDS) swaps parameters into device memory whole: none are
// streamed then.
func planPieces(pieceBytes int64, deviceIO bool, param, grad *swapper.Store, oo *optimizer.Options) pieces {
	if pieceBytes == 0 {
		pieceBytes = DefaultPieceBytes
	}
	if pieceBytes < 0 {
		return pieces{}
	}
	var pc pieces
	if param != nil && !deviceIO {
		u := param.PieceUnit()
		pc.paramBytes = max(u, (pieceBytes+u-1)/u*u)
	}
	if grad != nil {
		elems := int(max(pieceBytes/4, 1))
		sg := oo.SubGroupSize
		if sg <= 0 {
			sg = optimizer.DefaultSubGroupSize
		}
		sg = min(sg, elems)
		oo.SubGroupSize = sg
		pc.gradElems = elems / sg * sg
	}
	return pc
}

// tiersWith is TiersFor with the NVMe bandwidth given.
func tiersWith(cfg *config.Config, bw Bandwidth, rts []*Runtime) policy.Tiers {
	gpuBytes, cpuBytes := tierBytes(cfg, rts)
	return policy.Tiers{GPUBytes: gpuBytes, CPUBytes: cpuBytes,
		NVMeReadBps: bw.ReadBps(), NVMeWriteBps: bw.WriteBps(), NVMeBandwidthSource: bw.Source(), NVMePaths: len(bw.Paths),
		PoolGranuleBytes: buffers.DefaultMinBufferBytes}
}
