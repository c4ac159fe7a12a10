// Package scalebench trains the simulated model (examples/train) with
// model states larger than the machine's memory through a small pinned
// pool, and reports what it took: peak resident memory against the pool,
// step time against the disk-bound prediction from bandwidth measured on
// the same path in the same run, and the bytes moved. It backs `zinf
// bench-scale` and `make bench-scale`. Compare trains the same model in
// today's fp32 configuration and in the compact one (bf16 parameters,
// 8-bit moments, gradients kept pinned) in alternating blocks, and sets
// each one's bytes per parameter per step at the disk against the plan's.
//
// The run checks free disk space before it writes anything and refuses,
// naming what it needs and what is free. It leaves nothing in the path:
// the swap stores remove their run directories when they close, also when
// the run is interrupted (SIGINT, SIGTERM); a run killed outright leaves
// them for the next zinf run on the path to remove, as any zinf run does.
// A model this large has no in-memory reference to
// compare with bit for bit; instead the sampled check of examples/train
// (Options.Sample) checks every step of four tensors — the first and the
// last layer's weights, the last layer's bias and a middle layer's bias,
// whose optimizer records lie at the start, the middle and the end of the
// swap files — at up to 4096 elements each, and the swap stores verify a
// CRC-32C of every chunk they read.
package scalebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/examples/train"
	"github.com/zinfio/zinf/internal/base/blockdev"
	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
)

// Options describe a run.
type Options struct {
	// Dir is a directory on the disk to train on (required). The swap
	// stores and the probe make directories of their own inside and
	// remove them at the end.
	Dir string
	// StateBytes is the model state to reach at least (fp32 params,
	// gradients, master weights and two Adam moments: 20 bytes per
	// parameter). Default 30 GiB.
	StateBytes int64
	// PoolBytes is the pinned pool (zinf.tiers.cpu_pinned_bytes). Default
	// 1 GiB.
	PoolBytes int64
	// Width is the layers' width (Width x Width weights). Default 2048.
	Width int
	// Steps is the number of training steps. Default 3.
	Steps int
	// ProbeBytes is the file the bandwidth is measured with, before and
	// after training, through the engine training uses. Default 512 MiB.
	ProbeBytes int64
	// MixedSeconds is how long the mixed probe runs, before and after
	// training, after the separate read and write probes: a stream
	// reading one file of ProbeBytes and another writing a second at
	// once, through the engine training uses (iobench.RunMixed). 0: 10 s;
	// negative: no mixed probe.
	MixedSeconds float64
	// MixedBytes is each of the mixed probe's two files. Default
	// ProbeBytes. It takes disk, not memory (the probe moves 16 MiB
	// requests through 64 MiB of buffers): a disk whose rate depends on
	// how much of it a load spans (a host caching part of a virtual disk)
	// is measured as a large step finds it only over files as large.
	MixedBytes int64
	// Variant is the configuration trained: VariantFP32 (default: fp32
	// parameters and states, every gradient through NVMe and back) or
	// VariantCompact (bf16 parameters with fp32 masters, 8-bit moments,
	// gradients kept in pinned memory where the pool has room).
	Variant string
	// Progress receives the plan, a line per phase and per step (nil:
	// silent).
	Progress io.Writer
	// Logger receives the runtime's warnings.
	Logger *slog.Logger
}

// The configurations the bench trains (Options.Variant).
const (
	// VariantFP32 is today's configuration: fp32 parameters, fp32 master
	// and moments, zinf.pinned_grads off (every gradient written behind
	// and read back): 44 bytes per parameter per step.
	VariantFP32 = "fp32"
	// VariantCompact is the compact one: bf16.enabled (bf16
	// parameters read for compute, fp32 masters), zinf.optimizer_states
	// 8bit and zinf.pinned_grads auto.
	VariantCompact = "compact"
)

// Variants lists the configurations Options.Variant names.
var Variants = []string{VariantFP32, VariantCompact}

// DefaultMixedSeconds is Options.MixedSeconds's default.
const DefaultMixedSeconds = 10

// mixed says whether the run has a mixed probe.
func (o *Options) mixed() bool { return o.MixedSeconds > 0 }

// RSSHeadroomBytes is what the bench allows the process beyond the pinned
// pool: the Go heap (a layer's weights and gradients for the loop, the
// sampled check's reads), the simulated GPU's working set, stacks and
// code. Resident memory above pool + headroom means something grows with
// the model.
const RSSHeadroomBytes = 256 << 20

// Bandwidth is one measurement of the path, GB/s (1e9 bytes).
type Bandwidth struct {
	ReadGBps  float64 `json:"read_gbps"`
	WriteGBps float64 `json:"write_gbps"`
	// Mixed is the disk under the mixed probe (nil without one): what a
	// sustained load of reads and writes at once got.
	Mixed *iobench.MixedResult `json:"mixed,omitempty"`
}

// Result is what a run measured.
type Result struct {
	Dir        string `json:"dir"`
	Layers     int    `json:"layers"`
	Width      int    `json:"width"`
	Params     int64  `json:"params"`
	StateBytes int64  `json:"state_bytes"`
	PoolBytes  int64  `json:"pool_bytes"`
	// MemTotalBytes is the machine's memory (MemTotal).
	MemTotalBytes int64 `json:"mem_total_bytes"`
	// DiskNeedBytes is what the run checked was free (the swap stores'
	// bound with copy-on-write copies, and the probe file);
	// DiskFreeBytes what was.
	DiskNeedBytes int64 `json:"disk_need_bytes"`
	DiskFreeBytes int64 `json:"disk_free_bytes"`
	// PeakRSSBytes is the process's peak resident set while training
	// (VmHWM, reset after the bandwidth probe); RSSBudgetBytes the pool
	// plus RSSHeadroomBytes.
	PeakRSSBytes   int64 `json:"peak_rss_bytes"`
	RSSBudgetBytes int64 `json:"rss_budget_bytes"`
	// PinnedLocked says whether the pool was locked in RAM.
	PinnedLocked bool `json:"pinned_locked"`
	// Before and After are the path's bandwidth measured just before and
	// just after training.
	Before, After Bandwidth
	// Per step: time, time the loop waited for I/O, NVMe bytes read and
	// written (all stores), and the disk-bound prediction: read bytes at
	// the mean measured read bandwidth plus written bytes at the mean
	// write bandwidth.
	StepMs     []float64 `json:"step_ms"`
	IOWaitMs   []float64 `json:"io_wait_ms"`
	ReadBytes  []int64   `json:"read_bytes"`
	WriteBytes []int64   `json:"write_bytes"`
	// ServedBytes are each step's gradient bytes the optimizer took from
	// the pinned copy of a write still in flight instead of reading them
	// back (not in ReadBytes: the disk never moved them again).
	ServedBytes []int64   `json:"grad_served_bytes"`
	PredictedMs []float64 `json:"predicted_ms"`
	// MixedPredictedMs is each step's bytes (read and written) at the
	// mixed probes' mean rate: the disk-bound time when the disk gives a
	// step's concurrent reads and writes what it gave the mixed probe
	// (empty without one).
	MixedPredictedMs []float64 `json:"mixed_predicted_ms,omitempty"`
	// Per step, from the disk's own counters (Disk; every process's I/O):
	// DiskBusy is the fraction of the step the disk had a request in
	// flight (io_ticks), DiskBusyGBps the bytes it moved (read and
	// written) per second busy, DiskInFlight the requests in flight on
	// average while busy. Each step's window runs from the end of the one
	// before to its own end, the sampled check's few reads included; the
	// first step's start is not marked, so its figures, and every figure
	// where the disk's counters have no times, are 0. A step at the
	// disk's speed keeps it busy throughout (DiskBusy near 1) and moves
	// the probe's bandwidth while busy.
	DiskBusy     []float64 `json:"disk_busy"`
	DiskBusyGBps []float64 `json:"disk_busy_gbps"`
	DiskInFlight []float64 `json:"disk_in_flight"`
	// Medians over the steps; Ratio is predicted / achieved (1: the step
	// runs at the disk's measured speed).
	StepMsMedian      float64 `json:"step_ms_median"`
	PredictedMsMedian float64 `json:"predicted_ms_median"`
	Ratio             float64 `json:"predicted_over_achieved"`
	// MixedPredictedMsMedian and MixedRatio are the same against the
	// mixed probes (0 without them).
	MixedPredictedMsMedian float64 `json:"mixed_predicted_ms_median,omitempty"`
	MixedRatio             float64 `json:"mixed_predicted_over_achieved,omitempty"`
	// InitSeconds is the time to open the runtimes and write the initial
	// state; Seconds the whole run.
	InitSeconds float64 `json:"init_seconds"`
	Seconds     float64 `json:"seconds"`
	// SampleChecked counts the element updates and reads the sampled check
	// compared; Sampled names its tensors.
	SampleChecked int64    `json:"sample_checked"`
	Sampled       []string `json:"sampled"`
	FinalLoss     float32  `json:"final_loss"`
	// ZinfReadBytes and ZinfWrittenBytes are what the swap stores' requests
	// moved on the device from the runtimes' open to their close (padded
	// to the alignment, ranged reads widened to whole checksum units: the
	// bytes the device's counters see); DiskReadBytes and DiskWrittenBytes
	// what the disk under the path (Disk, "" when there is none) moved
	// meanwhile, for everyone (other processes, the filesystem's metadata
	// and journal included).
	ZinfReadBytes    int64  `json:"zinf_read_bytes"`
	ZinfWrittenBytes int64  `json:"zinf_written_bytes"`
	Disk             string `json:"disk,omitempty"`
	DiskReadBytes    int64  `json:"disk_read_bytes"`
	DiskWrittenBytes int64  `json:"disk_written_bytes"`
	// ProcReadBytes and ProcWrittenBytes are what this process made the
	// block layer read and write meanwhile (/proc/self/io; ProcCounted
	// false where the system does not say): the disk's figures less every
	// other process's I/O, to hold zinf's own count against.
	ProcReadBytes    int64  `json:"process_read_bytes"`
	ProcWrittenBytes int64  `json:"process_written_bytes"`
	ProcCounted      bool   `json:"process_counted"`
	Backend          string `json:"backend"`
	// Variant is the configuration trained (Options.Variant).
	Variant string `json:"variant"`
	// DiskStepBytes are the bytes the disk under the path (Disk) read and
	// wrote in each step's window (from the end of the step before: 0 for
	// the first step, whose start is not marked, and where the disk has no
	// counters), every process's I/O: the step's bytes measured at the
	// disk.
	DiskStepBytes []int64 `json:"disk_step_bytes"`
	// PlanReadBytes and PlanWrittenBytes are the NVMe bytes a step moves as
	// the plan predicts them (zinf.PlanModel's placement: parameters in
	// their dtype, optimizer states at their format's size, no round trip
	// for the gradients the reservations keep pinned); PlanStepMs the
	// plan's predicted step at the bandwidth measured before training,
	// the simulated compute not counted.
	PlanReadBytes    int64   `json:"plan_read_bytes"`
	PlanWrittenBytes int64   `json:"plan_written_bytes"`
	PlanStepMs       float64 `json:"plan_step_ms"`
	// GradKeptElems of GradElems are the gradient elements the plan keeps
	// in pinned memory for the whole step.
	GradKeptElems int64 `json:"grad_kept_elems"`
	GradElems     int64 `json:"grad_elems"`
}

// PlanBytesPerParam is the plan's bytes per parameter per step.
func (r *Result) PlanBytesPerParam() float64 {
	return float64(r.PlanReadBytes+r.PlanWrittenBytes) / float64(max(r.Params, 1))
}

// DiskBytesPerParam is the median of the steps' bytes per parameter
// measured at the disk (DiskStepBytes, the steps after the first), 0
// where none was measured.
func (r *Result) DiskBytesPerParam() float64 {
	var per []float64
	for i, b := range r.DiskStepBytes {
		if i > 0 && b > 0 {
			per = append(per, float64(b)/float64(max(r.Params, 1)))
		}
	}
	if len(per) == 0 {
		return 0
	}
	return stats.Median(per)
}

func (o *Options) defaults() {
	if o.StateBytes == 0 {
		o.StateBytes = 30 << 30
	}
	if o.PoolBytes == 0 {
		o.PoolBytes = 1 << 30
	}
	if o.Width == 0 {
		o.Width = 2048
	}
	if o.Steps == 0 {
		o.Steps = 3
	}
	if o.ProbeBytes == 0 {
		o.ProbeBytes = 512 << 20
	}
	if o.MixedSeconds == 0 {
		o.MixedSeconds = DefaultMixedSeconds
	}
	if o.MixedBytes == 0 {
		o.MixedBytes = o.ProbeBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Variant == "" {
		o.Variant = VariantFP32
	}
}

// check reports every bad option at once.
func (o *Options) check() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("--path is required: a directory on the disk to train on"))
	} else if fi, err := os.Stat(o.Dir); err != nil {
		errs = append(errs, fmt.Errorf("--path %s: %w", o.Dir, err))
	} else if !fi.IsDir() {
		errs = append(errs, fmt.Errorf("--path %s is not a directory", o.Dir))
	}
	if o.StateBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("--state %d is invalid: at least 1MiB", o.StateBytes))
	}
	if o.PoolBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("--pool %d is invalid: at least 1MiB", o.PoolBytes))
	}
	if o.Width < 8 || o.Width > 1<<14 {
		errs = append(errs, fmt.Errorf("--width %d is invalid (allowed: 8..16384)", o.Width))
	}
	if o.Steps < 1 || o.Steps > 1000 {
		errs = append(errs, fmt.Errorf("--steps %d is invalid (allowed: 1..1000)", o.Steps))
	}
	if o.ProbeBytes < 1<<20 || o.ProbeBytes%(1<<20) != 0 {
		errs = append(errs, fmt.Errorf("--probe-size %d is invalid: a whole number of MiB, at least 1MiB", o.ProbeBytes))
	}
	if o.MixedBytes < 1<<20 || o.MixedBytes%(1<<20) != 0 {
		errs = append(errs, fmt.Errorf("--mixed-size %d is invalid: a whole number of MiB, at least 1MiB", o.MixedBytes))
	}
	if o.MixedSeconds > 600 {
		errs = append(errs, fmt.Errorf("--mixed-seconds %g is invalid (allowed: up to 600 seconds; 0: 10; negative: no mixed probe)", o.MixedSeconds))
	}
	if !slices.Contains(Variants, o.Variant) {
		errs = append(errs, fmt.Errorf("--configs %q is invalid (allowed: %s)", o.Variant, strings.Join(Variants, ", ")))
	}
	return errors.Join(errs...)
}

// spec is the model: layers of Width x Width, enough of them for the
// state asked for.
func (o *Options) spec() train.Spec {
	perLayer := 20 * int64(o.Width*o.Width+o.Width)
	layers := int((o.StateBytes + perLayer - 1) / perLayer)
	return train.Spec{Layers: max(layers, 2), Width: o.Width, Batch: 1, Seed: 1}
}

// Config is the configuration the bench trains with on dir: everything on
// NVMe (no max_in_cpu cache), a pool of poolBytes, a simulated GPU just
// large enough for its working set, one optimizer sub-group per weight
// (and pieces of a weight, so that the sub-group is not capped), O_DIRECT
// required, checksums on.
func Config(dir string, poolBytes int64, width int) (*config.Config, error) {
	return VariantConfig(dir, poolBytes, width, VariantFP32)
}

// VariantConfig is Config for the configuration variant names
// (VariantFP32: Config's; VariantCompact: the same with bf16.enabled,
// zinf.optimizer_states 8bit and zinf.pinned_grads auto).
func VariantConfig(dir string, poolBytes int64, width int, variant string) (*config.Config, error) {
	c := config.Default()
	c.SetScratchDir(dir)
	c.Zinf.Device = config.DeviceSim
	c.Zinf.Tiers.CPUPinnedBytes = config.Size(poolBytes)
	// Two layers of parameters and one of gradients, fp32, and room.
	c.Zinf.Tiers.GPUBytes = config.Size(max(64<<20, 4*int64(width*width)*4))
	c.Zinf.Direct = config.DirectRequired
	c.Zinf.Checksums = true
	c.Zinf.PipelineDepth = 2
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.ZeroOptimization.OffloadParam.BufferSize = 1 // raised to the largest parameter
	c.ZeroOptimization.SubGroupSize = int64(width * width)
	// One sub-group per weight needs pieces of a whole weight: the default
	// piece (plan.DefaultPieceBytes, 4 MiB) caps a sub-group at a piece of
	// gradient, which at width 2048 would quarter the sub-groups and the
	// optimizer's pipeline (1436 sub-groups a step instead of 359).
	c.Zinf.PieceBytes = config.Size(4 * int64(width*width))
	// Today's fp32 configuration: every gradient through NVMe and back
	// (the 24 and 20 bytes per parameter the bench reports against).
	c.Zinf.PinnedGrads = config.PinnedGradsOff
	switch variant {
	case VariantFP32:
	case VariantCompact:
		c.BF16 = true
		c.Zinf.OptimizerStates = config.OptimizerStates8Bit
		c.Zinf.PinnedGrads = config.PinnedGradsAuto
	default:
		return nil, fmt.Errorf("--configs %q is invalid (allowed: %s)", variant, strings.Join(Variants, ", "))
	}
	c.AIO.QueueDepth = 32
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// diskNeed is the disk the run takes in dir: what zinf.PlanModel says
// the swap stores need there (every tensor with its copy-on-write copies,
// padded and striped as the stores do: what Open checks too), plus the
// bandwidth probe's file.
func diskNeed(ctx context.Context, spec train.Spec, cfg *config.Config, probe int64, log *slog.Logger) (int64, error) {
	p, err := zinf.PlanModel(ctx, cfg, spec.Model(), zinf.Options{NoBandwidthProbe: true, Logger: log})
	if err != nil {
		return 0, err
	}
	return p.DiskBytes() + probe, nil
}

// planned fills r's plan figures: what zinf.PlanModel predicts a step of
// cfg moves and takes at the bandwidth cfg gives.
func planned(ctx context.Context, r *Result, spec train.Spec, cfg *config.Config, log *slog.Logger) error {
	p, err := zinf.PlanModel(ctx, cfg, spec.Model(), zinf.Options{NoBandwidthProbe: true, Logger: log})
	if err != nil {
		return err
	}
	pr := p.Placement.Predicted
	r.PlanReadBytes, r.PlanWrittenBytes, r.PlanStepMs = pr.NVMeReadBytes, pr.NVMeWriteBytes, float64(pr.Total)/1e6
	r.GradKeptElems, r.GradElems = p.Reservations.GradKeptElems, p.Reservations.GradElems
	return nil
}

// stateBytes is the model state of params parameters in cfg's
// configuration: parameters in their dtype, fp32 gradients, and the
// optimizer's records (fp32 master and the moments in their format).
func stateBytes(cfg *config.Config, spec train.Spec) int64 {
	var n int64
	h := plan.Hyper(cfg)
	for _, d := range spec.Model().Tensors {
		e, _ := d.Numel()
		f := plan.StateFormatOf(cfg)
		if ff := plan.StateFormatForOf(cfg); ff != nil {
			f = ff(d.Name, int(e))
		}
		n += e*int64(plan.ParamDType(cfg).Size()) + 4*e + f.RecordBytes(h, e)
	}
	return n
}

// ErrNoSpace is matched by the refusal of a run the disk cannot hold.
var ErrNoSpace = errors.New("not enough free disk space")

// Run trains as o says and measures.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.defaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	start := time.Now()
	spec := o.spec()
	cfg, err := VariantConfig(o.Dir, o.PoolBytes, o.Width, o.Variant)
	if err != nil {
		return nil, err
	}
	res := &Result{Dir: o.Dir, Layers: spec.Layers, Width: spec.Width, Params: spec.ParamCount(), StateBytes: stateBytes(cfg, spec),
		PoolBytes: o.PoolBytes, RSSBudgetBytes: o.PoolBytes + RSSHeadroomBytes, MemTotalBytes: memTotal(), Variant: o.Variant}
	probeFiles := o.ProbeBytes
	if o.mixed() {
		// The mixed probe's two files, after the separate probes' one is
		// removed.
		probeFiles = max(o.ProbeBytes, 2*o.MixedBytes)
	}
	if res.DiskNeedBytes, err = diskNeed(ctx, spec, cfg, probeFiles, o.Logger); err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(o.Dir, &st); err != nil {
		return nil, fmt.Errorf("--path %s: %w", o.Dir, err)
	}
	res.DiskFreeBytes = int64(st.Bavail) * int64(st.Bsize)
	if res.DiskFreeBytes < res.DiskNeedBytes {
		return res, fmt.Errorf("%w: %s of model state needs %s (%d bytes) free on %s (the swap stores with their copy-on-write copies as zinf plan counts them, and %s of bandwidth probe files); %s (%d bytes) are free: free space, choose another --path or a smaller --state",
			ErrNoSpace, policy.FormatBytes(res.StateBytes), policy.FormatBytes(res.DiskNeedBytes), res.DiskNeedBytes, o.Dir,
			policy.FormatBytes(probeFiles), policy.FormatBytes(res.DiskFreeBytes), res.DiskFreeBytes)
	}
	say := func(format string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, format+"\n", a...)
		}
	}
	say("bench-scale: %s configuration, %d layers x width %d: %d params, %s of model state (%.1fx this machine's %s of memory) through a %s pinned pool; disk: %s needed, %s free on %s",
		o.Variant, spec.Layers, spec.Width, res.Params, policy.FormatBytes(res.StateBytes), float64(res.StateBytes)/float64(max(res.MemTotalBytes, 1)),
		policy.FormatBytes(res.MemTotalBytes), policy.FormatBytes(o.PoolBytes), policy.FormatBytes(res.DiskNeedBytes), policy.FormatBytes(res.DiskFreeBytes), o.Dir)

	// The swap stores make their own run directories in the path and
	// remove them at Close; a run killed before that (SIGKILL, SIGPIPE)
	// leaves them where the next run on the path, or any zinf run there,
	// removes them (and zinf doctor reports them). The probe's file lives
	// in a run directory of the bench's own, locked in the same way: the
	// next run removes one a killed run left, and zinf doctor counts it.
	rd, err := swapper.NewRunDir(o.Dir, "bench-scale-probe", o.Logger)
	if err != nil {
		return res, fmt.Errorf("--path %s: %w", o.Dir, err)
	}
	defer rd.Close()
	dir := rd.Path()
	eo := plan.EngineOptions(cfg, o.Logger, nil)
	probe := func(when string) (Bandwidth, error) {
		var b Bandwidth
		backend := ""
		for _, op := range []string{"write", "read"} {
			r, err := iobench.Run(ctx, iobench.Options{Dir: dir, SizeBytes: o.ProbeBytes, Op: op, Loops: 3, Warmup: 0, Engine: eo,
				Keep: op == "write", FileName: "zinf-bench-scale-probe.dat", Logger: o.Logger})
			if err != nil {
				return b, fmt.Errorf("bandwidth probe %s: %w", when, err)
			}
			if op == "read" {
				b.ReadGBps = r.GBpsMedian
			} else {
				b.WriteGBps = r.GBpsMedian
			}
			backend = r.Backend
		}
		os.Remove(filepath.Join(dir, "zinf-bench-scale-probe.dat"))
		say("bandwidth %s training (zinf io, %s, block %s, queue depth %d: %s x 3, median): read %.3f GB/s, write %.3f GB/s",
			when, backend, policy.FormatBytes(int64(eo.BlockSizeBytes)), eo.QueueDepth, policy.FormatBytes(o.ProbeBytes), b.ReadGBps, b.WriteGBps)
		if o.mixed() {
			m, err := iobench.RunMixed(ctx, iobench.MixedOptions{Dir: dir, SizeBytes: o.MixedBytes, Engine: eo, Logger: o.Logger,
				Duration: time.Duration(o.MixedSeconds * float64(time.Second))})
			if err != nil {
				return b, fmt.Errorf("mixed bandwidth probe %s: %w", when, err)
			}
			b.Mixed = m
			say("bandwidth %s training, mixed (a file of %s read and another written at once, %d requests of %s in flight each, %.0f s): %.3f GB/s (read %.3f, write %.3f)",
				when, policy.FormatBytes(m.SizeBytes), m.InFlight, policy.FormatBytes(m.ChunkBytes), m.Seconds, m.GBps, m.ReadGBps, m.WriteGBps)
		}
		return b, nil
	}
	if res.Before, err = probe("before"); err != nil {
		return res, err
	}
	// The probe's pinned buffer is freed; peak RSS counts from here.
	resetPeakRSS()
	// The planner gets the bandwidth just measured (and so does not
	// probe the path, or cache a figure there, at Open).
	cfg.Zinf.Bandwidth.ReadBytesPerSec = config.Size(res.Before.ReadGBps * 1e9)
	cfg.Zinf.Bandwidth.WriteBytesPerSec = config.Size(res.Before.WriteGBps * 1e9)
	cfg.Zinf.Bandwidth.Probe = false
	if err := planned(ctx, res, spec, cfg, o.Logger); err != nil {
		return res, err
	}

	last := spec.Layers - 1
	res.Sampled = []string{train.WeightName(0), train.WeightName(last), train.BiasName(last), train.BiasName(last / 2)}
	if o.Variant == VariantCompact {
		// The sampled check applies the fp32 rule in memory: the weights'
		// 8-bit moments are checked bit for bit by the optimizer's own
		// tests, the biases (under optimizer.MinCompressedElems elements)
		// keep fp32 states and are checked here, their reads against
		// their masters in bf16.
		res.Sampled = []string{train.BiasName(last), train.BiasName(last / 2), train.BiasName(0)}
	}
	say("opening the runtime and writing the initial state (%s to NVMe)...", policy.FormatBytes(res.StateBytes))
	disk, diskErr := blockdev.Of(o.Dir)
	var disk0 blockdev.Stat
	if diskErr == nil {
		disk0, diskErr = blockdev.ReadStat(disk.Name)
	}
	proc0, procErr := blockdev.ProcessIO()
	// The disk's counters at the end of every step: busy time and
	// requests in flight per step.
	var marks []diskMark
	onStep := func(int) error {
		if diskErr == nil {
			st, err := blockdev.ReadStat(disk.Name)
			marks = append(marks, diskMark{at: time.Now(), st: st, ok: err == nil})
		}
		return nil
	}
	// No state digest: it would read about 4/5 of the state back after the
	// last step, which the bench neither needs nor reports.
	tr, err := train.Run(ctx, train.Options{Config: cfg, Spec: spec, Steps: o.Steps, Sample: res.Sampled, Progress: o.Progress, Logger: o.Logger, NoStateDigest: true,
		OnStep: onStep})
	if err != nil {
		return res, err
	}
	res.PeakRSSBytes = peakRSS()
	res.ZinfReadBytes, res.ZinfWrittenBytes = tr.DeviceReadBytes+tr.DigestReadBytes, tr.DeviceWrittenBytes
	if procErr == nil {
		if proc1, err := blockdev.ProcessIO(); err == nil {
			res.ProcReadBytes, res.ProcWrittenBytes = proc1.BytesRead-proc0.BytesRead, proc1.BytesWritten-proc0.BytesWritten
			res.ProcCounted = true
		}
	}
	if diskErr == nil {
		if disk1, err := blockdev.ReadStat(disk.Name); err == nil {
			res.Disk = disk.Name
			res.DiskReadBytes, res.DiskWrittenBytes = disk1.BytesRead-disk0.BytesRead, disk1.BytesWritten-disk0.BytesWritten
		}
	}
	res.InitSeconds = tr.InitSeconds
	if res.After, err = probe("after"); err != nil {
		return res, err
	}
	res.StepMs, res.ReadBytes, res.WriteBytes, res.ServedBytes = tr.StepMs, tr.StepReadBytes, tr.StepWrittenBytes, tr.StepGradServedBytes
	res.PinnedLocked = tr.PinnedLocked
	res.SampleChecked = tr.SampleChecked
	res.FinalLoss = tr.FinalLoss
	res.Backend = tr.Backend
	rbw := (res.Before.ReadGBps + res.After.ReadGBps) / 2 * 1e9
	wbw := (res.Before.WriteGBps + res.After.WriteGBps) / 2 * 1e9
	for i := range res.StepMs {
		res.PredictedMs = append(res.PredictedMs, (float64(res.ReadBytes[i])/rbw+float64(res.WriteBytes[i])/wbw)*1e3)
	}
	res.IOWaitMs = tr.IOWaitMs
	res.DiskBusy = make([]float64, len(res.StepMs))
	res.DiskBusyGBps = make([]float64, len(res.StepMs))
	res.DiskInFlight = make([]float64, len(res.StepMs))
	res.DiskStepBytes = make([]int64, len(res.StepMs))
	for i := 1; i < len(marks) && i < len(res.StepMs); i++ {
		res.DiskBusy[i], res.DiskBusyGBps[i], res.DiskInFlight[i] = diskWindow(marks[i-1], marks[i])
		if a, b := marks[i-1], marks[i]; a.ok && b.ok {
			res.DiskStepBytes[i] = b.st.BytesRead - a.st.BytesRead + b.st.BytesWritten - a.st.BytesWritten
		}
	}
	res.StepMsMedian = stats.Median(res.StepMs)
	res.PredictedMsMedian = stats.Median(res.PredictedMs)
	res.Ratio = res.PredictedMsMedian / res.StepMsMedian
	if res.Before.Mixed != nil && res.After.Mixed != nil {
		mbw := (res.Before.Mixed.GBps + res.After.Mixed.GBps) / 2 * 1e9
		for i := range res.StepMs {
			res.MixedPredictedMs = append(res.MixedPredictedMs, float64(res.ReadBytes[i]+res.WriteBytes[i])/mbw*1e3)
		}
		res.MixedPredictedMsMedian = stats.Median(res.MixedPredictedMs)
		res.MixedRatio = res.MixedPredictedMsMedian / res.StepMsMedian
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// diskMark is a disk's counters at an instant.
type diskMark struct {
	at time.Time
	st blockdev.Stat
	ok bool
}

// diskWindow is what the disk did between two marks: the fraction of the
// time it was busy, the bytes it moved per second busy (GB/s) and the
// requests in flight on average while busy; zeros where a mark is missing,
// the counters have no times or the disk was never busy.
func diskWindow(a, b diskMark) (busy, gbps, inFlight float64) {
	wall := b.at.Sub(a.at).Seconds()
	if !a.ok || !b.ok || !a.st.Timed || !b.st.Timed || wall <= 0 || b.st.Busy <= a.st.Busy {
		return 0, 0, 0
	}
	bs := (b.st.Busy - a.st.Busy).Seconds()
	moved := float64(b.st.BytesRead - a.st.BytesRead + b.st.BytesWritten - a.st.BytesWritten)
	// io_ticks count in jiffies: a window may read a little over its wall
	// time.
	return min(bs/wall, 1), moved / bs / 1e9, (b.st.InFlight - a.st.InFlight).Seconds() / bs
}

// versus says how zinf's count of bytes compares with a counter's
// (this process's or the disk's).
func versus(zinf, counter int64) string {
	if counter <= 0 {
		return "against none counted"
	}
	return fmt.Sprintf("%+.1f%%", (float64(zinf)-float64(counter))/float64(counter)*100)
}

// Write prints the report.
func (r *Result) Write(w io.Writer) error {
	fmt.Fprintf(w, "\nbench-scale on %s (backend %s): %d layers x %d, %d params\n", r.Dir, r.Backend, r.Layers, r.Width, r.Params)
	fmt.Fprintf(w, "  model state  %s (%d bytes) = %.2fx the machine's memory (%s)\n", policy.FormatBytes(r.StateBytes), r.StateBytes,
		float64(r.StateBytes)/float64(max(r.MemTotalBytes, 1)), policy.FormatBytes(r.MemTotalBytes))
	within := "within"
	if r.PeakRSSBytes > r.RSSBudgetBytes {
		within = "ABOVE"
	}
	fmt.Fprintf(w, "  peak RSS     %s (%d bytes), %s the pinned pool %s + %s = %s (pool locked: %v)\n", policy.FormatBytes(r.PeakRSSBytes), r.PeakRSSBytes,
		within, policy.FormatBytes(r.PoolBytes), policy.FormatBytes(RSSHeadroomBytes), policy.FormatBytes(r.RSSBudgetBytes), r.PinnedLocked)
	fmt.Fprintf(w, "  bandwidth    before: read %.3f GB/s, write %.3f GB/s; after: read %.3f GB/s, write %.3f GB/s\n",
		r.Before.ReadGBps, r.Before.WriteGBps, r.After.ReadGBps, r.After.WriteGBps)
	fmt.Fprintf(w, "  %-5s %10s %10s %12s %12s %12s %8s %10s %10s %9s\n", "step", "time ms", "io-wait", "read", "written", "disk-bound", "pred/ach",
		"disk busy", "GB/s busy", "in flight")
	var busy, gbps, inFlight []float64
	for i := range r.StepMs {
		fmt.Fprintf(w, "  %-5d %10.0f %10.0f %12s %12s %9.0f ms %8.2f", i+1, r.StepMs[i], r.IOWaitMs[i], policy.FormatBytes(r.ReadBytes[i]),
			policy.FormatBytes(r.WriteBytes[i]), r.PredictedMs[i], r.PredictedMs[i]/r.StepMs[i])
		if i < len(r.DiskBusy) && r.DiskBusy[i] > 0 {
			fmt.Fprintf(w, " %9.0f%% %10.2f %9.1f\n", 100*r.DiskBusy[i], r.DiskBusyGBps[i], r.DiskInFlight[i])
			busy, gbps, inFlight = append(busy, r.DiskBusy[i]), append(gbps, r.DiskBusyGBps[i]), append(inFlight, r.DiskInFlight[i])
		} else {
			fmt.Fprintf(w, " %10s %10s %9s\n", "-", "-", "-")
		}
	}
	fmt.Fprintf(w, "  median step %.0f ms, disk-bound prediction %.0f ms: predicted/achieved %.2f\n", r.StepMsMedian, r.PredictedMsMedian, r.Ratio)
	fmt.Fprintf(w, "  bytes per parameter per step (%s): at the disk %s, zinf's stores %.2f, the plan %.2f (%d of %d gradient elements kept pinned); the plan's step %.0f ms\n",
		r.Variant, perParam(r.DiskBytesPerParam(), r.PlanBytesPerParam()), r.StoreBytesPerParam(), r.PlanBytesPerParam(), r.GradKeptElems, r.GradElems, r.PlanStepMs)
	if r.MixedRatio > 0 {
		fmt.Fprintf(w, "  at the mixed probes' rate (%.3f GB/s before, %.3f after, reads and writes at once) the steps' bytes take %.0f ms: predicted/achieved %.2f\n",
			r.Before.Mixed.GBps, r.After.Mixed.GBps, r.MixedPredictedMsMedian, r.MixedRatio)
	}
	var served int64
	for _, b := range r.ServedBytes {
		served += b
	}
	if served > 0 {
		fmt.Fprintf(w, "  gradients served from pinned memory while written (not read back from NVMe): %s in %d steps\n", policy.FormatBytes(served), len(r.ServedBytes))
	}
	if len(busy) > 0 {
		// The prediction's rate for the steps' mix: their bytes over the
		// time reading and writing one after the other at the probes'
		// mean bandwidth.
		var rb, wb int64
		for i := range r.ReadBytes {
			rb, wb = rb+r.ReadBytes[i], wb+r.WriteBytes[i]
		}
		mix := float64(rb+wb) / (float64(rb)/((r.Before.ReadGBps+r.After.ReadGBps)/2) + float64(wb)/((r.Before.WriteGBps+r.After.WriteGBps)/2))
		fmt.Fprintf(w, "  disk %s in the steps after the first (medians, every process's I/O): busy %.0f%% of the step, moving %.2f GB/s while busy with %.1f requests in flight; the probes give %.2f GB/s for the steps' mix read and written one after the other\n",
			r.Disk, 100*stats.Median(busy), stats.Median(gbps), stats.Median(inFlight), mix)
	}
	fmt.Fprintf(w, "  init %.1f s, whole run %.1f s; final loss %.6f\n", r.InitSeconds, r.Seconds, r.FinalLoss)
	fmt.Fprintf(w, "  zinf's stores from open to close: read %s, written %s (device bytes: padded, whole checksum units)\n",
		policy.FormatBytes(r.ZinfReadBytes), policy.FormatBytes(r.ZinfWrittenBytes))
	if r.ProcCounted {
		fmt.Fprintf(w, "  this process meanwhile (/proc/self/io): read %s (zinf's count %s), written %s (%s)\n",
			policy.FormatBytes(r.ProcReadBytes), versus(r.ZinfReadBytes, r.ProcReadBytes),
			policy.FormatBytes(r.ProcWrittenBytes), versus(r.ZinfWrittenBytes, r.ProcWrittenBytes))
	}
	if r.Disk != "" {
		fmt.Fprintf(w, "  disk %s meanwhile, every process: read %s (zinf's count %s), written %s (%s)\n", r.Disk,
			policy.FormatBytes(r.DiskReadBytes), versus(r.ZinfReadBytes, r.DiskReadBytes),
			policy.FormatBytes(r.DiskWrittenBytes), versus(r.ZinfWrittenBytes, r.DiskWrittenBytes))
	}
	_, err := fmt.Fprintf(w, "  sampled check: %d element updates and reads of %v equal the update rule in memory bit for bit (CRC-32C verified on every swap-in)\n",
		r.SampleChecked, r.Sampled)
	return err
}

// StoreBytesPerParam is the median of the steps' bytes per parameter as
// zinf's stores count them (ReadBytes + WriteBytes: device bytes).
func (r *Result) StoreBytesPerParam() float64 {
	per := make([]float64, len(r.ReadBytes))
	for i := range r.ReadBytes {
		per[i] = float64(r.ReadBytes[i]+r.WriteBytes[i]) / float64(max(r.Params, 1))
	}
	if len(per) == 0 {
		return 0
	}
	return stats.Median(per)
}

// perParam says a measured figure against the plan's: "18.12 (+0.4% of
// the plan)", or "not measured".
func perParam(measured, plan float64) string {
	if measured <= 0 {
		return "not measured"
	}
	if plan <= 0 {
		return fmt.Sprintf("%.2f", measured)
	}
	return fmt.Sprintf("%.2f (%+.1f%% of the plan)", measured, (measured-plan)/plan*100)
}
