package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/examples/train"
	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/internal/base/testhook"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/policy"
)

func init() {
	register("train", "run the simulated training example with offload as the config says (--verify compares with in-memory training)", runTrain)
}

// loadConfig reads --config (or the embedded default) and, when the config
// offloads to NVMe without a path, points it at dir, or at the system's
// temporary directory (os.TempDir) when dir is empty. The swap stores make
// their own run directories there and remove them when the run ends; a
// run killed before that leaves them where the next run on the same path
// (and `zinf doctor --path`) finds and removes them, which a fresh
// directory per run would hide. cleanup is kept for callers and does
// nothing.
func loadConfig(path, dir string, stderr io.Writer) (cfg *config.Config, cleanup func(), err error) {
	cleanup = func() {}
	if path == "" {
		cfg = config.Default()
	} else {
		// Reading a file no context reaches: a signal now ends the
		// process (beginBlocking). config.Load refuses pipes and devices,
		// but a regular file can still hang (a dead network mount).
		end := beginBlocking()
		testhook.Hit("cmd/zinf/load-config")
		cfg, err = config.Load(path)
		end()
		if err != nil {
			return nil, cleanup, err
		}
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, "config:", w)
	}
	if cfg.NeedsScratchDir() {
		if dir == "" {
			dir = os.TempDir()
		}
		cfg.SetScratchDir(dir)
	}
	if err := cfg.Validate(); err != nil {
		return nil, cleanup, err
	}
	return cfg, cleanup, nil
}

// trainFaults is injected into the I/O engines of zinf train. Tests only:
// the test binary sets it in child mode; nothing in zinf does.
var trainFaults aio.FaultHook

// joinMPI joins the MPI job when mpirun (or another launcher Open MPI
// understands) started this process: nil when it did not. The config's
// zinf.comm_stall_timeout and zinf.comm_heartbeat_timeout bound the
// collectives' waits.
func joinMPI(cfg *config.Config) (comm.Comm, error) {
	_, size, ok := comm.LaunchedByMPI()
	if !ok {
		return nil, nil
	}
	c, err := comm.NewMPI(comm.MPIOptions{StallTimeout: time.Duration(cfg.Zinf.CommStallTimeout),
		HeartbeatTimeout: time.Duration(cfg.Zinf.CommHeartbeatTimeout)})
	if errors.Is(err, comm.ErrNoMPI) {
		return nil, fmt.Errorf("started by mpirun (OMPI_COMM_WORLD_SIZE=%d), but this zinf has no MPI: %w", size, err)
	}
	return c, err
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := newFlags("train", stderr)
	var (
		cfgPath, dir  string
		spec          train.Spec
		o             train.Options
		computeMs     float64
		asJSON, quiet bool
	)
	fs.StringVar(&cfgPath, "config", "", "config file (DeepSpeed JSON + zinf section); default: the embedded one")
	fs.StringVar(&dir, "dir", "", "swap directory when the config names none (default: the system's temporary directory; the run removes its swap files)")
	fs.IntVar(&spec.Layers, "layers", 8, "model layers")
	fs.IntVar(&spec.Width, "width", 512, "layer width")
	fs.IntVar(&spec.Batch, "batch", 8, "rows per micro-batch per rank")
	var seed uint64
	fs.Uint64Var(&seed, "seed", 1, "initialization and data seed")
	fs.IntVar(&o.Steps, "steps", 5, "optimizer steps")
	fs.BoolVar(&o.Verify, "verify", false, "also train in memory and compare final weights and optimizer states bit for bit")
	fs.Float64Var(&computeMs, "compute-ms-per-layer", 0, "simulated GPU time per layer per pass (to measure overlap)")
	fs.IntVar(&o.PrefetchDepth, "prefetch", 0, "layers to prefetch ahead (0: the policy decides)")
	fs.IntVar(&o.DataParallel, "data-parallel", 0, "data-parallel ranks whose micro-batches make a step (0: the world size; more than the world size: each rank computes several)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object with the results")
	fs.BoolVar(&quiet, "quiet", false, "no per-step progress")
	var ck ckptFlags
	ck.register(fs)
	var step stepFlags
	step.register(fs)
	fs.BoolVar(&o.SerialStep, "serial-step", false, "run the optimizer step after backward instead of overlapping it")
	var obs observeFlags
	obs.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	spec.Seed = seed
	// Zero would silently mean "the default" below the command line.
	compute, cerr := computeMsFlag(computeMs)
	if err := errors.Join(positive("--steps", o.Steps), notNegative("--prefetch", o.PrefetchDepth), cerr, intIn("--data-parallel", o.DataParallel, 0, 1<<20),
		modelFlags(spec.Layers, spec.Width, spec.Batch), ck.check(fs), obs.check(fs)); err != nil {
		return err
	}
	if err := step.check(fs); err != nil {
		return err
	}
	// The config first: joining the job takes its timeouts.
	cfg, cleanup, err := loadConfig(cfgPath, dir, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	// Started by mpirun: this process is one rank of the job.
	c, err := joinMPI(cfg)
	if err != nil {
		return err
	}
	if c != nil {
		defer func() {
			if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errUsage) {
				err = fmt.Errorf("rank %d of %d: %w", c.Rank(), c.Size(), err)
				c.Abort(err)
				// Said now: Close lingers for the other ranks to see the
				// failure, and mpirun may end this process meanwhile.
				fmt.Fprintf(stderr, "zinf train: %v\n", err)
				err = reported{err}
			}
			c.Close()
		}()
		o.Comm = c
		if c.Rank() != 0 {
			// One summary, from rank 0; the others report only errors.
			quiet, stdout = true, io.Discard
		}
	}
	ranks := 1 // one per process under mpirun; in process, the world
	if c == nil {
		_, ranks = cfg.RankWorld()
	}
	if err := errors.Join(checkPinnedPools(cfg, ranks), ck.checkResources(cfg, spec, o.Steps)); err != nil {
		return err
	}
	ck.apply(&o)
	if err := step.apply(cfg); err != nil {
		return err
	}
	o.Config, o.Spec = cfg, spec
	o.ComputePerLayer = compute
	o.Logger = cliLogger(stderr)
	o.Faults = trainFaults
	if !quiet {
		o.Progress = stderr
		if !asJSON {
			o.Progress = stdout
		}
	}
	stop, err := obs.start(&o, stderr)
	if err != nil {
		return err
	}
	res, err := train.Run(ctx, o)
	if err := errors.Join(err, stop()); err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	if err := printTrainSummary(stdout, res, o.Verify); err != nil {
		return err
	}
	if res.NVMeWrittenPerStep > 0 {
		tbw := obs.tbw
		if tbw < 0 {
			tbw = int64(cfg.Zinf.NVMeTBW)
		}
		writeEndurance(stdout, "all ranks, at the median step measured", res.NVMeWrittenPerStep,
			time.Duration(res.StepMsMedian*float64(time.Millisecond)), tbw, cfg.NVMePaths())
	}
	return nil
}

// stepFlags override the config's training-step keys.
type stepFlags struct {
	clip      float64
	speculate string
	fp16      bool
	lossScale float64
	schedule  string
	micro     int
	overlap   bool
	set       map[string]bool
}

func (s *stepFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&s.clip, "clip", 0, "gradient_clipping: largest global gradient norm, 0 = off (default: the config's)")
	fs.StringVar(&s.speculate, "speculate", "", "zinf.speculate: auto, always or never (default: the config's)")
	fs.BoolVar(&s.fp16, "fp16", false, "fp16 params with loss scaling (fp16.enabled true, bf16 off)")
	fs.Float64Var(&s.lossScale, "loss-scale", 0, "fp16.loss_scale: 0 = dynamic, > 0 static (default: the config's)")
	fs.StringVar(&s.schedule, "schedule", "", "zinf.schedule: the order of a step's micro-batches, auto, layer-major or micro-batch-major (default: the config's)")
	fs.IntVar(&s.micro, "micro-batches", 0, "gradient_accumulation_steps: micro-batches per optimizer step (default: the config's)")
	fs.BoolVar(&s.overlap, "overlap-update", false, "zinf.overlap_update: Step returns once the step is decided and the update runs on under the next step's forward (default: the config's)")
}

// check reads which flags were given and refuses bad values by name.
func (s *stepFlags) check(fs *flag.FlagSet) error {
	s.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { s.set[f.Name] = true })
	var errs []error
	if s.set["clip"] && (!(s.clip >= 0) || math.IsInf(s.clip, 0)) {
		errs = append(errs, fmt.Errorf("--clip %v: must be a finite number >= 0 (0 turns clipping off)", s.clip))
	}
	if s.set["loss-scale"] && (!(s.lossScale >= 0) || math.IsInf(s.lossScale, 0)) {
		errs = append(errs, fmt.Errorf("--loss-scale %v: must be 0 (dynamic) or a finite number > 0", s.lossScale))
	}
	if s.set["speculate"] {
		switch config.SpeculateMode(s.speculate) {
		case config.SpeculateAuto, config.SpeculateAlways, config.SpeculateNever:
		default:
			errs = append(errs, fmt.Errorf("--speculate %q: allowed: auto, always, never", s.speculate))
		}
	}
	if s.set["schedule"] {
		switch config.ScheduleMode(s.schedule) {
		case config.ScheduleAuto, config.ScheduleLayerMajor, config.ScheduleMicroBatchMajor:
		default:
			errs = append(errs, fmt.Errorf("--schedule %q: allowed: auto, layer-major, micro-batch-major", s.schedule))
		}
	}
	if s.set["micro-batches"] {
		if err := intIn("--micro-batches", s.micro, 1, math.MaxInt32); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// apply writes the given flags into cfg and validates it again.
func (s *stepFlags) apply(cfg *config.Config) error {
	if s.set["clip"] {
		cfg.GradientClipping = s.clip
	}
	if s.set["speculate"] {
		cfg.Zinf.Speculate = config.SpeculateMode(s.speculate)
	}
	if s.set["fp16"] {
		cfg.FP16 = s.fp16
		if s.fp16 {
			cfg.BF16 = false
		}
	}
	if s.set["loss-scale"] {
		cfg.LossScaling.LossScale = s.lossScale
	}
	if s.set["schedule"] {
		cfg.Zinf.Schedule = config.ScheduleMode(s.schedule)
	}
	if s.set["micro-batches"] {
		cfg.GradientAccumulationSteps, cfg.GradientAccumulationAuto = s.micro, false
	}
	if s.set["overlap-update"] {
		cfg.Zinf.OverlapUpdate = s.overlap
	}
	return cfg.Validate()
}

func printTrainSummary(w io.Writer, r *train.Result, verify bool) error {
	fmt.Fprintf(w, "\nsummary: %d steps, %d params (%s of state), world size %d, %s, backend %s\n", r.Steps, r.Params, policy.FormatBytes(r.StateBytes), r.World, r.DType, r.Backend)
	predicted := fmt.Sprintf("policy predicted %.1f ms", r.PredictedMs)
	if r.ComputeMsPerLayerMeasured > 0 {
		predicted = fmt.Sprintf("policy predicted %.1f ms from the measured compute, %.3f ms per layer, pass and micro-batch; %.1f ms at open", r.PredictedMs, r.ComputeMsPerLayerMeasured, r.PredictedAtOpenMs)
	}
	fmt.Fprintf(w, "  step time median %.1f ms (%s), io-wait median %.1f ms, prefetch depth %d, demand misses %d, schedule %s\n",
		r.StepMsMedian, predicted, r.IOWaitMsMedian, r.PrefetchDepth, r.DemandMisses, r.Schedule)
	if r.InMemoryStepMsMedian > 0 {
		fmt.Fprintf(w, "  overlap: the same loop in memory takes %.1f ms per step (%.1f ms of it simulated GPU time): offloaded / in-memory = %.2fx (optimizer step overlapped with backward: %v)\n",
			r.InMemoryStepMsMedian, r.ComputeMs, r.StepMsMedian/r.InMemoryStepMsMedian, r.OverlapStep)
	}
	if r.OverlapUpdate {
		fmt.Fprintf(w, "  update: each step's update ran on under the next step's forward (zinf.overlap_update); the forwards waited %.1f ms for it in all\n", r.UpdateWaitMs)
	}
	if r.SkippedSteps+r.ClippedSteps+r.Speculated > 0 || r.LossScale != 1 {
		fmt.Fprintf(w, "  step: %d applied, %d skipped (fp16 overflow), %d clipped; loss scale now %g; speculative updates %d: %d committed, %d rolled back (%.1f ms)\n",
			r.AppliedSteps, r.SkippedSteps, r.ClippedSteps, r.LossScale, r.Speculated, r.Commits, r.Rollbacks, r.RollbackMs)
	}
	fmt.Fprintf(w, "  NVMe: read %s (%.3f GB/s), written %s (%.3f GB/s)\n", policy.FormatBytes(r.BytesRead), r.ReadGBps, policy.FormatBytes(r.BytesWritten), r.WriteGBps)
	fmt.Fprintf(w, "  memory: peak RSS %s, pinned pool %s (locked: %v)\n", policy.FormatBytes(r.PeakRSSBytes), policy.FormatBytes(r.PinnedBytes), r.PinnedLocked)
	if d := r.Dist; d != nil {
		fmt.Fprintf(w, "  ranks: %d processes, data-parallel degree %d; collectives moved %s per step on rank 0 (at most %s on a rank), gather wait %.1f ms per step, %d layers gathered ahead\n",
			d.Ranks, r.DataParallel, policy.FormatBytes(d.CommBytesPerStep), policy.FormatBytes(d.MaxCommBytesPerStep), d.GatherWaitMsPerStep, d.GatheredAhead)
	}
	if r.StateSHA256 != "" {
		fmt.Fprintf(w, "  final state sha256 %s\n", r.StateSHA256)
	}
	if r.Resumed != nil {
		fmt.Fprintf(w, "  resumed from %s (step %d, saved at world size %d); %d steps run\n", r.Resumed.Dir, r.Resumed.Step, r.Resumed.WorldSize, r.StepsRun)
	}
	for _, c := range r.Checkpoints {
		fmt.Fprintf(w, "  checkpoint step %d: %s, %s in %.3f s (training held %.3f s)\n", c.Step, c.Dir, policy.FormatBytes(c.Bytes), c.Seconds, c.StallSeconds)
	}
	switch {
	case r.BitwiseEqual == nil:
		if verify {
			fmt.Fprintln(w, "  equality: not checked")
		}
	case *r.BitwiseEqual:
		fmt.Fprintln(w, "  equality: final weights and optimizer states equal in-memory training BIT FOR BIT")
	default:
		fmt.Fprintf(w, "  equality: MISMATCH with in-memory training: %s\n", r.Mismatch)
		return fmt.Errorf("offloaded training differs from in-memory training: %s", r.Mismatch)
	}
	return nil
}

// modelFlags checks --layers, --width and --batch against the limits plan
// applies to the same quantities, and the memory one layer takes: the
// examples build the layer inventory and hold whole layers in memory.
func modelFlags(layers, width, batch int) error {
	errs := []error{intIn("--layers", layers, 1, policy.MaxModelLayers), intIn("--width", width, 1, policy.MaxModelWidth),
		intIn("--batch", batch, 1, policy.MaxModelBatch)}
	if errors.Join(errs...) != nil {
		return errors.Join(errs...)
	}
	// A layer's fp32 weights, its gradient and two optimizer moments.
	perLayer := int64(width) * int64(width) * 4 * 4
	return checkMemory("--width", int64(width), perLayer, "one layer (fp32 weights, gradient and two optimizer moments of width x width)")
}

// ckptFlags are train's checkpoint and resume flags.
type ckptFlags struct {
	dir    string
	every  int
	keep   int
	async  bool
	resume bool
	// resumeFrom is --resume-from: a checkpoint directory to resume from
	// instead of the newest in --checkpoint-dir.
	resumeFrom string
}

// maxCheckpointKeep bounds --checkpoint-keep: far more checkpoints than
// anyone keeps, small enough that no count overflows.
const maxCheckpointKeep = 1 << 20

func (c *ckptFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dir, "checkpoint-dir", "", "save checkpoints here, crash-safely, one directory per step (step-000010, ...)")
	fs.IntVar(&c.every, "checkpoint-every", 0, "save a checkpoint after every N steps and after the last step (required with --checkpoint-dir)")
	fs.IntVar(&c.keep, "checkpoint-keep", zinf.DefaultCheckpointKeep, "checkpoints kept in --checkpoint-dir; older ones are deleted after each commit, nothing else there is (0 keeps all)")
	fs.BoolVar(&c.async, "checkpoint-async", false, "save asynchronously: training goes on while a checkpoint drains (pinned memory of the checkpoint's size)")
	fs.BoolVar(&c.resume, "resume", false, "continue from the newest committed checkpoint in --checkpoint-dir (an error when there is none, or when the newest is damaged); --steps is the total to reach")
	fs.StringVar(&c.resumeFrom, "resume-from", "", "continue from this committed checkpoint directory (an older one, when the newest is damaged) instead of the newest; checkpoints are saved into --checkpoint-dir, which must hold none after it")
}

// check reports every checkpoint flag that is invalid or set without
// --checkpoint-dir (nothing is silently ignored).
func (c *ckptFlags) check(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	if c.dir == "" {
		if set["checkpoint-dir"] {
			return errors.New("--checkpoint-dir \"\" is invalid: name a directory")
		}
		for _, n := range []string{"checkpoint-every", "checkpoint-keep", "checkpoint-async", "resume", "resume-from"} {
			if set[n] {
				errs = append(errs, fmt.Errorf("--%s needs --checkpoint-dir (where the checkpoints are)", n))
			}
		}
		return errors.Join(errs...)
	}
	if !set["checkpoint-every"] {
		errs = append(errs, errors.New("--checkpoint-dir needs --checkpoint-every N: the steps between checkpoints"))
	} else if err := intIn("--checkpoint-every", c.every, 1, math.MaxInt32); err != nil {
		errs = append(errs, err)
	}
	if err := intIn("--checkpoint-keep", c.keep, 0, maxCheckpointKeep); err != nil {
		errs = append(errs, err)
	}
	if set["resume-from"] {
		if c.resumeFrom == "" {
			errs = append(errs, errors.New("--resume-from \"\" is invalid: name a checkpoint directory"))
		} else if c.resume {
			errs = append(errs, fmt.Errorf("--resume and --resume-from %s are exclusive: --resume takes the newest checkpoint in --checkpoint-dir, --resume-from the one named", c.resumeFrom))
		}
	}
	if fi, err := os.Stat(c.dir); err == nil && !fi.IsDir() {
		errs = append(errs, fmt.Errorf("--checkpoint-dir %s is invalid: it is not a directory", c.dir))
	}
	return errors.Join(errs...)
}

// checkResources refuses checkpoint settings the machine cannot hold: an
// asynchronous snapshot (one checkpoint's size in pinned memory) beyond
// the memory available, and the checkpoints kept at once (KeepLast plus
// the one being written) beyond the free disk space.
func (c *ckptFlags) checkResources(cfg *config.Config, spec train.Spec, steps int) error {
	if c.dir == "" {
		return nil
	}
	paramBytes := int64(4)
	if cfg.BF16 || cfg.FP16 {
		paramBytes = 2
	}
	// Parameters in their dtype, fp32 master, exp_avg and exp_avg_sq.
	size := spec.ParamCount() * (paramBytes + 12)
	var errs []error
	if lim, ok := memlimit.Available(); ok && c.async && size > lim.Bytes {
		errs = append(errs, fmt.Errorf("--checkpoint-async needs %s of pinned memory for a snapshot of each checkpoint, more than the %s available (%s): leave it out to save synchronously",
			units.FormatBytesExact(size), units.FormatBytesExact(lim.Bytes), lim.What))
	}
	copies := int64(steps/c.every + 1)
	if c.keep > 0 {
		copies = min(copies, int64(c.keep)+1)
	}
	need := size * copies
	if size > 0 && need/size != copies {
		need = math.MaxInt64
	}
	if dir, free, ok := diskFree(existingAncestor(c.dir)); ok && need > free {
		errs = append(errs, fmt.Errorf("--checkpoint-dir %s needs %s for %d checkpoints of %s (--checkpoint-keep %d plus the one being written), more than the %s free on %s: keep fewer or choose another directory",
			c.dir, units.FormatBytesExact(need), copies, units.FormatBytesExact(size), c.keep, units.FormatBytesExact(free), dir))
	}
	return errors.Join(errs...)
}

// apply sets the run's checkpoint options.
func (c *ckptFlags) apply(o *train.Options) {
	if c.dir == "" {
		return
	}
	o.CheckpointDir, o.CheckpointEvery, o.CheckpointAsync, o.Resume = c.dir, c.every, c.async, c.resume
	o.ResumeFrom = c.resumeFrom
	o.CheckpointKeep = c.keep
	if c.keep == 0 {
		o.CheckpointKeep = -1 // zinf.CheckpointerOptions: keep all
	}
}

// existingAncestor is dir, or its nearest ancestor that exists (where a
// directory still to be created will take its space).
func existingAncestor(dir string) string {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || d == filepath.Dir(d) {
			return d
		}
	}
}
