package zinf

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
)

// Open's build: each component from the plan alone, once, in dependency
// order, the engine and the swap stores first (the plan sized them from
// their geometry, a value: nothing was opened to plan).

// build checks the plan against the pool, opens the engine and the swap
// stores of the plan's geometry and checks the disk, reserves the stores'
// space (zinf.preallocate), then builds the pinned pool, the device and
// its I/O, the three swappers, the training state and the prefetch
// scheduler from the plan, and joins the world of ranks.
func (r *Runtime) build(pl *plan.Plan, opts Options) (err error) {
	log, p := r.log, &pl.Components
	r.placement, r.res, r.bandwidth, r.disk, r.tiers, r.pieces = pl.Placement, pl.Reservations, pl.Bandwidth, pl.Disk, p.Tiers, p.Pieces
	if r.res.PoolBytes < r.res.MinPoolBytes {
		return &PoolTooSmallError{Have: r.res.PoolBytes, Need: r.res.MinPoolBytes, Res: r.res}
	}
	if err := r.openStores(p.Stores, &p.Settings, opts.Engine, opts.Faults, opts.Trace); err != nil {
		return err
	}
	// Free space: every NVMe path must hold what the stores will write
	// there, copy-on-write copies included, before anything is written.
	if err := r.checkDiskSpace(p); err != nil {
		return err
	}
	if pl.Preallocate {
		// The plan counts the keys; the stores reserve their space here.
		for _, k := range plan.KeysOf(r.model, r.Rank, r.World, p.DType, p.Tiers, p.Optimizer, p.Pieces.GradElems, false, r.ParamStore, r.GradStore, r.OptimStore) {
			if len(k.Sizes) == 0 {
				continue
			}
			if err := k.Store.Preallocate(k.Sizes, k.Versions); err != nil {
				return fmt.Errorf("zinf: rank %d: preallocating the %s store: %w (zinf.preallocate false turns it off)", r.Rank, k.What, err)
			}
		}
	}
	if p.MaxInCPU*int64(p.DType.Size()) > r.res.ParamCacheBytes {
		log.Warn("zinf: zero_optimization.offload_param.max_in_cpu is larger than the pinned pool can spare; the parameter cache uses what fits",
			"max_in_cpu_elements", p.MaxInCPU, "cache", config.Size(r.res.ParamCacheBytes).String())
	}
	po := p.Pool
	po.Logger = log
	if opts.PinnedStallTimeout > 0 {
		po.StallTimeout = opts.PinnedStallTimeout
	}
	r.pool, err = buffers.NewPool(po)
	if err != nil {
		return fmt.Errorf("zinf: pinned pool (zinf.tiers.cpu_pinned_bytes = %s): %w", p.PinnedBytes, err)
	}
	// io_uring registered buffers: the kernel pins the arena once instead
	// of every request's pages. Where the backend has none, or the
	// registration is refused (the memlock limit), the engine says so once
	// and moves the buffers as ordinary memory; the pool unregisters the
	// arena before it unmaps it.
	if err := r.pool.Register(r.Engine); err != nil {
		log.Debug("zinf: pinned pool not registered with the I/O engine", "err", err)
	}
	if r.device = opts.Device; r.device == nil {
		r.device, err = openDevice(p.Device, log)
		if err != nil {
			return err
		}
		r.ownDevice = true
	}
	for _, reg := range r.pool.Regions() {
		if err := r.device.RegisterHost(reg); err != nil {
			log.Warn("zinf: could not register the pinned pool with the device; copies will be staged", "err", err)
			break
		}
	}
	if err := r.openDeviceIO(&p.Settings); err != nil {
		return err
	}
	var keep func(string) bool
	if r.cacheSet = r.cacheKeepSet(p.DType.Size(), opts.PrefetchDepth); r.cacheSet != nil {
		keep = r.CacheKeeps
	}
	r.Params, err = param.New(param.Options{Store: r.ParamStore, Pool: r.pool, Device: r.device, Rank: r.Rank, WorldSize: r.World,
		DType: p.DType, MaxInCPUBytes: r.res.ParamCacheBytes, CacheKeep: keep, PieceBytes: r.pieces.ParamBytes,
		// The reservations bound parameter memory; a slot count below the
		// tensors of one layer would deadlock its barrier, so
		// offload_param.buffer_count is not a limit here.
		BufferCount: 0, Logger: log,
		// With GDS selected (aio.use_gds / zinf.gds), NVMe partitions are
		// swapped into device memory through DeviceIO, as DeepSpeed does.
		DeviceIO: r.deviceIO})
	if err != nil {
		return fmt.Errorf("zinf: param swapper: %w", err)
	}
	if err := r.setupTraining(&p.Settings, opts); err != nil {
		return err
	}
	r.grads, err = grad.New(grad.Options{Store: r.GradStore, Pool: r.pool, Logger: log, SumSquares: r.train.checks, PieceElems: r.pieces.GradElems,
		// Step flushes the gradients before it commits, so a write-behind
		// failure that a served read could not report still aborts it.
		ServeWhileWriting: true, Keep: r.gradKeep()})
	if err != nil {
		return fmt.Errorf("zinf: gradient swapper: %w", err)
	}
	r.logPinnedGrads(log)
	optOpts := p.Optimizer
	optOpts.Logger = log
	optOpts.Store, optOpts.Pool, optOpts.Grads = r.OptimStore, r.pool, r.grads
	optOpts.Params = optimizer.SinkOf[param.Waiter](r.Params)
	r.Optimizer, err = optimizer.New(optOpts)
	if err != nil {
		return fmt.Errorf("zinf: optimizer swapper: %w", err)
	}
	for _, d := range r.model.Descs {
		if err := r.Params.Register(d.Name, int(r.model.Numel[d.Name]), p.Tiers[d.Name]); err != nil {
			return err
		}
	}
	r.openScheduler(p, opts)
	r.bgCtx, r.bgCancel = context.WithCancel(context.Background())
	return r.distribute(opts)
}

// openScheduler builds the prefetch scheduler: it prefetches NVMe
// partitions in the order of use, within the prefetch window, as deep as
// the plan says unless Options.PrefetchDepth says otherwise.
func (r *Runtime) openScheduler(p *plan.Components, opts Options) {
	depth := r.placement.PrefetchDepth
	depthWhy := ""
	switch {
	case opts.PrefetchDepth < 0:
		depth, depthWhy = -1, "Options.PrefetchDepth -1 turns prefetching off"
	case r.res.PrefetchBytes == 0:
		// No prefetch window (the pool is at its minimum): a layer fetched
		// ahead would take the memory of the layer in use.
		depth, depthWhy = -1, "the pinned pool is at its minimum: no prefetch window is left (raise zinf.tiers.cpu_pinned_bytes)"
	case opts.PrefetchDepth > 0:
		depth, depthWhy = opts.PrefetchDepth, fmt.Sprintf("Options.PrefetchDepth %d", opts.PrefetchDepth)
	}
	if r.ParamStore == nil {
		depth, depthWhy = -1, "no parameter lives on NVMe"
	}
	// Streamed partitions move in pieces as they are used: not prefetched.
	layers := make([][]string, len(p.NVMeLayers))
	for l, names := range p.NVMeLayers {
		for _, n := range names {
			if !r.Params.Streamed(n) {
				layers[l] = append(layers[l], n)
			}
		}
	}
	granule := int(r.res.GranuleBytes)
	size := func(name string) int64 {
		n, err := r.Params.PartitionLen(name)
		if err != nil || n == 0 {
			return 0
		}
		return buffers.SpanBytes(r.ParamStore.PaddedLen(int64(n*p.DType.Size())), granule)
	}
	budget := r.res.PrefetchBytes
	if budget == 0 {
		budget = -1 // unused: depth is off
	}
	if r.ParamStore != nil {
		r.sched = policy.NewScheduler(r.placement, layers, r.Params, policy.SchedulerOptions{Depth: depth, BudgetBytes: budget, SizeOf: size})
	} else {
		r.sched = policy.NewScheduler(r.placement, layers, r.Params, policy.SchedulerOptions{Depth: -1, BudgetBytes: -1, SizeOf: func(string) int64 { return 0 }})
	}
	r.overlap = r.placement.OverlapStep && !opts.SerialStep
	if r.Config.Zinf.OverlapUpdate && !opts.Inference {
		// The update and the next forward hold their working sets together,
		// as the update and the backward do under StepTensor: only where
		// the plan found room for both.
		r.overlapUpdate = r.overlap && !opts.GatherLayers
		if !r.overlapUpdate {
			why := "the plan found no room in the pinned pool for the update's and the parameters' working sets together (Placement().OverlapStep is false)"
			switch {
			case opts.SerialStep:
				why = "Options.SerialStep runs the whole update in Step"
			case opts.GatherLayers:
				// A layer's gather runs ahead of its BeginLayer, on every rank:
				// it would read partitions not yet updated.
				why = "Options.GatherLayers gathers each layer ahead of its BeginLayer, which would read partitions whose update is still running"
			}
			r.log.Warn("zinf: zinf.overlap_update is set but Step waits for the whole update: " + why)
		}
	}
	// Plan tells what this runtime does, overrides included.
	r.placement = r.placement.Adjusted(max(depth, 0), depthWhy, r.overlap, "Options.SerialStep")
}

// checkDiskSpace refuses a runtime whose NVMe paths have less free space
// than its stores will take (plan.DiskNeeds with the open stores: their own
// alignment, less what their files already hold), naming each short path,
// the need and the free bytes.
func (r *Runtime) checkDiskSpace(p *plan.Components) error {
	// A KV cache opened later (OpenKVCache) checks its own swap files
	// together with what these stores still need then.
	params := r.ParamStore
	if r.inPlace {
		params = nil // Options.InPlace: read where the caller's file holds them
	}
	r.storeNeeds = func() []swapper.SpaceNeed {
		return plan.DiskNeeds(r.model, r.Rank, r.World, p.DType, p.Tiers, p.Optimizer, p.Pieces.GradElems, r.inference, params, r.GradStore, r.OptimStore)
	}
	if err := swapper.CheckSpace(r.storeNeeds()...); err != nil {
		return fmt.Errorf("zinf: rank %d: not enough free disk for the swap files (copy-on-write keeps %d copies of each NVMe tensor during a step; `zinf plan` shows the need per path): %w",
			r.Rank, swapper.CopyOnWriteVersions, err)
	}
	return nil
}

// openDevice opens the device the config selects: "sim", "cuda", or
// "auto" (CUDA when it works, else the simulated device, said once).
func openDevice(d plan.DeviceSettings, log *slog.Logger) (accel.Device, error) {
	switch d.Kind {
	case config.DeviceCUDA:
		dev, err := cuda.Open(cuda.Options{CapacityBytes: d.CUDABytes})
		if err != nil {
			return nil, fmt.Errorf("zinf: zinf.device is \"cuda\": %w", err)
		}
		return dev, nil
	case config.DeviceAuto:
		dev, err := cuda.Open(cuda.Options{CapacityBytes: d.CUDABytes})
		if err == nil {
			return dev, nil
		}
		log.Info("zinf: no usable GPU; the GPU tier is simulated in host memory", "capacity", config.Size(d.SimBytes).String(), "reason", err)
	}
	return accel.NewSim(accel.SimOptions{CapacityBytes: d.SimBytes, Name: "sim"})
}

// cacheKeepSet is, for inference, the set of NVMe parameters the CPU cache
// (max_in_cpu) keeps: every decoding pass uses each weight once and never
// changes it, so the cache holds a fixed set, spread over the layers
// (policy.SpreadCache) so that the reads left overlap the compute of every
// layer. The set fits what the planned prefetch window leaves of the
// cache's memory: the two share it, and a prefetch short of memory would
// evict cached weights for the next pass to read again. Each weight is
// counted at the power-of-two span the pool must find for it
// (buffers.SpanBytes), not its bytes: counted at their bytes, kept
// weights of odd sizes (a 5120 x 13824 bf16 matrix takes 142 MB of a
// 256 MiB span) left the free memory in pieces too small for the next
// layer's buffers, and every pass evicted and read again about half the
// kept set. Of the
// partitions moved whole only: a streamed one (larger than a piece) never
// enters the cache. nil when training (the cache keeps what the passes
// released, and the backward pass reuses the forward's last layers) or
// without a cache.
func (r *Runtime) cacheKeepSet(elem, depthOpt int) map[string]bool {
	if !r.inference || r.res.ParamCacheBytes <= 0 {
		return nil
	}
	depth := max(r.placement.PrefetchDepth, depthOpt, 0)
	budget := min(r.res.ParamCacheBytes, r.res.PrefetchBytes-int64(depth)*r.res.ParamDemandBytes)
	var names []string
	var sizes []int64
	for _, layer := range r.placement.NVMeParamsByLayer() {
		for _, n := range layer {
			lo, hi := r.Partition(n)
			b := int64(hi-lo) * int64(elem)
			if r.pieces.ParamBytes > 0 && b > r.pieces.ParamBytes {
				b = 0 // streamed
			}
			names = append(names, n)
			sizes = append(sizes, buffers.SpanBytes(b, r.pool.MinBufferBytes()))
		}
	}
	keep := map[string]bool{}
	for i, k := range policy.SpreadCache(sizes, budget) {
		if k {
			keep[names[i]] = true
		}
	}
	return keep
}

// CacheKeeps reports whether the parameter swapper's CPU cache
// (offload_param.max_in_cpu, as far as the pinned pool holds it) keeps
// the NVMe parameter name for good once read: in inference, the fixed set
// spread over the layers that Open chose. Such a weight is read from NVMe
// (or its file) once, then served from pinned memory by every pass while
// the pool is not short. Always false when training, whose cache keeps
// whatever the passes released.
func (r *Runtime) CacheKeeps(name string) bool { return r.cacheSet[name] }
