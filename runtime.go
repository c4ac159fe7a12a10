package zinf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// Runtime is one rank's zinf: it owns the placement, the prefetch
// schedule and every pinned-memory decision for a Model, and speaks in
// layers and steps (see BeginLayer, ReadParam, AccumulateGrad, StepTensor,
// Step). Its loop methods are for one training-loop goroutine; Metrics
// and Plan are safe from any goroutine.
//
// The exported fields are the layer below, for tools: the config, the
// engine, the parameter and optimizer swappers and the stores. A training
// loop needs none of them.
type Runtime struct {
	Config    *config.Config
	Rank      int
	World     int
	DType     swapper.DType
	Engine    aio.Engine
	Params    *param.Swapper
	Optimizer *optimizer.Optimizer
	// Stores: nil where the config keeps that state in memory.
	ParamStore, GradStore, OptimStore *swapper.Store

	pool   *buffers.Pool
	device accel.Device
	grads  *grad.Swapper
	// deviceIO moves bytes between files and device memory when the config
	// selects GPUDirect Storage (zinf.gds "auto"/"required", aio.use_gds):
	// cuFile, or the bounce path when "auto" falls back. Nil when zinf.gds
	// is "off". See gpu.go.
	deviceIO             gds.DeviceIO
	deviceIOStagingBytes int64

	log       *slog.Logger
	ownEngine bool
	ownDevice bool
	model     *plan.Index
	placement *policy.Placement
	// cacheSet is, in inference, the NVMe parameters the CPU cache keeps
	// (cacheKeepSet); nil when training.
	cacheSet  map[string]bool
	res       Reservations
	bandwidth Bandwidth
	disk      []swapper.SpaceNeed
	// storeNeeds is the free space the runtime's stores still need on each
	// NVMe path (plan.DiskNeeds less what their files already take).
	storeNeeds func() []swapper.SpaceNeed
	tiers      map[string]tensor.Tier // each tensor's planned tier
	pieces     plan.Pieces            // how big tensors move
	inference  bool
	inPlace    bool // Options.InPlace
	trace      tracer
	// bgCtx is the context of what runs on behind the loop (the gathers
	// ahead, a step's update, a held gradient's write-behind); it ends at
	// Close.
	bgCtx    context.Context
	bgCancel context.CancelFunc

	// The parts, each owning its state: the loop's walk through the
	// layers (loop.go), the optimizer step in progress (stepstate.go),
	// this rank's part in the world of ranks (world.go).
	loop
	stepState
	world

	mu     sync.Mutex // guards the fields below, the counters and stepState's txn and last
	params []string
	numel  map[string]int
	inited map[string]bool
	closed bool
	counters
}

// Placement returns the placement Open chose: each tensor's tier, the
// prefetch depth, the predicted step (the plan's Placement; see
// PlanModel).
func (r *Runtime) Placement() *policy.Placement { return r.placement }

// Reservations returns how the pinned pool is split.
func (r *Runtime) Reservations() Reservations { return r.res }

// Bandwidth returns the NVMe bandwidth the plan used, per path with its
// source (Placement().Tiers has the sums).
func (r *Runtime) Bandwidth() Bandwidth {
	return Bandwidth{Paths: append([]PathBandwidth(nil), r.bandwidth.Paths...)}
}

// DiskNeeds returns the free space the plan counts on each NVMe path for
// this rank's swap stores, copy-on-write copies included (see
// ModelPlan.Disk); Open checked it.
func (r *Runtime) DiskNeeds() []swapper.SpaceNeed { return append([]swapper.SpaceNeed(nil), r.disk...) }

// Partition returns this rank's element range of a tensor of the model.
func (r *Runtime) Partition(name string) (lo, hi int) {
	return partition(int(r.model.Numel[name]), r.Rank, r.World)
}

// Layers returns the number of layers of the model.
func (r *Runtime) Layers() int { return len(r.model.Layers) }

// LayerTensors returns the names of layer l's tensors, in model order.
func (r *Runtime) LayerTensors(l int) []string {
	if l < 0 || l >= len(r.model.Layers) {
		return nil
	}
	return append([]string(nil), r.model.Layers[l]...)
}

// Metrics returns the counters.
func (r *Runtime) Metrics() Metrics {
	st := r.pool.Stats()
	r.mu.Lock()
	steps, ioWait := r.stepCount, time.Duration(r.ioWaitNs)
	updateWait := time.Duration(r.updateWaitNs)
	compute, units := time.Duration(r.computeNs), r.computeUnits
	train := r.trainStats
	cs := r.commStats
	r.mu.Unlock()
	m := Metrics{Pool: st, DeviceName: "none", Steps: steps, IOWait: ioWait, Reservations: r.res, Schedule: r.sched.Stats(), PinnedBytes: st.CapacityBytes, PinnedInUseBytes: st.InUseBytes, PinnedPeakBytes: st.PeakInUseBytes, Pinned: st.Pinned,
		Engine: r.Engine.Stats(), Params: r.Params.Stats(), Optimizer: r.Optimizer.Stats(), Grads: r.grads.Stats(), Train: train, Comm: cs,
		Compute: compute, ComputeUnits: units, UpdateWait: updateWait}
	for _, s := range []*swapper.Store{r.ParamStore, r.GradStore, r.OptimStore} {
		if s != nil {
			ss := s.Stats()
			m.BytesRead += ss.BytesRead
			m.BytesWritten += ss.BytesWritten
			m.ReadOps += ss.Reads
			m.WriteOps += ss.Writes
			for _, ps := range ss.Paths {
				m.DeviceBytesRead += ps.BytesRead
				m.DeviceBytesWritten += ps.BytesWritten
			}
		}
	}
	if r.device != nil {
		m.DeviceUsedBytes = r.device.UsedBytes()
		m.DeviceName = r.device.Name()
	}
	return m
}

// ErrClosed is matched (errors.Is) by what a Runtime's methods return
// after Close, whichever layer below noticed: the swappers, the stores,
// the pool and the engine all close with sentinels that match it (see
// tensor.ErrClosed).
var ErrClosed = tensor.ErrClosed

// closedErr returns an error naming op once Close has run, nil before. It
// wraps layer, the closed sentinel of the layer the call works on
// (param.ErrClosed for a read, say; all match ErrClosed), or ErrClosed
// when layer is nil. Every public method that can fail calls it first, so
// a closed runtime says so whatever else would be wrong with the call.
func (r *Runtime) closedErr(op string, layer error) error {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if !closed {
		return nil
	}
	if layer == nil {
		layer = ErrClosed
	}
	return fmt.Errorf("zinf: %s: the runtime is closed: %w", op, layer)
}

var errInference = errors.New("zinf: the runtime was opened for inference (Options.Inference): it keeps no gradients or optimizer states")
