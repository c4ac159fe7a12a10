package zinf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
	"github.com/zinfio/zinf/trace"
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
	// PinnedStallTimeout, when > 0, overrides zinf.pinned_stall_timeout:
	// how long a wait for pinned memory may see no release in its region
	// before it fails with buffers.ErrStalled, naming what the pool holds.
	// A wait that can never be served (buffers.ErrDeadlock) is reported
	// at once whatever it says.
	PinnedStallTimeout time.Duration
	// ComputePerLayer is the loop's compute time per layer and pass, in
	// seconds, when known: the planner sizes the prefetch depth from it
	// and predicts the step time. Default 0: one layer ahead.
	ComputePerLayer float64
	// NoBandwidthProbe never probes an NVMe path's bandwidth at Open,
	// whatever zinf.bandwidth.probe says: the plan uses the configured,
	// tune-file or cached figures, or the defaults (see NVMeBandwidth).
	NoBandwidthProbe bool
	// Bandwidth, when set, is the NVMe bandwidth to plan with, as it is
	// (several ranks of one process may share one NVMeBandwidth call).
	Bandwidth *Bandwidth
	// PrefetchDepth, when > 0, overrides the planned prefetch depth
	// (layers fetched ahead of use), within the prefetch window the pool
	// leaves (Reservations.PrefetchBytes; none at the minimum pool, and
	// then nothing is prefetched); -1 turns prefetching off.
	PrefetchDepth int
	// SerialStep runs the whole optimizer step in Step, even when the
	// plan lets StepTensor overlap it with backward.
	SerialStep bool
	// Inference opens the runtime for forward passes only: Init stores
	// the parameters and nothing else (no optimizer states, no gradient
	// slots, no pinned memory for them); AccumulateGrad, StepTensor and
	// Step are refused.
	Inference bool
	// Comm is this rank's handle on the world of ranks (comm.NewMPI when
	// the ranks are processes, comm.NewLocal when they are goroutines of
	// one process); it must be rank Rank of a world of WorldSize. It
	// carries the step's global quantities — with gradient_clipping or
	// fp16 on, Step reduces the gradients' sum of squares (norm and
	// overflow) over the ranks through it, so it is required then at
	// world size > 1 (Open refuses without it) — and ReduceGrad's
	// reduce-scatters and the gathers of GatherLayers. The runtime runs
	// its collectives, in the order the loop asks for them, on a
	// goroutine of its own (Collective queues a loop's own). The Runtime
	// does not close it.
	Comm comm.Comm
	// GatherLayers makes the ranks' partitions whole for the loop:
	// BeginLayer all-gathers the layer's full parameters through Comm
	// (and starts gathering the next layer of the pass, overlapping the
	// loop's compute), ReadParam and ReadParamBytes give full tensors,
	// EndLayer frees them. BeginLayer is then a collective: every rank
	// begins and ends the same layers in the same order. The full
	// parameters of two layers (the largest) take a reservation of the
	// pinned pool (Reservations.GatherBytes). Needs Comm.
	GatherLayers bool
	// TotalSteps is the number of optimizer steps the run takes, for a
	// "scheduler" whose total_num_steps is "auto" (as the Hugging Face
	// integration writes it); Open refuses such a config without it.
	// Default 0: unknown.
	TotalSteps int
	// PieceBytes is the size of the pieces big tensors move in. A
	// parameter partition on NVMe larger than it is streamed: never
	// swapped in whole (BeginLayer does not wait for it, prefetching
	// passes it by), its reads — ReadParam, ReadParamBytes, and only the
	// rows or range asked for with ReadParamRows, ReadParamRange — go to
	// NVMe one piece at a time, and its updates are written piece by
	// piece; a gradient longer than a piece of fp32 is kept and written in
	// pieces; the optimizer's sub-group is at most a piece of gradient.
	// So a tensor's pinned need is a few pieces, not its size (the
	// minimum pool grows with the pieces in flight, not the largest
	// tensor). Rounded up to the swap store's stripe; default 0:
	// zinf.piece_bytes, else DefaultPieceBytes (4 MiB); -1: every tensor
	// moves whole.
	PieceBytes int64
	// Trace, when set, receives the runtime's timeline: each layer's
	// compute and the loop's waits, every swap store read and write, each
	// optimizer step with its sub-groups' read, update and write, each
	// rollback (see package trace; trace.ChromeWriter writes a file
	// Perfetto opens). Default nil: tracing off, at the cost of a nil
	// check.
	Trace trace.Sink
}

// Runtime is one rank's zinf: it owns the placement, the prefetch
// schedule and every pinned-memory decision for a Model, and speaks in
// layers and steps (see BeginLayer, ReadParam, AccumulateGrad, StepTensor,
// Step). Its loop methods are for one training-loop goroutine; Metrics
// and Plan are safe from any goroutine.
//
// The exported fields are the layer below, for tools and tests: the pool,
// engine, device, stores and the three swappers. A training loop needs
// none of them.
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
	sched      *policy.Scheduler
	overlap    bool // StepTensor starts updates during backward
	// overlapUpdate: Step returns before the update is committed
	// (zinf.overlap_update); bg is that step until reaped and bgErr its
	// failure until Step retries it (overlap.go; loop goroutine).
	overlapUpdate bool
	bg            *bgStep
	bgErr         error
	held          *heldLayer   // the layer-major visit holding gradients (loop goroutine)
	begun         map[int]bool // layers begun and not ended, without GatherLayers (loop goroutine)
	visit         layerVisit   // the layer begun, for the compute measurement (loop goroutine)
	inference     bool
	trace         tracer

	mu         sync.Mutex // guards the fields below; Metrics reads them
	params     []string
	numel      map[string]int
	inited     map[string]bool
	stepCount  int
	stepWaitNs int64
	ioWaitNs   int64
	// updateWaitNs is the time the loop waited for a background update
	// to publish a layer's parameters (zinf.overlap_update).
	updateWaitNs int64
	// computeNs and computeUnits measure the loop's compute per layer
	// visit (see Metrics.Compute).
	computeNs    int64
	computeUnits int64
	closed       bool
	txn          *optimizer.StepTxn // the step StepTensor opened, until Step
	last         StepInfo
	trainStats   TrainStats

	train     training // schedule, loss scaling, clipping, speculation (loop goroutine)
	commStats CommStats

	// Ranks as processes (dist.go); loop goroutine unless said.
	comm          comm.Comm
	cw            *commWorker
	gatherOn      bool
	gather        layerGathers
	bgCtx         context.Context // the gathers ahead; ends at Close
	bgCancel      context.CancelFunc
	ones          []int
	reduceScratch []float32
	reducePending *pendingReduce
}

// Open builds a Runtime for model from cfg: it checks both (plan.Check:
// every problem is reported), measures what the plan depends on (the
// memory the pinned pool may take; the engine and swap stores, whose
// geometry the plan sizes with; each NVMe path's bandwidth), plans
// placement and prefetch, the pinned pool by reservation and the disk
// (plan.Make), and builds the pool, device, swappers and scheduler from
// the plan alone — refusing, with a *PoolTooSmallError naming the minimum
// and the key to change, a pool that cannot work, and an NVMe path short
// of free space. Every tensor must then get its initial values with Init.
// Nothing is left behind on failure: whatever was built is closed again.
func Open(cfg *config.Config, model Model, opts Options) (rt *Runtime, err error) {
	in, err := plan.Check(cfg, model, plan.Given{Logger: opts.Logger, Rank: opts.Rank, WorldSize: opts.WorldSize, Faults: opts.Faults, TotalSteps: opts.TotalSteps, PieceBytes: opts.PieceBytes})
	if err != nil {
		return nil, err
	}
	// Whatever is built from here on is closed again on failure.
	r := &Runtime{numel: map[string]int{}, inited: map[string]bool{}}
	defer func() {
		if err != nil {
			r.Close()
			rt = nil
		}
	}()
	r.Config, r.Rank, r.World, r.DType, r.log, r.model, r.inference = cfg, in.Rank, in.World, in.Settings.DType, in.Log, in.Model, opts.Inference
	// Measure what the plan depends on (memory, the stores' geometry, the
	// NVMe bandwidth), plan, and build from the plan.
	m, pending, err := r.measure(&in.Settings, opts)
	if err != nil {
		return nil, err
	}
	p, err := plan.Make(in, m, plan.Options{ComputePerLayer: opts.ComputePerLayer, Inference: opts.Inference,
		Gather: opts.GatherLayers && opts.Comm != nil, PieceBytes: opts.PieceBytes})
	if err != nil {
		return nil, err
	}
	if err := r.build(p, opts); err != nil {
		return nil, err
	}
	// The run goes ahead: cache what the probe measured (not before, so
	// that a refused config leaves nothing in the NVMe paths).
	storeProbes(pending, in.Log)
	return r, nil
}

// Plan returns the placement Open chose: each tensor's tier, the prefetch
// depth, the predicted step.
func (r *Runtime) Plan() *policy.Placement { return r.placement }

// Reservations returns how the pinned pool is split.
func (r *Runtime) Reservations() Reservations { return r.res }

// Bandwidth returns the NVMe bandwidth the plan used, per path with its
// source (Plan().Tiers has the sums).
func (r *Runtime) Bandwidth() Bandwidth {
	return Bandwidth{Paths: append([]PathBandwidth(nil), r.bandwidth.Paths...)}
}

// DiskNeeds returns the free space the plan counts on each NVMe path for
// this rank's swap stores, copy-on-write copies included (see
// ModelPlan.Disk); Open checked it.
func (r *Runtime) DiskNeeds() []swapper.SpaceNeed { return append([]swapper.SpaceNeed(nil), r.disk...) }

// Init sets a tensor's initial values: values is the FULL tensor in fp32
// (this rank keeps its partition). The parameter is stored in the param
// dtype on its planned tier, the optimizer keeps the fp32 master and zeroed
// Adam states, and the gradient swapper gets a slot. It is all or nothing:
// on error (a full disk, say) nothing of the tensor remains and Init may be
// called again. Every tensor of the model must be initialized before its
// layer is begun or a step is taken.
func (r *Runtime) Init(ctx context.Context, name string, values []float32) error {
	if err := r.closedErr("init "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.settled(ctx); err != nil {
		return err
	}
	numel, ok := r.model.Numel[name]
	if !ok {
		return fmt.Errorf("zinf: init %q: not a tensor of the model", name)
	}
	if int64(len(values)) != numel {
		return fmt.Errorf("zinf: init %q: %d values for a tensor of %d elements", name, len(values), numel)
	}
	r.mu.Lock()
	done := r.inited[name]
	r.mu.Unlock()
	if done {
		return fmt.Errorf("zinf: init %q: already initialized", name)
	}
	lo, hi := partition(len(values), r.Rank, r.World)
	part := values[lo:hi]
	if err := r.Params.Init(ctx, name, part); err != nil {
		return fmt.Errorf("zinf: init %q: %w", name, err)
	}
	if r.inference {
		r.mu.Lock()
		r.inited[name] = true
		r.params = append(r.params, name)
		r.numel[name] = len(values)
		r.mu.Unlock()
		return nil
	}
	// The optimizer writes the initial states (it may fail, e.g. a full
	// disk, and then keeps nothing of the tensor); the gradient slot only
	// checks sizes the reservations already cover, so it goes last.
	if err := r.Optimizer.Register(name, part); err != nil {
		// All or nothing: the parameter was stored; forget it again.
		if uerr := r.forgetParam(name); uerr != nil {
			return fmt.Errorf("zinf: init %q: %w (and undoing the parameter's init: %v)", name, err, uerr)
		}
		return fmt.Errorf("zinf: init %q: %w", name, err)
	}
	if err := r.Grads.Register(name, hi-lo); err != nil {
		return fmt.Errorf("zinf: init %q: %w", name, err)
	}
	r.mu.Lock()
	r.inited[name] = true
	r.params = append(r.params, name)
	r.numel[name] = len(values)
	r.mu.Unlock()
	return nil
}

// forgetParam undoes a parameter's Init: its stored partition is freed and
// it is registered again, without values.
func (r *Runtime) forgetParam(name string) error {
	if err := r.Params.Unregister(name); err != nil {
		return err
	}
	return r.Params.Register(name, int(r.model.Numel[name]), r.tiers[name])
}

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

// Forward announces a forward pass (layers 0, 1, ...), so that prefetching
// follows it. Prefetching stops at the last layer: what comes next (a
// backward pass) is not known.
func (r *Runtime) Forward() {
	r.trace.setPass("forward")
	r.startPass(r.forwardOrder(), false)
}

// ForwardRepeating announces a forward pass that the next pass repeats:
// a decoding step of token generation, or a batch of evaluation, followed
// by another. Prefetching then runs on past the pass's last layer into
// the next pass's first ones (within the same prefetch depth and window,
// after every layer of this pass), so the disk keeps reading while the
// last layers compute and the next pass does not start on a demand miss.
// The next pass announced keeps them (Forward or ForwardRepeating), or
// releases them (Backward, Pass with another order). The last pass of a
// loop prefetches layers that are never used: ReleasePrefetched (or
// Close) gives them back. With Options.GatherLayers, the pass's last
// layer gathers the next pass's first ahead, as each layer gathers the
// next one of its pass. A training step, whose Forward is followed by
// Backward, calls Forward.
func (r *Runtime) ForwardRepeating() {
	r.trace.setPass("forward")
	r.startPass(r.forwardOrder(), true)
}

// ReleasePrefetched gives back the pinned memory of every layer
// prefetched and not yet begun, cancelling their reads in flight: for a
// loop of ForwardRepeating passes that has ended (the next pass would
// start on a demand miss again), and with Options.GatherLayers the
// layer gathered ahead. Layers begun stay until EndLayer.
func (r *Runtime) ReleasePrefetched() {
	if r.gatherOn {
		r.dropAhead(-1) // a gather ahead of the next pass's first layer
	}
	r.sched.ReleasePrefetched()
}

func (r *Runtime) forwardOrder() []int {
	order := make([]int, len(r.model.Layers))
	for l := range order {
		order[l] = l
	}
	return order
}

// startPass tells the scheduler (and, with GatherLayers, the gathers)
// the order of the next pass; repeat: the pass after it is the same.
func (r *Runtime) startPass(order []int, repeat bool) {
	if r.gatherOn {
		r.gatherPass(order, repeat)
	}
	if repeat {
		r.sched.StartRepeatingPass(order)
	} else {
		r.sched.StartPass(order)
	}
}

// Backward announces a backward pass (the last layer first).
func (r *Runtime) Backward() {
	L := len(r.model.Layers)
	order := make([]int, L)
	for l := range order {
		order[l] = L - 1 - l
	}
	r.trace.setPass("backward")
	r.startPass(order, false)
}

// Pass announces a pass visiting layers in order (for loops that are
// neither plain forward nor backward).
func (r *Runtime) Pass(order []int) {
	r.trace.setPassOrder(order)
	r.startPass(order, false)
}

// BeginLayer makes layer l's parameters readable: a barrier that waits for
// their swap-in (a demand miss jumps the queue) and prefetches the layers
// that follow in the pass within the prefetch window. Pair it with
// EndLayer. With Options.GatherLayers it also all-gathers the layer's
// full parameters from every rank's partitions (waiting for the gather
// started during the previous layer, if any) and starts gathering the
// next layer of the pass: a collective, called by every rank alike.
func (r *Runtime) BeginLayer(ctx context.Context, l int) error {
	if err := r.closedErr("begin layer "+strconv.Itoa(l), param.ErrClosed); err != nil {
		return err
	}
	if l < 0 || l >= len(r.model.Layers) {
		return fmt.Errorf("zinf: begin layer %d: the model has layers 0..%d", l, len(r.model.Layers)-1)
	}
	for _, n := range r.model.Layers[l] {
		r.mu.Lock()
		ok := r.inited[n]
		r.mu.Unlock()
		if !ok {
			return fmt.Errorf("zinf: begin layer %d: tensor %q has no initial values (call Init)", l, n)
		}
	}
	// With zinf.overlap_update the last step may still be updating: the
	// layer's own parameters are what this waits for.
	if err := r.waitTensors(ctx, r.model.Layers[l]...); err != nil {
		return err
	}
	if r.gatherOn {
		t0 := time.Now()
		err := r.beginGathered(ctx, l)
		r.trace.layerBegun(l, t0, err)
		if err == nil {
			r.beginVisit(l, 1)
		}
		return err
	}
	t0 := time.Now()
	err := r.sched.Begin(ctx, l)
	r.mu.Lock()
	r.ioWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	r.trace.layerBegun(l, t0, err)
	if err != nil {
		if errors.Is(err, buffers.ErrStalled) {
			if held := r.begunExcept(l); held != "" {
				// The likeliest cause: the loop holds them itself.
				return fmt.Errorf("zinf: begin layer %d: %w (%s begun and not ended: their parameters stay in pinned memory until EndLayer)", l, err, held)
			}
		}
		return fmt.Errorf("zinf: begin layer %d: %w", l, err)
	}
	if r.begun == nil {
		r.begun = map[int]bool{}
	}
	r.begun[l] = true
	r.beginVisit(l, 1)
	return nil
}

// begunExcept names the layers begun and not ended, but l ("layers 0,
// 1"), or "" when there are none.
func (r *Runtime) begunExcept(l int) string {
	var ls []int
	for b := range r.begun {
		if b != l {
			ls = append(ls, b)
		}
	}
	if len(ls) == 0 {
		return ""
	}
	slices.Sort(ls)
	s := make([]string, len(ls))
	for i, b := range ls {
		s[i] = strconv.Itoa(b)
	}
	if len(ls) == 1 {
		return "layer " + s[0] + " is"
	}
	return "layers " + strings.Join(s, ", ") + " are"
}

// EndLayer releases layer l's parameters (no write-back: parameters are
// read-only between steps).
func (r *Runtime) EndLayer(l int) {
	if l < 0 || l >= len(r.model.Layers) {
		return
	}
	r.trace.layerEnded(l)
	r.endVisit(l)
	r.endHeld(l)
	delete(r.begun, l)
	if r.gatherOn {
		r.endGathered(l)
		return
	}
	r.sched.End(l)
}

// ReadParam writes this rank's partition of a parameter, widened to fp32,
// into dst[lo:hi] (see Partition); dst is the full tensor's length, so the
// loop of every rank in one process can share it. The parameter's layer
// must be begun. With Options.GatherLayers it writes the full tensor,
// gathered from every rank, into dst.
func (r *Runtime) ReadParam(ctx context.Context, name string, dst []float32) (err error) {
	if err := r.closedErr("read "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return err
	}
	defer r.checkRead(ctx, &err)
	lo, hi, err := r.fullRange("read", name, len(dst))
	if err != nil {
		return err
	}
	if r.gatherOn {
		return r.readGathered(name, 0, nil, dst)
	}
	return r.Params.ReadFloat32(ctx, name, dst[lo:hi])
}

// ReadParamBytes writes this rank's partition of a parameter, encoded in
// dtype (little-endian), into dst[lo*size:hi*size]: the stored bytes as
// they are when dtype is the param dtype, converted element by element
// otherwise (no Go heap buffer either way, so a framework can swap a
// parameter straight into its own tensor). dst holds the full tensor in
// dtype. With Options.GatherLayers it writes the full tensor.
func (r *Runtime) ReadParamBytes(ctx context.Context, name string, dtype tensor.DType, dst []byte) (err error) {
	if err := r.closedErr("read "+strconv.Quote(name), param.ErrClosed); err != nil {
		return err
	}
	if err := r.waitTensors(ctx, name); err != nil {
		return err
	}
	defer r.checkRead(ctx, &err)
	if !dtype.Valid() {
		return fmt.Errorf("zinf: read %q: unknown dtype %d", name, dtype)
	}
	sz := dtype.Size()
	if len(dst)%sz != 0 {
		return fmt.Errorf("zinf: read %q: %d bytes is not a whole number of %s elements", name, len(dst), dtype)
	}
	lo, hi, err := r.fullRange("read", name, len(dst)/sz)
	if err != nil {
		return err
	}
	if r.gatherOn {
		return r.readGathered(name, dtype, dst, nil)
	}
	return r.Params.ReadAs(ctx, name, dtype, dst[lo*sz:hi*sz])
}

// fullRange checks that n is the named tensor's full length and returns
// this rank's range.
func (r *Runtime) fullRange(op, name string, n int) (lo, hi int, err error) {
	numel, ok := r.model.Numel[name]
	if !ok {
		return 0, 0, fmt.Errorf("zinf: %s %q: not a tensor of the model", op, name)
	}
	if int64(n) != numel {
		return 0, 0, fmt.Errorf("zinf: %s %q: buffer of %d elements for a tensor of %d (pass the full tensor; this rank uses its partition)", op, name, n, numel)
	}
	lo, hi = partition(int(numel), r.Rank, r.World)
	return lo, hi, nil
}

// AccumulateGrad adds a micro-step's gradient of a parameter (the full
// tensor, already reduced over ranks; this rank keeps its partition). It
// is written behind: the call returns once the values are copied. A
// failed call adds nothing and may be retried. (A gradient kept in pieces,
// see Options.PieceBytes, may fail after some pieces were added: its
// retry — the same call, with the same values — adds only the others.
// Retry the call, or give the step up with AbortStep, before handing the
// tensor another gradient.)
func (r *Runtime) AccumulateGrad(ctx context.Context, name string, g []float32) error {
	if err := r.closedErr("accumulate "+strconv.Quote(name), grad.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if r.inference {
		return errInference
	}
	lo, hi, err := r.fullRange("accumulate", name, len(g))
	if err != nil {
		return err
	}
	t0 := time.Now()
	err = r.accumulate(ctx, name, g[lo:hi])
	if err == nil {
		r.train.pending = nil // the gradients changed: a step retried after this checks them again
	}
	r.mu.Lock()
	r.ioWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	r.trace.gradWait(name, t0, err)
	return err
}

// StepTensor hands a parameter whose gradient is final (its last
// micro-step's AccumulateGrad is done) to the optimizer now, so its update
// runs in the background while the loop computes the rest of the backward
// pass — when the plan found room for both working sets (Plan().OverlapStep);
// otherwise the update waits for Step. Results are identical to a plain
// Step: Adam works per element, and nothing is visible before the commit.
// An error here is also returned by Step, which discards the step.
func (r *Runtime) StepTensor(ctx context.Context, name string) error {
	if err := r.closedErr("step tensor "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if r.inference {
		return errInference
	}
	if !r.overlap {
		if _, ok := r.model.Numel[name]; !ok {
			return fmt.Errorf("zinf: step tensor %q: not a tensor of the model", name)
		}
		return nil
	}
	if r.txn == nil {
		if !r.speculate() {
			// The step waits for the norm and overflow (zinf.speculate).
			if _, ok := r.model.Numel[name]; !ok {
				return fmt.Errorf("zinf: step tensor %q: not a tensor of the model", name)
			}
			return nil
		}
		txn, err := r.beginStep(ctx)
		if err != nil {
			return err
		}
		r.txn = txn
	}
	return r.txn.Tensor(name)
}

// StepLayer is StepTensor for every tensor of layer l.
func (r *Runtime) StepLayer(ctx context.Context, l int) error {
	if err := r.closedErr("step layer "+strconv.Itoa(l), optimizer.ErrClosed); err != nil {
		return err
	}
	var first error
	for _, n := range r.LayerTensors(l) {
		if err := r.StepTensor(ctx, n); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// AbortStep gives up the optimizer step in progress: updates StepTensor
// started are abandoned (waiting for their I/O), every gradient
// accumulated since the last Step, of every micro-step, is dropped, and so
// is a gradient check kept for a retry of Step. Parameters, optimizer
// states, the step count, the loss scale and the schedule stay as the last
// Step left them, so a loop whose backward pass failed half-way (a full
// disk under AccumulateGrad, say) calls AbortStep and runs the step again
// from its first micro-step, with the same result as if nothing had
// failed. In a data-parallel job every rank gives the step up.
func (r *Runtime) AbortStep() {
	if r.inference {
		return
	}
	// A step updating in the background is the last Step's, not this
	// one's: it lands; one that failed is given up with this step.
	_ = r.settle(context.Background())
	r.bgErr = nil
	if r.txn != nil {
		r.txn.Abort()
		r.txn = nil
	}
	r.train.pending = nil
	r.train.txnCheck = false
	r.held = nil
	r.Grads.Zero()
}

// Metrics is a snapshot of the runtime's counters.
type Metrics struct {
	Steps int
	// IOWait is the time the loop spent blocked in BeginLayer and
	// AccumulateGrad (waiting for swap-ins or write-behind).
	IOWait time.Duration
	// UpdateWait is the time BeginLayer and the parameter reads waited
	// for the last step's update to publish a layer's parameters, with
	// zinf.overlap_update (the part of the update the next forward did
	// not hide).
	UpdateWait time.Duration
	// Reservations is how the pinned pool is split.
	Reservations Reservations
	// Schedule counts the prefetch scheduler's work (demand misses,
	// prefetches).
	Schedule     policy.SchedStats
	BytesRead    int64 // from NVMe, all stores (logical tensor bytes)
	BytesWritten int64 // to NVMe, all stores (logical tensor bytes)
	// DeviceBytesRead and DeviceBytesWritten are what the stores'
	// requests moved on the devices: BytesRead and BytesWritten padded to
	// the alignment, ranged reads widened to whole checksum units — the
	// figure a device's own counters (/sys/block/*/stat) see of zinf.
	DeviceBytesRead, DeviceBytesWritten int64
	ReadOps                             int64
	WriteOps                            int64
	PinnedBytes                         int64 // the pool's capacity
	PinnedInUseBytes                    int64
	PinnedPeakBytes                     int64
	Pinned                              bool // locked in RAM
	DeviceUsedBytes                     int64
	Engine                              aio.Stats
	Params                              param.Stats
	Optimizer                           optimizer.Stats
	Grads                               grad.Stats
	// Train counts applied, skipped and clipped steps, speculation commits
	// and rollbacks, and the current loss scale.
	Train TrainStats
	// Comm counts the collectives through Options.Comm.
	Comm CommStats
	// Compute is the loop's time between BeginLayer and EndLayer, less
	// the time it waited in the runtime meanwhile (AccumulateGrad's
	// hand-offs): the compute the planner predicts with (see
	// Runtime.MeasuredComputePerLayer). ComputeUnits counts the layer
	// visits it covers, each weighted by its micro-batches.
	Compute      time.Duration
	ComputeUnits int64
}

// Metrics returns the counters.
func (r *Runtime) Metrics() Metrics {
	st := r.Pool.Stats()
	r.mu.Lock()
	steps, ioWait := r.stepCount, time.Duration(r.ioWaitNs)
	updateWait := time.Duration(r.updateWaitNs)
	compute, units := time.Duration(r.computeNs), r.computeUnits
	train := r.trainStats
	cs := r.commStats
	r.mu.Unlock()
	m := Metrics{Steps: steps, IOWait: ioWait, Reservations: r.res, Schedule: r.sched.Stats(), PinnedBytes: st.CapacityBytes, PinnedInUseBytes: st.InUseBytes, PinnedPeakBytes: st.PeakInUseBytes, Pinned: st.Pinned,
		Engine: r.Engine.Stats(), Params: r.Params.Stats(), Optimizer: r.Optimizer.Stats(), Grads: r.Grads.Stats(), Train: train, Comm: cs,
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
	if r.Device != nil {
		m.DeviceUsedBytes = r.Device.UsedBytes()
	}
	return m
}

// Close drains in-flight I/O, closes the swappers, removes the scratch swap
// files, frees pinned memory and closes what Open built. It is idempotent
// and returns every error met.
func (r *Runtime) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	closed := r.closed
	r.closed = true
	r.mu.Unlock()
	if closed {
		return nil
	}
	var errs []error
	add := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	// Gathers in flight end first: they read partitions and write pinned
	// memory.
	r.closeDist()
	if r.txn != nil {
		r.txn.Abort()
		r.txn = nil
	}
	if r.sched != nil {
		// Layers prefetched for a pass that never came (ForwardRepeating's
		// last pass) and layers left begun go back before the swapper
		// closes (and before a step's update below waits for the pool).
		r.sched.Reset()
	}
	if bg := r.bg; bg != nil {
		// Step returned: the step is the loop's, so it lands (its commit
		// always ends: its I/O returns, and a pool that gives nothing back
		// fails it after zinf.pinned_stall_timeout).
		if err := bg.txn.Wait(context.Background()); err != nil {
			add(fmt.Sprintf("step %d's update, which ran on after Step returned", bg.step()), err)
		}
		r.bg = nil
	}
	if r.bgCancel != nil {
		r.bgCancel()
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

// ReadOptimizerStates returns this rank's partition of a tensor's fp32
// master weights and of its optimizer states (optimizer.Hyper.StateNames
// order: Adam exp_avg, exp_avg_sq; SGD with momentum momentum_buffer;
// Adagrad sum; Lion exp_avg), as of the last committed step.
func (r *Runtime) ReadOptimizerStates(ctx context.Context, name string) (master []float32, states [][]float32, err error) {
	if err := r.closedErr("read state "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return nil, nil, err
	}
	if err := r.settled(ctx); err != nil {
		return nil, nil, err
	}
	if _, ok := r.model.Numel[name]; !ok {
		return nil, nil, fmt.Errorf("zinf: read state %q: not a tensor of the model", name)
	}
	return r.Optimizer.ReadStates(ctx, name)
}

// VisitOptimizerStates calls fn for each optimizer sub-group of this
// rank's partition of a tensor, in order, with the offset of its first
// element in the partition and its fp32 master weights and states
// (Hyper.StateNames order) as of the last committed step. The slices live
// in pinned memory for the call only and must not be written. Unlike
// ReadOptimizerStates it copies nothing: reading a few elements of a large
// tensor costs one sub-group's record of pinned memory, no heap.
func (r *Runtime) VisitOptimizerStates(ctx context.Context, name string, fn func(off int, master []float32, states [][]float32) error) error {
	if err := r.closedErr("read state "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return err
	}
	if err := r.settled(ctx); err != nil {
		return err
	}
	if _, ok := r.model.Numel[name]; !ok {
		return fmt.Errorf("zinf: read state %q: not a tensor of the model", name)
	}
	return r.Optimizer.VisitStates(ctx, name, fn)
}

// ReadOptimizerState returns this rank's partition of a tensor's fp32
// master weights and Adam moments, as of the last committed step (for
// another optimizer, its first two states, nil where it has fewer).
func (r *Runtime) ReadOptimizerState(ctx context.Context, name string) (master, expAvg, expAvgSq []float32, err error) {
	if err := r.closedErr("read state "+strconv.Quote(name), optimizer.ErrClosed); err != nil {
		return nil, nil, nil, err
	}
	if err := r.settled(ctx); err != nil {
		return nil, nil, nil, err
	}
	if _, ok := r.model.Numel[name]; !ok {
		return nil, nil, nil, fmt.Errorf("zinf: read state %q: not a tensor of the model", name)
	}
	return r.Optimizer.ReadState(ctx, name)
}
