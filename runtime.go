package zinf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
)

// Options adjust Open beyond the config.
type Options struct {
	// Logger receives warnings and progress. Default slog.Default().
	Logger *slog.Logger
	// Device overrides the device the config selects (several simulated
	// ranks may share one). The Runtime does not close a device it was
	// given.
	Device accel.Device
	// Engine overrides the I/O engine (shared by ranks, or with a fault
	// hook in tests). The Runtime does not close an engine it was given.
	Engine aio.Engine
	// Faults is passed to the engine Open builds (tests).
	Faults aio.FaultHook
	// Rank and WorldSize, when WorldSize > 0, override the config's.
	Rank, WorldSize int
}

// Runtime is one rank's zinf: pool, engine, stores, device and swappers.
// Its methods are safe for use by one training loop goroutine; the swappers
// underneath are safe for concurrent use.
type Runtime struct {
	Config    *config.Config
	Rank      int
	World     int
	DType     swapper.DType
	Pool      *buffers.Pool
	Engine    aio.Engine
	Device    accel.Device
	Params    *param.Swapper
	Grads     *grad.Swapper
	Optimizer *optimizer.Optimizer
	// Stores: nil where the config keeps that state in memory.
	ParamStore, GradStore, OptimStore *swapper.Store
	// DeviceIO moves bytes between files and device memory when the config
	// selects GPUDirect Storage (zinf.gds "auto"/"required", aio.use_gds):
	// cuFile, or the bounce path when "auto" falls back. Nil when zinf.gds
	// is "off". See gpu.go.
	DeviceIO             gds.DeviceIO
	deviceIOStagingBytes int64

	log        *slog.Logger
	ownEngine  bool
	ownDevice  bool
	mu         sync.Mutex
	params     []string
	numel      map[string]int
	stepCount  int
	stepWaitNs int64
	closed     bool
	txn        *optimizer.StepTxn // the step StepTensor opened, until Step

}

// Open builds a Runtime from cfg. The config is validated first; every
// problem is reported. Nothing is left behind on failure: whatever was
// built is closed again.
func Open(cfg *config.Config, opts Options) (rt *Runtime, err error) {
	if cfg == nil {
		return nil, errors.New("zinf: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	rank, world := cfg.RankWorld()
	if opts.WorldSize > 0 {
		rank, world = opts.Rank, opts.WorldSize
	}
	if rank < 0 || rank >= world {
		return nil, fmt.Errorf("zinf: rank %d is outside world size %d", rank, world)
	}
	dtype := ParamDType(cfg)
	r := &Runtime{Config: cfg, Rank: rank, World: world, DType: dtype, log: log, numel: map[string]int{}}
	defer func() {
		if err != nil {
			r.Close()
			rt = nil
		}
	}()
	z := cfg.Zinf
	r.Pool, err = buffers.NewPool(buffers.Options{CapacityBytes: int64(z.Tiers.CPUPinnedBytes), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("zinf: pinned pool (zinf.tiers.cpu_pinned_bytes = %s): %w", z.Tiers.CPUPinnedBytes, err)
	}
	if r.Engine = opts.Engine; r.Engine == nil {
		r.Engine, err = aio.New(EngineOptions(cfg, log, opts.Faults))
		if err != nil {
			return nil, fmt.Errorf("zinf: I/O engine: %w", err)
		}
		r.ownEngine = true
	}
	if r.Device = opts.Device; r.Device == nil {
		r.Device, err = openDevice(cfg, log)
		if err != nil {
			return nil, err
		}
		r.ownDevice = true
	}
	for _, reg := range r.Pool.Regions() {
		if err := r.Device.RegisterHost(reg); err != nil {
			log.Warn("zinf: could not register the pinned pool with the device; copies will be staged", "err", err)
			break
		}
	}
	if err := r.openDeviceIO(cfg, log); err != nil {
		return nil, err
	}
	zo := cfg.ZeroOptimization
	store := func(name string, paths []string) (*swapper.Store, error) {
		s, err := swapper.OpenStore(swapper.StoreOptions{Paths: paths, Engine: r.Engine, Name: fmt.Sprintf("%s-rank%d", name, rank),
			Checksums: z.Checksums, ReserveBytes: int64(z.SwapFileBytes), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("zinf: %s swap store: %w", name, err)
		}
		return s, nil
	}
	if zo.OffloadParam.Device == config.OffloadNVMe {
		if r.ParamStore, err = store("param", pathsFor(cfg, zo.OffloadParam.NVMePath)); err != nil {
			return nil, err
		}
	}
	if zo.OffloadOptimizer.Device == config.OffloadNVMe {
		paths := pathsFor(cfg, zo.OffloadOptimizer.NVMePath)
		if r.OptimStore, err = store("optim", paths); err != nil {
			return nil, err
		}
		if r.GradStore, err = store("grad", paths); err != nil {
			return nil, err
		}
	}
	r.Params, err = param.New(param.Options{Store: r.ParamStore, Pool: r.Pool, Device: r.Device, Rank: rank, WorldSize: world,
		DType: dtype, MaxInCPUBytes: zo.OffloadParam.MaxInCPU * int64(dtype.Size()), // max_in_cpu counts elements, as in DeepSpeed
		BufferCount: zo.OffloadParam.BufferCount, Logger: log,
		// With GDS selected (aio.use_gds / zinf.gds), NVMe partitions are
		// swapped into device memory through DeviceIO, as DeepSpeed does.
		DeviceIO: r.DeviceIO})
	if err != nil {
		return nil, fmt.Errorf("zinf: param swapper: %w", err)
	}
	r.Grads, err = grad.New(grad.Options{Store: r.GradStore, Pool: r.Pool, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("zinf: gradient swapper: %w", err)
	}
	r.Optimizer, err = optimizer.New(optimizer.Options{Store: r.OptimStore, Pool: r.Pool, Params: optimizer.SinkOf[param.Waiter](r.Params), Grads: r.Grads,
		SubGroupSize: int(min(zo.SubGroupSize, 1<<30)), PipelineDepth: z.PipelineDepth, BufferCount: zo.OffloadOptimizer.BufferCount,
		Hyper: Hyper(cfg), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("zinf: optimizer swapper: %w", err)
	}
	return r, nil
}

// EngineOptions maps the config's aio section and zinf's I/O keys to engine
// options.
func EngineOptions(cfg *config.Config, log *slog.Logger, faults aio.FaultHook) aio.Options {
	a := cfg.AIO
	d, _ := aio.ParseDirectPolicy(string(cfg.Zinf.Direct))
	return aio.Options{Backend: string(cfg.Zinf.Backend), BlockSizeBytes: int(a.BlockSize), QueueDepth: a.QueueDepth,
		IntraOpParallelism: a.IntraOpParallelism, SingleSubmit: a.SingleSubmit, SerialEvents: !a.OverlapEvents,
		Direct: d, Logger: log, Faults: faults}
}

// Hyper maps the config's optimizer section to Adam hyperparameters.
func Hyper(cfg *config.Config) optimizer.Hyper {
	o := cfg.Optimizer
	return optimizer.Hyper{LR: float32(o.LR), Beta1: float32(o.Betas[0]), Beta2: float32(o.Betas[1]), Eps: float32(o.Eps),
		WeightDecay: float32(o.WeightDecay), AdamW: o.DecoupledWeightDecay()}
}

func pathsFor(cfg *config.Config, fallback string) []string {
	if len(cfg.Zinf.NVMePaths) > 0 {
		return cfg.Zinf.NVMePaths
	}
	return []string{fallback}
}

// openDevice opens the device the config selects: "sim", "cuda", or
// "auto" (CUDA when it works, else the simulated device, said once).
func openDevice(cfg *config.Config, log *slog.Logger) (accel.Device, error) {
	gpu := cfg.GPUBytes(0)
	switch cfg.Zinf.Device {
	case config.DeviceCUDA:
		d, err := cuda.Open(cuda.Options{CapacityBytes: int64(cfg.Zinf.Tiers.GPUBytes)})
		if err != nil {
			return nil, fmt.Errorf("zinf: zinf.device is \"cuda\": %w", err)
		}
		return d, nil
	case config.DeviceAuto:
		d, err := cuda.Open(cuda.Options{CapacityBytes: int64(cfg.Zinf.Tiers.GPUBytes)})
		if err == nil {
			return d, nil
		}
		log.Info("zinf: no usable GPU; the GPU tier is simulated in host memory", "capacity", config.Size(gpu).String(), "reason", err)
	}
	return accel.NewSim(accel.SimOptions{CapacityBytes: gpu, Name: "sim"})
}

// RegisterParam registers a parameter of numel elements (the full tensor)
// on tier, with its initial fp32 master values (the full tensor; this rank
// keeps its partition): the param swapper stores the partition in the param
// dtype, the optimizer keeps the fp32 master and Adam states, and the
// gradient swapper gets a slot.
func (r *Runtime) RegisterParam(ctx context.Context, name string, tier swapper.Tier, master []float32) error {
	if err := r.Params.Register(name, len(master), tier); err != nil {
		return err
	}
	lo, hi := param.Partition(len(master), r.Rank, r.World)
	part := master[lo:hi]
	if err := r.Params.Init(ctx, name, part); err != nil {
		return err
	}
	if err := r.Grads.Register(name, hi-lo); err != nil {
		return err
	}
	if err := r.Optimizer.Register(name, part); err != nil {
		return err
	}
	r.mu.Lock()
	r.params = append(r.params, name)
	r.numel[name] = len(master)
	r.mu.Unlock()
	return nil
}

// Partition returns this rank's element range of a registered parameter.
func (r *Runtime) Partition(name string) (lo, hi int) {
	r.mu.Lock()
	n := r.numel[name]
	r.mu.Unlock()
	return param.Partition(n, r.Rank, r.World)
}

// StepTensor hands a parameter whose gradient is final (its last
// micro-step's Accumulate is done) to the optimizer now, so its update runs
// in the background while the loop computes the rest of the backward pass.
// The first call opens the step; Step commits it. Results are identical to
// a plain Step: Adam works per element, and nothing is visible before the
// commit. An error here is also returned by Step, which discards the step.
func (r *Runtime) StepTensor(ctx context.Context, name string) error {
	if r.txn == nil {
		txn, err := r.Optimizer.BeginStep(ctx)
		if err != nil {
			return err
		}
		r.txn = txn
	}
	return r.txn.Tensor(name)
}

// Step runs the optimizer: waits for every gradient write-behind, updates
// every sub-group not yet handed over with StepTensor (reading ahead,
// writing behind), commits the new params, and clears gradients. It is all
// or nothing: on error (a full disk, an I/O error, a checksum mismatch)
// nothing changed — params, states and accumulated gradients are as
// before — and Step may be called again.
func (r *Runtime) Step(ctx context.Context) error {
	t0 := time.Now()
	txn := r.txn
	r.txn = nil
	if err := r.Grads.Flush(ctx); err != nil {
		if txn != nil {
			txn.Abort()
		}
		return fmt.Errorf("zinf: gradient write-behind: %w", err)
	}
	var err error
	if txn != nil {
		err = txn.Commit(ctx)
	} else {
		err = r.Optimizer.Step(ctx)
	}
	if err != nil {
		return err
	}
	r.Grads.Zero()
	r.mu.Lock()
	r.stepCount++
	r.stepWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	return nil
}

// Metrics is a snapshot of the runtime's counters.
type Metrics struct {
	Steps            int
	BytesRead        int64 // from NVMe, all stores
	BytesWritten     int64 // to NVMe, all stores
	ReadOps          int64
	WriteOps         int64
	PinnedBytes      int64 // the pool's capacity
	PinnedInUseBytes int64
	PinnedPeakBytes  int64
	Pinned           bool // locked in RAM
	DeviceUsedBytes  int64
	Engine           aio.Stats
	Params           param.Stats
	Optimizer        optimizer.Stats
	Grads            grad.Stats
}

// Metrics returns the counters.
func (r *Runtime) Metrics() Metrics {
	st := r.Pool.Stats()
	m := Metrics{Steps: r.stepCount, PinnedBytes: st.CapacityBytes, PinnedInUseBytes: st.InUseBytes, PinnedPeakBytes: st.PeakInUseBytes, Pinned: st.Pinned,
		Engine: r.Engine.Stats(), Params: r.Params.Stats(), Optimizer: r.Optimizer.Stats(), Grads: r.Grads.Stats()}
	for _, s := range []*swapper.Store{r.ParamStore, r.GradStore, r.OptimStore} {
		if s != nil {
			ss := s.Stats()
			m.BytesRead += ss.BytesRead
			m.BytesWritten += ss.BytesWritten
			m.ReadOps += ss.Reads
			m.WriteOps += ss.Writes
		}
	}
	if r.Device != nil {
		m.DeviceUsedBytes = r.Device.UsedBytes()
	}
	return m
}

// Close drains in-flight I/O, closes the swappers, removes the scratch swap
// files, frees pinned memory and closes what Open built. It is idempotent
// and returns every error met.
func (r *Runtime) Close() error {
	if r == nil || r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	add := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	if r.txn != nil {
		r.txn.Abort()
		r.txn = nil
	}
	if r.Optimizer != nil {
		add("optimizer", r.Optimizer.Close())
	}
	if r.Grads != nil {
		add("grads", r.Grads.Close())
	}
	if r.Params != nil {
		add("params", r.Params.Close())
	}
	for _, s := range []*swapper.Store{r.ParamStore, r.GradStore, r.OptimStore} {
		if s != nil {
			add("store", s.Close())
		}
	}
	add("device I/O", r.closeDeviceIO())
	if r.ownEngine && r.Engine != nil {
		add("engine", r.Engine.Close())
	}
	if r.Device != nil && r.Pool != nil {
		for _, reg := range r.Pool.Regions() {
			r.Device.UnregisterHost(reg)
		}
	}
	if r.ownDevice && r.Device != nil {
		add("device", r.Device.Close())
	}
	if r.Pool != nil {
		add("pool", r.Pool.Close())
	}
	if len(errs) > 0 {
		return fmt.Errorf("zinf: close: %w", errors.Join(errs...))
	}
	return nil
}

// ParamDType is the parameter dtype a config asks for: bf16 or fp16 when
// enabled, else fp32.
func ParamDType(cfg *config.Config) swapper.DType {
	switch {
	case cfg.BF16:
		return swapper.BFloat16
	case cfg.FP16:
		return swapper.Float16
	}
	return swapper.Float32
}
