// Package train is zinf's simulated training example: a layered model with
// real float32 forward and backward passes and Adam, whose parameters,
// gradients and optimizer states live where a zinf config says (GPU, CPU or
// NVMe), moved by overlapped swaps. With Verify it runs the same loop fully
// in memory too and compares the final weights and optimizer states bit for
// bit. `zinf train` and `make demo` run it.
package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/metrics/procstat"
	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/trace"
)

// Options configure a run.
type Options struct {
	// Config describes the tiers; its NVMe paths must be set. World size,
	// dtype (bf16/fp16 enabled), gradient accumulation steps and Adam's
	// hyperparameters come from it.
	Config *config.Config
	// Spec is the model. Its DType is taken from the config.
	Spec Spec
	// Steps is the number of optimizer steps (default 5).
	Steps int
	// Verify also trains in memory and compares bit for bit.
	Verify bool
	// ComputePerLayer is simulated accelerator time per layer per pass.
	ComputePerLayer time.Duration
	// SerialStep runs the optimizer step after backward instead of
	// overlapping each layer's update with the rest of backward.
	SerialStep bool
	// PrefetchDepth overrides the policy's prefetch depth when > 0.
	PrefetchDepth int
	// Progress receives a line per step and the plan (nil: silent).
	Progress io.Writer
	// Logger for runtime warnings.
	Logger *slog.Logger
	// Faults is injected into every rank's engine (tests).
	Faults aio.FaultHook
	// Trace receives every rank's timeline (zinf.Options.Trace); nil: off.
	Trace trace.Sink
	// Sample names tensors whose updates are checked every step at up to
	// 4096 elements each against the update rule applied in memory, and
	// whose reads are checked against the committed master weights: the
	// check for a model too large for Verify's in-memory reference (see
	// Result.SampleChecked).
	Sample []string
	// NoStateDigest skips Result.StateSHA256, which reads every parameter,
	// master weight and optimizer state back from NVMe after the last
	// step (about 4/5 of the model state's bytes): a run that does not
	// compare states (zinf bench-scale) saves that read.
	NoStateDigest bool
	// Runtimes, when set, is called with the ranks' runtimes once they are
	// open, and with nil before they are closed (a metrics collector reads
	// them in between).
	Runtimes func(rts []*zinf.Runtime)
	// OnStep, when set, is called after each step (tests use it to inject
	// faults between steps); an error stops the run.
	OnStep func(step int) error
	// OnStepError, when set, decides whether a failed optimizer step is
	// retried (after the caller freed space, say). Without it a failed step
	// ends the run with its error.
	OnStepError func(step int, err error) bool

	// CheckpointDir, when set, is where checkpoints are saved (a
	// zinf.Checkpointer: one directory per step, named by
	// zinf.CheckpointName, each committed crash-safely): after every
	// CheckpointEvery steps and after the last step. A fresh run (no
	// Resume) refuses a directory that already holds checkpoints of a
	// run, so that no run's checkpoints are mixed with another's.
	CheckpointDir string
	// CheckpointEvery is the interval in steps (at least 1 with
	// CheckpointDir).
	CheckpointEvery int
	// CheckpointKeep is how many checkpoints are kept (older ones are
	// deleted after each commit; nothing else in CheckpointDir is): as
	// zinf.CheckpointerOptions.KeepLast, 0 for its default, -1 for all.
	CheckpointKeep int
	// CheckpointAsync saves asynchronously: training steps on while a
	// checkpoint drains (zinf.CheckpointerOptions.Async).
	CheckpointAsync bool
	// Comm, when set, makes this process one rank of a job whose ranks
	// are processes (comm.NewMPI under mpirun): it trains its own
	// runtime, whose layers are gathered from every rank's partitions and
	// whose gradients are reduce-scattered over the ranks in rank order
	// (zinf.Options.GatherLayers, ReduceGrads), and returns the same
	// results as the in-process world of the same size, bit for bit. The
	// config's world size must be the Comm's. Progress is for rank 0
	// only (the caller passes nil on the others). Checkpoints are saved
	// by every rank together (synchronously only) into a directory every
	// rank sees.
	Comm comm.Comm
	// DataParallel is the number of data-parallel ranks whose
	// micro-batches make a step (default: the world size). With more than
	// the world size, each rank computes several, in consecutive blocks
	// (world 1 with DataParallel 4 trains as world 4 does); a resumed run
	// takes its checkpoint's.
	DataParallel int

	// Resume continues from the newest committed checkpoint in
	// CheckpointDir: the parameters, the optimizer states and step count,
	// and the data stream's position (the step index; the data-parallel
	// degree the job started with, whatever the world size now). Steps is
	// then the total to reach, counting the steps done before. A directory
	// without a checkpoint is an error wrapping checkpoint.ErrNoCheckpoint;
	// a checkpoint past Steps is an error too, and one of another run (other seed,
	// batch, model, dtype, micro-steps or optimizer) is refused, naming
	// what differs. The checkpoint directory's world size may differ from
	// the config's.
	Resume bool
	// ResumeFrom continues, as Resume does, from the committed checkpoint
	// in this directory rather than the newest in CheckpointDir: an older
	// one, say, when the newest is damaged (Resume then stops, naming it).
	// Checkpoints are still saved into CheckpointDir, which must hold no
	// checkpoint directory after ResumeFrom's step (the resumed run would
	// save over it; a committed checkpoint is never replaced). Exclusive
	// with Resume.
	ResumeFrom string
}

// Result is what a run measured. JSON names are the CLI's --json fields.
type Result struct {
	Steps        int     `json:"steps"`
	Params       int64   `json:"params"`
	StateBytes   int64   `json:"state_bytes"`
	World        int     `json:"world_size"`
	DType        string  `json:"dtype"`
	BitwiseEqual *bool   `json:"bitwise_equal"`
	Mismatch     string  `json:"mismatch,omitempty"`
	StepMsMedian float64 `json:"step_ms_median"`
	// InMemoryStepMsMedian is the reference's step time (with Verify): the
	// same loop and simulated compute with every tensor in memory.
	InMemoryStepMsMedian float64 `json:"in_memory_step_ms_median,omitempty"`
	IOWaitMsMedian       float64 `json:"io_wait_ms_median"`
	ComputeMs            float64 `json:"compute_ms_per_step"`
	BytesRead            int64   `json:"bytes_read"`
	BytesWritten         int64   `json:"bytes_written"`
	// DeviceReadBytes and DeviceWrittenBytes are what the stores' requests
	// moved on the devices from the runtimes' open to the last step
	// (zinf.Metrics.DeviceBytesRead: padded, ranged reads widened to
	// whole checksum units); DigestReadBytes what the state digest read
	// after it (0 with Options.NoStateDigest).
	DeviceReadBytes    int64   `json:"device_read_bytes"`
	DeviceWrittenBytes int64   `json:"device_written_bytes"`
	DigestReadBytes    int64   `json:"digest_read_bytes"`
	ReadGBps           float64 `json:"read_gbps"`
	WriteGBps          float64 `json:"write_gbps"`
	PeakRSSBytes       int64   `json:"peak_rss_bytes"`
	PinnedBytes        int64   `json:"pinned_bytes"`
	PinnedLocked       bool    `json:"pinned_locked"`
	FinalLoss          float32 `json:"final_loss"`
	PrefetchDepth      int     `json:"prefetch_depth"`
	OverlapStep        bool    `json:"overlap_step"`
	// OverlapUpdate says each step's update ran on under the next step's
	// forward pass (zinf.overlap_update); UpdateWaitMs is the time the
	// forward passes waited for a layer's update, in all.
	OverlapUpdate bool      `json:"overlap_update"`
	UpdateWaitMs  float64   `json:"update_wait_ms"`
	DemandMisses  int64     `json:"demand_misses"`
	Backend       string    `json:"backend"`
	StepMs        []float64 `json:"step_ms"`
	// The optimizer step alone (all ranks): time, and NVMe bytes it moved
	// (states, gradients read back, params written back).
	OptimizerMs       []float64 `json:"optimizer_ms"`
	OptimizerMsMedian float64   `json:"optimizer_ms_median"`
	OptimizerRead     int64     `json:"optimizer_bytes_read_per_step"`
	OptimizerWritten  int64     `json:"optimizer_bytes_written_per_step"`
	PredictedMs       float64   `json:"predicted_step_ms"`
	// PredictedAtOpenMs is the step the plan predicted at Open, from
	// Options.ComputePerLayer (the simulated compute only); PredictedMs is
	// the planner's prediction again after the run, from the compute per
	// layer the runtime measured (the loop's own arithmetic included,
	// ComputeMsPerLayerMeasured: per layer, pass and micro-batch), for the
	// order the run used.
	PredictedAtOpenMs         float64 `json:"predicted_at_open_ms"`
	ComputeMsPerLayerMeasured float64 `json:"compute_ms_per_layer_measured"`
	// CostsMeasured are the CPU costs on the I/O path the prediction from
	// the measured compute adds (Runtime.MeasuredCosts).
	CostsMeasured *policy.Costs `json:"costs_measured,omitempty"`
	// Activations is what the activation tier held (layer-major with
	// several micro-batches; nil otherwise).
	Activations *ActivationReport `json:"activations,omitempty"`
	// Schedule is the order the step's micro-batches ran in: "layer-major"
	// or "micro-batch-major" (zinf.schedule, or the planner's pick under
	// auto). Both give the same StateSHA256.
	Schedule string `json:"schedule"`
	// StepsRun is the number of steps this run did (Steps less the steps
	// of the checkpoint it resumed from).
	StepsRun int `json:"steps_run"`
	// DataParallel is the number of data-parallel ranks whose micro-batches
	// make a step (World, unless the run resumed a job started at another
	// world size).
	DataParallel int `json:"data_parallel"`
	// Resumed says where the run resumed (nil: it started fresh).
	Resumed *Resumed `json:"resumed_from,omitempty"`
	// Checkpoints are the checkpoints committed, oldest first.
	Checkpoints []zinf.CheckpointRecord `json:"checkpoints,omitempty"`
	// PerStep is each step's learning rate, loss scale, gradient norm,
	// clipping, fp16 overflow skip and speculation outcome.
	PerStep []StepReport `json:"per_step"`
	// Totals over the run (every rank decides the same; rank 0's counts).
	AppliedSteps int     `json:"applied_steps"`
	SkippedSteps int     `json:"skipped_steps"`
	ClippedSteps int     `json:"clipped_steps"`
	Speculated   int     `json:"speculated_steps"`
	Commits      int     `json:"speculation_commits"`
	Rollbacks    int     `json:"speculation_rollbacks"`
	RollbackMs   float64 `json:"rollback_ms"`
	LossScale    float64 `json:"loss_scale"`
	// StateSHA256 is the digest of the final state: every parameter as
	// compute reads it, its fp32 master and Adam moments, full tensors in
	// the model's order (the same for any partitioning).
	StateSHA256 string `json:"state_sha256"`
	// Dist is set when the ranks are processes (Options.Comm).
	Dist *DistResult `json:"distributed,omitempty"`
	// NVMeWrittenPerStep is the median step's bytes written to the NVMe
	// devices by every rank's swap stores (padded to the alignment, as the
	// devices wrote them): what a step costs the drives' endurance.
	NVMeWrittenPerStep int64 `json:"nvme_written_per_step_bytes"`
	// StepReadBytes and StepWrittenBytes are each step's NVMe bytes (all
	// ranks and stores; the initial values written by Init are in none),
	// IOWaitMs each step's time the loop waited for I/O.
	StepReadBytes []int64 `json:"step_read_bytes"`
	// StepParamReadBytes is each step's parameter bytes read from NVMe
	// (all ranks): two passes' worth layer-major, 2k micro-batch-major.
	StepParamReadBytes []int64 `json:"step_param_read_bytes"`
	StepWrittenBytes   []int64 `json:"step_written_bytes"`
	// StepGradServedBytes is each step's gradient bytes the optimizer
	// read from the pinned copy of a write still in flight instead of
	// from NVMe (not in StepReadBytes; Metrics.Grads.ServedBytes).
	StepGradServedBytes []int64   `json:"step_grad_served_bytes"`
	IOWaitMs            []float64 `json:"io_wait_ms"`
	// TrainMs is the steps' wall time, from the first step's start until
	// the last step's update is committed (with zinf.overlap_update it
	// runs on after the last step's Step returned, so StepMs does not
	// hold it).
	TrainMs float64 `json:"train_ms"`
	// InitSeconds is the time from the start of Run to the first step:
	// opening the runtimes and writing every tensor's initial values.
	InitSeconds float64 `json:"init_seconds"`
	// SampleChecked counts the element updates and reads Options.Sample
	// compared (0 without it); a mismatch fails the run.
	SampleChecked int64 `json:"sample_checked,omitempty"`
}

// ActivationReport is Result.Activations: the tier setting, the peak
// bytes held on each tier and the NVMe traffic.
type ActivationReport struct {
	Device          string `json:"device"`
	PeakMemoryBytes int64  `json:"peak_memory_bytes"`
	PeakPinnedBytes int64  `json:"peak_pinned_bytes"`
	PeakNVMeBytes   int64  `json:"peak_nvme_bytes"`
	BytesWritten    int64  `json:"bytes_written"`
	BytesRead       int64  `json:"bytes_read"`
	Prefetched      int64  `json:"prefetched"`
}

// StepReport is one step of Result.PerStep.
type StepReport struct {
	Step int `json:"step"`
	// OptimizerStep is the optimizer's step count after it (applied steps).
	OptimizerStep int     `json:"optimizer_step"`
	Loss          float32 `json:"loss"`
	LR            float64 `json:"lr"`
	// Beta1 is set when OneCycle cycles the momentum.
	Beta1     float64 `json:"beta1,omitempty"`
	LossScale float64 `json:"loss_scale"`
	// GradNorm is the global norm of the unscaled gradients (null when
	// neither clipping nor fp16 is on, or when it is not finite).
	GradNorm *float64 `json:"grad_norm"`
	ClipCoef float64  `json:"clip_coef"`
	Clipped  bool     `json:"clipped"`
	// Skipped: the fp16 gradients overflowed; nothing was updated.
	Skipped    bool    `json:"overflow_skipped"`
	Speculated bool    `json:"speculated"`
	RolledBack bool    `json:"rolled_back"`
	RollbackMs float64 `json:"rollback_ms"`
	StepMs     float64 `json:"step_ms"`
}

func report(step int, loss float32, d time.Duration, in zinf.StepInfo) StepReport {
	r := StepReport{Step: step + 1, OptimizerStep: in.Step, Loss: loss, LR: in.LR, Beta1: in.Beta1, LossScale: in.LossScale,
		ClipCoef: in.ClipCoef, Clipped: in.Clipped, Skipped: !in.Applied, Speculated: in.Speculated, RolledBack: in.RolledBack,
		RollbackMs: float64(in.RollbackTime) / 1e6, StepMs: float64(d) / 1e6}
	if !in.Applied {
		r.OptimizerStep = in.Step - 1
	}
	if !math.IsNaN(in.GradNorm) && !math.IsInf(in.GradNorm, 0) {
		n := in.GradNorm
		r.GradNorm = &n
	}
	return r
}

// StateBytes is the model state: params in their dtype, fp32 gradients,
// and fp32 master + two Adam moments.
func (s Spec) StateBytes() int64 {
	n := s.ParamCount()
	return n*int64(s.DType.Size()) + n*4 + n*12
}

// Run trains as configured and, with Verify, against the in-memory
// reference.
func Run(ctx context.Context, o Options) (*Result, error) {
	runStart := time.Now()
	if o.Config == nil {
		return nil, errors.New("train: no config")
	}
	if o.Steps == 0 {
		o.Steps = 5
	}
	if o.Steps < 0 {
		return nil, fmt.Errorf("train: steps %d must be positive", o.Steps)
	}
	if o.DataParallel < 0 {
		return nil, fmt.Errorf("train: DataParallel %d is invalid (allowed: 0 for the world size, or 1 or more)", o.DataParallel)
	}
	if o.ResumeFrom != "" {
		if o.Resume {
			return nil, errors.New("train: Resume and ResumeFrom are exclusive: Resume takes the newest checkpoint in CheckpointDir, ResumeFrom the one named")
		}
		if o.CheckpointDir == "" {
			return nil, errors.New("train: ResumeFrom needs a CheckpointDir (where the resumed run saves its checkpoints)")
		}
		o.Resume = true
	}
	if o.Comm != nil {
		return runRank(ctx, o)
	}
	cfg := o.Config
	spec := o.Spec
	spec.DType = swapper.Float32
	if cfg.BF16 {
		spec.DType = swapper.BFloat16
	} else if cfg.FP16 {
		spec.DType = swapper.Float16
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	_, world := cfg.RankWorld()
	micro := max(cfg.GradientAccumulationSteps, 1)
	res := &Result{Steps: o.Steps, Params: spec.ParamCount(), StateBytes: spec.StateBytes(), World: world, DType: spec.DType.String()}
	if o.CheckpointDir == "" && (o.Resume || o.CheckpointEvery != 0 || o.CheckpointKeep != 0 || o.CheckpointAsync) {
		return nil, errors.New("train: Resume, CheckpointEvery, CheckpointKeep and CheckpointAsync need a CheckpointDir")
	}
	if o.CheckpointDir != "" && o.CheckpointEvery < 1 {
		return nil, fmt.Errorf("train: CheckpointEvery %d is invalid (allowed: 1 or more steps)", o.CheckpointEvery)
	}

	data := o.DataParallel
	if data == 0 {
		data = world
	}
	run := runMeta{Layers: spec.Layers, Width: spec.Width, Batch: spec.Batch, Seed: spec.Seed, DType: spec.DType.String(),
		Micro: micro, DataParallel: data, Hyper: plan.Hyper(cfg)}
	// The checkpoint directory is checked before anything is built, and
	// before the checkpointer is opened (which tidies the directory): a
	// refused run costs nothing and changes nothing. Then it is checked
	// again under the checkpointer's lock, which no other job holds.
	var ckpt *zinf.Checkpointer
	var from checkpoint.Info
	if o.CheckpointDir != "" {
		if _, _, err := checkRoot(o, run); err != nil {
			return nil, err
		}
		var err error
		ckpt, err = zinf.OpenCheckpointer(o.CheckpointDir, zinf.CheckpointerOptions{Every: int64(o.CheckpointEvery), KeepLast: o.CheckpointKeep,
			Async: o.CheckpointAsync, Logger: log})
		if err != nil {
			return nil, err
		}
		if from, run, err = checkRoot(o, run); err != nil {
			ckpt.Close()
			return nil, err
		}
	}

	// One runtime per simulated rank, each with its own pool, engine,
	// device and swap directories.
	var rts []*zinf.Runtime
	defer func() {
		// The checkpointer first: it waits for the save in flight, which
		// reads the runtimes.
		if ckpt != nil {
			ckpt.Close()
		}
		if o.Runtimes != nil && len(rts) > 0 {
			o.Runtimes(nil)
		}
		for _, rt := range rts {
			rt.Close()
		}
	}()
	// The ranks reduce the global gradient norm and fp16 overflow through
	// an in-process world (each rank's Step on its own goroutine).
	comms, err := comm.NewLocal(world, comm.LocalOptions{StallTimeout: time.Duration(cfg.Zinf.CommStallTimeout)})
	if err != nil {
		return nil, err
	}
	for r := 0; r < world; r++ {
		rt, err := zinf.Open(cfg, spec.Model(), zinf.Options{Logger: log, Rank: r, WorldSize: world, Faults: o.Faults, Trace: o.Trace,
			ComputePerLayer: o.ComputePerLayer, PrefetchDepth: o.PrefetchDepth, SerialStep: o.SerialStep, Comm: comms[r],
			TotalSteps: o.Steps})
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		rts = append(rts, rt)
	}
	if o.Runtimes != nil {
		o.Runtimes(rts)
	}
	res.Backend = rts[0].Engine.Name()
	pl := rts[0].Placement()
	depth := pl.PrefetchDepth
	if o.PrefetchDepth > 0 {
		depth = o.PrefetchDepth
	}
	if rts[0].Reservations().PrefetchBytes == 0 {
		depth = 0
	}
	res.PrefetchDepth = depth
	res.OverlapStep = !o.SerialStep && pl.OverlapStep
	res.OverlapUpdate = rts[0].OverlapUpdate()
	res.PredictedMs = float64(pl.Predicted.Total) / 1e6
	res.Schedule = string(rts[0].Schedule())
	layerMajor := rts[0].Schedule() == zinf.LayerMajor
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "model: %d layers x width %d (%s params, %s of state, %s), world size %d, %d micro-steps per step (%s)\n",
			spec.Layers, spec.Width, human(float64(res.Params)), policy.FormatBytes(res.StateBytes), spec.DType, world, micro, res.Schedule)
		pl.WriteTable(o.Progress)
		fmt.Fprintf(o.Progress, "\npinned memory by reservation (rank 0):\n%s\n", rts[0].Reservations())
	}
	be, err := newZinfBackend(ctx, spec, rts)
	if err != nil {
		return nil, err
	}
	be.run = run
	start := 0
	if o.Resume {
		meta, err := zinf.LoadCheckpoint(ctx, from.Dir, rts)
		if err != nil {
			return nil, err
		}
		start = int(meta.Step)
		res.Resumed = &Resumed{Step: start, Dir: from.Dir, WorldSize: from.WorldSize, DataParallel: run.DataParallel}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "resumed from %s: step %d of %d (saved at world size %d; data-parallel degree %d)\n",
				from.Dir, start, o.Steps, from.WorldSize, run.DataParallel)
		}
	}
	if len(o.Sample) > 0 {
		if be.sample, err = newSampler(ctx, spec, rts, plan.Hyper(cfg), cfg.GradientClipping, o.Sample); err != nil {
			return nil, err
		}
	}
	dataWorld := be.run.DataParallel
	res.DataParallel, res.StepsRun = dataWorld, o.Steps-start
	save := func(done int) error {
		if ckpt == nil || (done != o.Steps && !ckpt.Due(int64(done))) {
			return nil
		}
		t0 := time.Now()
		if err := ckpt.Save(ctx, rts, be.checkpointMeta(done)); err != nil {
			return fmt.Errorf("checkpoint after step %d: %w", done, err)
		}
		if o.Progress != nil {
			what := "committed"
			if o.CheckpointAsync {
				what = "snapshot taken (draining)"
			}
			fmt.Fprintf(o.Progress, "checkpoint %s: %s in %.1f ms\n", zinf.CheckpointName(int64(done)), what, float64(time.Since(t0))/1e6)
		}
		return nil
	}
	var ioWaits []float64
	var last zinf.Metrics
	written := newWrittenTracker(rts)
	lastWait := time.Duration(0)
	prevStep := metrics(rts)
	res.InitSeconds = time.Since(runStart).Seconds()
	t0 := time.Now()
	// Layer-major keeps k micro-batches' activations between a layer's
	// forward and its backward: they go through the activation tier
	// (zinf.activations: memory, pinned memory or NVMe).
	var acts actTier
	if layerMajor && micro > 1 {
		a, err := rts[0].OpenActivations(int64(2 * spec.Batch * spec.Width * 4))
		if err != nil {
			return nil, err
		}
		defer func() {
			st := a.Stats()
			res.Activations = &ActivationReport{Device: string(a.Device()), PeakMemoryBytes: st.PeakMemoryBytes, PeakPinnedBytes: st.PeakPinnedBytes,
				PeakNVMeBytes: st.PeakNVMeBytes, BytesWritten: st.BytesWritten, BytesRead: st.BytesRead, Prefetched: st.Prefetched}
			a.Close()
		}()
		acts = a
	}
	err = runLoop(ctx, spec, be, loopOptions{Start: start, Steps: o.Steps - start, Micro: micro, World: dataWorld, ComputePerLayer: o.ComputePerLayer,
		OnStepError: o.OnStepError, OverlapStep: !o.SerialStep && pl.OverlapStep, LayerMajor: layerMajor, Acts: acts,
		OnStep: func(step int, loss float32, d time.Duration) error {
			m := metrics(rts)
			w := be.ioWait - lastWait
			lastWait = be.ioWait
			res.StepMs = append(res.StepMs, float64(d)/1e6)
			ioWaits = append(ioWaits, float64(w)/1e6)
			res.StepReadBytes = append(res.StepReadBytes, m.BytesRead-prevStep.BytesRead)
			res.StepParamReadBytes = append(res.StepParamReadBytes, m.Params.BytesRead-prevStep.Params.BytesRead)
			res.StepWrittenBytes = append(res.StepWrittenBytes, m.BytesWritten-prevStep.BytesWritten)
			res.StepGradServedBytes = append(res.StepGradServedBytes, m.Grads.ServedBytes-prevStep.Grads.ServedBytes)
			written.step()
			res.FinalLoss = loss
			rep := report(step, loss, d, be.infos[len(be.infos)-1])
			res.PerStep = append(res.PerStep, rep)
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "step %3d/%d  loss %.6f  %7.1f ms  io-wait %6.1f ms  read %s  written %s%s\n", step+1, o.Steps, loss,
					float64(d)/1e6, float64(w)/1e6, policy.FormatBytes(m.BytesRead-last.BytesRead), policy.FormatBytes(m.BytesWritten-last.BytesWritten),
					rep.describe())
			}
			last = m
			if be.sample != nil {
				if err := be.sample.stepped(ctx, be.infos[len(be.infos)-1]); err != nil {
					return fmt.Errorf("step %d: %w", step+1, err)
				}
				last = metrics(rts) // its reads belong to no step
			}
			if err := save(step + 1); err != nil {
				return err
			}
			// Nor do the sampled check's and a checkpoint's.
			prevStep = metrics(rts)
			written.rebase()
			if o.OnStep != nil {
				return o.OnStep(step)
			}
			return nil
		}})
	if err != nil {
		return nil, err
	}
	res.TrainMs = float64(time.Since(t0)) / 1e6
	if ckpt != nil {
		if err := ckpt.Close(); err != nil {
			return nil, err
		}
		res.Checkpoints = ckpt.Records()
	}
	res.fill(metrics(rts), rts[0].Metrics().Train, time.Since(t0), ioWaits, float64(o.ComputePerLayer)/1e6*float64(2*spec.Layers*micro), be.optSteps)
	if err := res.replan(ctx, cfg, spec, rts[0], log); err != nil {
		return nil, err
	}
	res.NVMeWrittenPerStep = written.median()
	if be.sample != nil {
		res.SampleChecked = be.sample.checked
	}
	res.IOWaitMs = ioWaits
	for _, rt := range rts {
		res.DemandMisses += int64(rt.Metrics().Schedule.DemandMisses)
	}
	if !o.NoStateDigest {
		before := metrics(rts).DeviceBytesRead
		if res.StateSHA256, err = be.stateDigest(ctx); err != nil {
			return nil, err
		}
		res.DigestReadBytes = metrics(rts).DeviceBytesRead - before
	}
	if !o.Verify {
		return res, nil
	}
	// The reference runs the same loop with the same simulated compute, all
	// in memory: its step time is what the step would take if I/O were
	// free, the yardstick for overlap. It runs micro-batch-major whatever
	// the run's order (the compute is the same): a layer-major run is
	// checked against the other order too.
	ref, err := newMemBackend(spec, cfg, o.Steps)
	if err != nil {
		return nil, err
	}
	var refMs []float64
	if err := runLoop(ctx, spec, ref, loopOptions{Steps: o.Steps, Micro: micro, World: dataWorld, ComputePerLayer: o.ComputePerLayer,
		OnStep: func(_ int, _ float32, d time.Duration) error { refMs = append(refMs, float64(d)/1e6); return nil }}); err != nil {
		return nil, fmt.Errorf("reference run: %w", err)
	}
	eq, why, err := compare(ctx, spec, be, ref)
	if err != nil {
		return nil, fmt.Errorf("comparing with the reference: %w", err)
	}
	res.InMemoryStepMsMedian = median(refMs)
	res.BitwiseEqual = &eq
	res.Mismatch = why
	return res, nil
}

// checkRoot checks o.CheckpointDir for the run: a fresh run needs it
// without checkpoints; a resumed one, its newest checkpoint of this run
// (findResume) at or before o.Steps, which it returns with the run to
// continue.
func checkRoot(o Options, run runMeta) (checkpoint.Info, runMeta, error) {
	if o.ResumeFrom != "" {
		from, run, err := resumeFrom(o.ResumeFrom, o.CheckpointDir, run)
		if err == nil && from.Step > int64(o.Steps) {
			err = fmt.Errorf("train: the checkpoint %s is after step %d, past the %d steps asked for: ask for more steps",
				from.Dir, from.Step, o.Steps)
		}
		return from, run, err
	}
	if o.Resume {
		from, run, err := findResume(o.CheckpointDir, run)
		if err == nil && from.Step > int64(o.Steps) {
			err = fmt.Errorf("train: the newest checkpoint in %s (%s) is after step %d, past the %d steps asked for: ask for more steps",
				o.CheckpointDir, from.Dir, from.Step, o.Steps)
		}
		return from, run, err
	}
	info, err := zinf.LatestCheckpoint(o.CheckpointDir)
	if err == nil {
		return info, run, fmt.Errorf("train: the checkpoint directory %s already holds checkpoints (the newest: %s, step %d): resume from them (Options.Resume, zinf train --resume) or choose another directory",
			o.CheckpointDir, info.Dir, info.Step)
	}
	if !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return info, run, err
	}
	return checkpoint.Info{}, run, nil
}

// describe is the step's training line suffix: learning rate, and what
// clipping, loss scaling and speculation did.
func (r StepReport) describe() string {
	out := fmt.Sprintf("  lr %.4g", r.LR)
	if r.LossScale != 1 {
		out += fmt.Sprintf("  loss-scale %g", r.LossScale)
	}
	if r.GradNorm != nil {
		out += fmt.Sprintf("  grad-norm %.4g", *r.GradNorm)
	}
	if r.Clipped {
		out += fmt.Sprintf("  clipped x%.4g", r.ClipCoef)
	}
	if r.Skipped {
		out += "  OVERFLOW: skipped"
	}
	if r.RolledBack {
		out += fmt.Sprintf("  rolled back (%.1f ms)", r.RollbackMs)
	}
	return out
}

// replan predicts the step again from the compute per layer rt
// measured (see Result.PredictedMs), with the bandwidth it planned with.
func (res *Result) replan(ctx context.Context, cfg *config.Config, spec Spec, rt *zinf.Runtime, log *slog.Logger) error {
	res.PredictedAtOpenMs = res.PredictedMs
	c := rt.MeasuredComputePerLayer()
	if c <= 0 {
		return nil
	}
	bw := rt.Bandwidth()
	p, err := zinf.PlanModel(ctx, cfg, spec.Model(), zinf.Options{Rank: rt.Rank, WorldSize: rt.World, ComputePerLayer: c, Bandwidth: &bw, Logger: log})
	if err != nil {
		return fmt.Errorf("train: the prediction from the measured compute: %w", err)
	}
	// The CPU costs on the I/O path rt measured: checksums, hand-offs, the
	// optimizer's arithmetic.
	costs := rt.MeasuredCosts()
	res.CostsMeasured = &costs
	pl := p.Placement.WithCosts(costs)
	pr := pl.PredictedMicroBatchMajor
	if res.Schedule == string(zinf.LayerMajor) {
		pr = pl.PredictedLayerMajor
	}
	res.PredictedMs = float64(pr.Total) / 1e6
	res.ComputeMsPerLayerMeasured = float64(c) / 1e6
	return nil
}

// fill sets the figures every run reports alike from the I/O totals m
// (over elapsed), the training step's counters ts, the loop's I/O waits,
// its compute per step and the optimizer steps it timed.
func (res *Result) fill(m zinf.Metrics, ts zinf.TrainStats, elapsed time.Duration, ioWaits []float64, computeMs float64, opt []optStep) {
	sec := elapsed.Seconds()
	res.BytesRead, res.BytesWritten = m.BytesRead, m.BytesWritten
	res.DeviceReadBytes, res.DeviceWrittenBytes = m.DeviceBytesRead, m.DeviceBytesWritten
	res.ReadGBps, res.WriteGBps = float64(m.BytesRead)/sec/1e9, float64(m.BytesWritten)/sec/1e9
	res.PinnedBytes, res.PinnedLocked = m.PinnedBytes, m.Pinned
	res.StepMsMedian = median(res.StepMs)
	res.IOWaitMsMedian = median(ioWaits)
	res.ComputeMs = computeMs
	res.AppliedSteps, res.SkippedSteps, res.ClippedSteps = ts.Applied, ts.Skipped, ts.Clipped
	res.Speculated, res.Commits, res.Rollbacks = ts.Speculated, ts.Commits, ts.Rollbacks
	res.RollbackMs = float64(ts.RollbackTime) / 1e6
	res.UpdateWaitMs = float64(m.UpdateWait) / 1e6
	res.LossScale = ts.LossScale
	for _, st := range opt {
		res.OptimizerMs = append(res.OptimizerMs, float64(st.d)/1e6)
		res.OptimizerRead, res.OptimizerWritten = st.read, st.written
	}
	res.OptimizerMsMedian = median(res.OptimizerMs)
	res.PeakRSSBytes = procstat.PeakRSS()
}

func metrics(rts []*zinf.Runtime) zinf.Metrics {
	var m zinf.Metrics
	for i, rt := range rts {
		x := rt.Metrics()
		m.BytesRead += x.BytesRead
		m.BytesWritten += x.BytesWritten
		m.DeviceBytesRead += x.DeviceBytesRead
		m.DeviceBytesWritten += x.DeviceBytesWritten
		m.PinnedBytes += x.PinnedBytes
		m.Pinned = x.Pinned && (i == 0 || m.Pinned)
		m.Params.BytesRead += x.Params.BytesRead
		m.Grads.ServedBytes += x.Grads.ServedBytes
		m.UpdateWait += x.UpdateWait
	}
	return m
}

// compare checks final compute weights and optimizer states bit for bit.
func compare(ctx context.Context, spec Spec, be *zinfBackend, ref *memBackend) (bool, string, error) {
	why := ""
	if err := be.readAll(ctx, func(n string, got []float32) error {
		if i, ok := sameBits(got, ref.compute[n]); !ok && why == "" {
			why = fmt.Sprintf("param %s element %d: %v vs reference %v", n, i, got[i], ref.compute[n][i])
		}
		return nil
	}); err != nil {
		return false, "", err
	}
	if why != "" {
		return false, why, nil
	}
	// Every step decided the same: schedule, loss scale, norm, clipping,
	// skip (see sameDecisions).
	if why := sameDecisions(be.infos, ref.infos, len(be.rts) == ref.ranks); why != "" {
		return false, why, nil
	}
	for _, n := range spec.ParamNames() {
		for r, rt := range be.rts {
			lo, hi := rt.Partition(n)
			if lo == hi {
				continue
			}
			master, states, err := rt.ReadOptimizerStates(ctx, n)
			if err != nil {
				return false, "", fmt.Errorf("rank %d: %w", r, err)
			}
			type pair struct {
				what      string
				got, want []float32
			}
			pairs := []pair{{"master", master, ref.master[n][lo:hi]}}
			if len(states) != len(ref.states[n]) {
				return false, fmt.Sprintf("rank %d %s: %d optimizer states, reference %d", r, n, len(states), len(ref.states[n])), nil
			}
			for k, name := range ref.hyper.StateNames() {
				pairs = append(pairs, pair{name, states[k], ref.states[n][k][lo:hi]})
			}
			for _, c := range pairs {
				if i, ok := sameBits(c.got, c.want); !ok {
					return false, fmt.Sprintf("rank %d %s.%s element %d: %v vs reference %v", r, n, c.what, lo+i, c.got[i], c.want[i]), nil
				}
			}
		}
	}
	return true, "", nil
}

// sameDecisions compares each step's account with the reference's (the
// backend's steps are the reference's last ones: a resumed run records
// those after the resume) and says how the first that differs does; ""
// when all agree. The norm and the clipping coefficient are compared only
// for sameWorld: the norm is summed per rank partition, then over the
// ranks, so it is bit-equal only when the reference sums for the same
// world size; across world sizes it may differ in its last bits (weights
// that differ are caught by the caller).
func sameDecisions(got, ref []zinf.StepInfo, sameWorld bool) string {
	if len(got) > len(ref) {
		return fmt.Sprintf("%d steps recorded, reference %d", len(got), len(ref))
	}
	for i, g := range got {
		k := len(ref) - len(got) + i
		want := ref[k]
		same := g.Step == want.Step && g.Applied == want.Applied && g.Clipped == want.Clipped &&
			math.Float64bits(g.LR) == math.Float64bits(want.LR) && g.LossScale == want.LossScale && g.NextLossScale == want.NextLossScale
		if sameWorld {
			same = same && math.Float64bits(g.ClipCoef) == math.Float64bits(want.ClipCoef) &&
				(math.Float64bits(g.GradNorm) == math.Float64bits(want.GradNorm) || math.IsNaN(g.GradNorm) && math.IsNaN(want.GradNorm))
		}
		if !same {
			return fmt.Sprintf("step %d: %+v, reference %+v", k+1, g, want)
		}
	}
	return ""
}

func sameBits(a, b []float32) (int, bool) {
	if len(a) != len(b) {
		return 0, false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i, false
		}
	}
	return 0, true
}

func median(v []float64) float64 {
	return stats.Median(v)
}

func human(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}
