package zinf

import (
	"context"
	"log/slog"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
)

// ModelPlan is what Open decides for a model under a config, for one
// rank: where each tensor lives and the predicted step (Placement), how
// the pinned pool is split and its minimum (Reservations), the NVMe
// bandwidth the prediction uses and where it comes from (Bandwidth), the
// free disk each NVMe path needs (Disk), and every component's options
// (see plan.Plan). PlanModel computes it without opening anything; an
// open Runtime has the same figures (Plan, Reservations, Bandwidth,
// DiskNeeds).
type ModelPlan = plan.Plan

// Reservations is how a Runtime splits its pinned pool between its
// consumers (see plan.Reservations).
type Reservations = plan.Reservations

// PoolTooSmallError says that the pinned pool cannot hold what the model
// needs at the least; Open returns it before anything is built.
type PoolTooSmallError = plan.PoolTooSmallError

// ErrPoolTooSmall is wrapped by PoolTooSmallError.
var ErrPoolTooSmall = plan.ErrPoolTooSmall

// DefaultPieceBytes is Options.PieceBytes's default: 4 MiB.
const DefaultPieceBytes = plan.DefaultPieceBytes

// PlanModel computes what Open would decide for model under cfg with
// opts — the placement and predicted step, the pinned reservations and
// minimum pool, the NVMe bandwidth used, the free disk each NVMe path
// needs — without opening a store, a pool or a device. The NVMe paths
// need not exist; the bandwidth of a path that does may be probed (see
// NVMeBandwidth). Of opts it reads what a plan depends on: Rank and
// WorldSize, ComputePerLayer, Inference, GatherLayers (planned whether or
// not Comm is set), Bandwidth, NoBandwidthProbe, Logger and PieceBytes.
func PlanModel(ctx context.Context, cfg *config.Config, m Model, opts Options) (*ModelPlan, error) {
	in, err := plan.Check(cfg, m, plan.Given{Rank: opts.Rank, WorldSize: opts.WorldSize, PieceBytes: opts.PieceBytes})
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	var ms plan.Measured
	var pending []pendingProbe
	if opts.Bandwidth != nil {
		ms.Bandwidth = *opts.Bandwidth
	} else if ms.Bandwidth, pending, err = measureBandwidth(ctx, in.Settings.Bandwidth, nil, opts.NoBandwidthProbe, true, log); err != nil {
		return nil, err
	}
	// The stores' geometry, for a device of the default alignment.
	ms.Stores = plan.GeometryOf(&in.Settings)
	p, err := plan.Make(in, ms, plan.Options{ComputePerLayer: opts.ComputePerLayer, Inference: opts.Inference, InPlace: opts.InPlace, Gather: opts.GatherLayers, PieceBytes: opts.PieceBytes})
	if err != nil {
		return nil, err
	}
	// Planned: cache what the probe measured (a config refused above
	// leaves nothing in the NVMe paths).
	storeProbes(pending, log)
	return p, nil
}
