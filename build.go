package zinf

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/trace"
)

// Open's build: each component from the plan alone, once, in dependency
// order (the engine and the swap stores come first, because the plan
// depends on their geometry).

// openStores starts the timeline (Options.Trace), which the stores record
// into, and opens the I/O engine (unless Options.Engine gives one) and
// the swap stores the settings ask for, on it.
func (r *Runtime) openStores(s *settings, engine aio.Engine, sink trace.Sink) (err error) {
	r.trace.init(sink, r.Rank, len(r.model.layers))
	if r.Engine = engine; r.Engine == nil {
		r.Engine, err = aio.New(s.engine)
		if err != nil {
			return fmt.Errorf("zinf: I/O engine: %w", err)
		}
		r.ownEngine = true
	}
	warnRAMPaths(s.nvmePaths, r.log)
	// openStore opens the swap store name ("param", "optim" or "grad") with
	// the settings' options o, on the runtime's engine, recording into its
	// timeline.
	openStore := func(name string, o swapper.StoreOptions) (*swapper.Store, error) {
		o.Engine, o.Name, o.Logger, o.Trace = r.Engine, fmt.Sprintf("%s-rank%d", name, r.Rank), r.log, r.trace.store(name)
		if name == "param" {
			o.ChecksumBytes = ParamChecksumBytes
		}
		st, err := swapper.OpenStore(o)
		if err != nil {
			return nil, fmt.Errorf("zinf: %s swap store: %w", name, err)
		}
		return st, nil
	}
	if s.paramStore.Paths != nil {
		if r.ParamStore, err = openStore("param", s.paramStore); err != nil {
			return err
		}
	}
	if s.optimStore.Paths != nil {
		if r.OptimStore, err = openStore("optim", s.optimStore); err != nil {
			return err
		}
		if r.GradStore, err = openStore("grad", s.optimStore); err != nil {
			return err
		}
	}
	return nil
}

// build checks the plan against the pool and the disk, then builds the
// pinned pool, the device and its I/O, the three swappers, the training
// state and the prefetch scheduler from it, and joins the world of ranks.
func (r *Runtime) build(p *planned, opts Options) (err error) {
	log := r.log
	r.placement, r.res, r.disk, r.tiers, r.pieces = p.plan.Placement, p.plan.Reservations, p.plan.Disk, p.tiers, p.pieces
	if r.res.PoolBytes < r.res.MinPoolBytes {
		return &PoolTooSmallError{Have: r.res.PoolBytes, Need: r.res.MinPoolBytes, Res: r.res}
	}
	// Free space: every NVMe path must hold what the stores will write
	// there, copy-on-write copies included, before anything is written.
	if err := r.checkDiskSpace(p); err != nil {
		return err
	}
	if p.maxInCPU*int64(p.dtype.Size()) > r.res.ParamCacheBytes {
		log.Warn("zinf: zero_optimization.offload_param.max_in_cpu is larger than the pinned pool can spare; the parameter cache uses what fits",
			"max_in_cpu_elements", p.maxInCPU, "cache", config.Size(r.res.ParamCacheBytes).String())
	}
	po := p.pool
	po.Logger = log
	if opts.PinnedStallTimeout > 0 {
		po.StallTimeout = opts.PinnedStallTimeout
	}
	r.Pool, err = buffers.NewPool(po)
	if err != nil {
		return fmt.Errorf("zinf: pinned pool (zinf.tiers.cpu_pinned_bytes = %s): %w", p.pinnedBytes, err)
	}
	// io_uring registered buffers: the kernel pins the arena once instead
	// of every request's pages. Where the backend has none, or the
	// registration is refused (the memlock limit), the engine says so once
	// and moves the buffers as ordinary memory; the pool unregisters the
	// arena before it unmaps it.
	if err := r.Pool.Register(r.Engine); err != nil {
		log.Debug("zinf: pinned pool not registered with the I/O engine", "err", err)
	}
	if r.Device = opts.Device; r.Device == nil {
		r.Device, err = openDevice(p.device, log)
		if err != nil {
			return err
		}
		r.ownDevice = true
	}
	for _, reg := range r.Pool.Regions() {
		if err := r.Device.RegisterHost(reg); err != nil {
			log.Warn("zinf: could not register the pinned pool with the device; copies will be staged", "err", err)
			break
		}
	}
	if err := r.openDeviceIO(p.settings); err != nil {
		return err
	}
	r.Params, err = param.New(param.Options{Store: r.ParamStore, Pool: r.Pool, Device: r.Device, Rank: r.Rank, WorldSize: r.World,
		DType: p.dtype, MaxInCPUBytes: r.res.ParamCacheBytes, PieceBytes: r.pieces.paramBytes,
		// The reservations bound parameter memory; a slot count below the
		// tensors of one layer would deadlock its barrier, so
		// offload_param.buffer_count is not a limit here.
		BufferCount: 0, Logger: log,
		// With GDS selected (aio.use_gds / zinf.gds), NVMe partitions are
		// swapped into device memory through DeviceIO, as DeepSpeed does.
		DeviceIO: r.DeviceIO})
	if err != nil {
		return fmt.Errorf("zinf: param swapper: %w", err)
	}
	if err := r.setupTraining(p.settings, opts); err != nil {
		return err
	}
	r.Grads, err = grad.New(grad.Options{Store: r.GradStore, Pool: r.Pool, Logger: log, SumSquares: r.train.checks, PieceElems: r.pieces.gradElems})
	if err != nil {
		return fmt.Errorf("zinf: gradient swapper: %w", err)
	}
	optOpts := p.optOpts
	optOpts.Logger = log
	optOpts.Store, optOpts.Pool, optOpts.Grads = r.OptimStore, r.Pool, r.Grads
	optOpts.Params = optimizer.SinkOf[param.Waiter](r.Params)
	r.Optimizer, err = optimizer.New(optOpts)
	if err != nil {
		return fmt.Errorf("zinf: optimizer swapper: %w", err)
	}
	for _, d := range r.model.descs {
		if err := r.Params.Register(d.Name, int(r.model.numel[d.Name]), p.tiers[d.Name]); err != nil {
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
func (r *Runtime) openScheduler(p *planned, opts Options) {
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
	layers := make([][]string, len(p.nvmeLayers))
	for l, names := range p.nvmeLayers {
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
		return buffers.SpanBytes(r.ParamStore.PaddedLen(int64(n*p.dtype.Size())), granule)
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
	// Plan tells what this runtime does, overrides included.
	r.placement = r.placement.Adjusted(max(depth, 0), depthWhy, r.overlap, "Options.SerialStep")
}

// checkDiskSpace refuses a runtime whose NVMe paths have less free space
// than its stores will take (diskNeeds with the open stores: their own
// alignment, less what their files already hold), naming each short path,
// the need and the free bytes.
func (r *Runtime) checkDiskSpace(p *planned) error {
	needs := diskNeeds(r.model, r.Rank, r.World, p.dtype, p.tiers, p.optOpts, p.pieces.gradElems, r.inference, r.ParamStore, r.GradStore, r.OptimStore)
	if err := swapper.CheckSpace(needs...); err != nil {
		return fmt.Errorf("zinf: rank %d: not enough free disk for the swap files (copy-on-write keeps %d copies of each NVMe tensor during a step; `zinf plan` shows the need per path): %w",
			r.Rank, swapper.CopyOnWriteVersions, err)
	}
	return nil
}

// openDevice opens the device the config selects: "sim", "cuda", or
// "auto" (CUDA when it works, else the simulated device, said once).
func openDevice(d deviceSettings, log *slog.Logger) (accel.Device, error) {
	switch d.kind {
	case config.DeviceCUDA:
		dev, err := cuda.Open(cuda.Options{CapacityBytes: d.cudaBytes})
		if err != nil {
			return nil, fmt.Errorf("zinf: zinf.device is \"cuda\": %w", err)
		}
		return dev, nil
	case config.DeviceAuto:
		dev, err := cuda.Open(cuda.Options{CapacityBytes: d.cudaBytes})
		if err == nil {
			return dev, nil
		}
		log.Info("zinf: no usable GPU; the GPU tier is simulated in host memory", "capacity", config.Size(d.simBytes).String(), "reason", err)
	}
	return accel.NewSim(accel.SimOptions{CapacityBytes: d.simBytes, Name: "sim"})
}
