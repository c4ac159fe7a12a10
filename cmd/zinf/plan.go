package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

func init() {
	register("plan", "print where a model's tensors would live, the NVMe bandwidth and disk, the pinned reservations and minimum pool, and the predicted step time", runPlan)
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plan", stderr)
	var cfgPath, model string
	var computeMs float64
	var noProbe bool
	var tbw int64
	var kvSeq int
	fs.StringVar(&cfgPath, "config", "", "config file (default: the embedded one)")
	fs.Var(sizeFlag{&tbw}, "tbw", "the NVMe drives' endurance rating (e.g. 600TB); default: the config's zinf.nvme_tbw")
	fs.StringVar(&model, "model", "layers=24,width=4096,dtype=bf16,batch=8,world=1", "model: layers=N,width=N,dtype=fp32|bf16|fp16,batch=N,world=N (dtype and world override the config's)")
	fs.Float64Var(&computeMs, "compute-ms-per-layer", 0, "compute time per layer per pass, for the prediction")
	fs.IntVar(&kvSeq, "kv-seq", 0, "plan a generation's KV cache for sequences of this many tokens: keys and values of the model's width per layer, for its batch, in its dtype, on the tier zinf.kv_cache chooses (0: none)")
	var sched string
	var micro int
	fs.StringVar(&sched, "schedule", "", "zinf.schedule: auto, layer-major or micro-batch-major (default: the config's)")
	fs.IntVar(&micro, "micro-batches", 0, "gradient_accumulation_steps: micro-batches per step (default: the config's, whose \"auto\" lets the planner pick them); the prediction counts them")
	fs.BoolVar(&noProbe, "no-probe", false, "do not probe an NVMe path's bandwidth (use the config's, the tune file's, a cached one or the default)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tbwSet := false
	fs.Visit(func(f *flag.Flag) { tbwSet = tbwSet || f.Name == "tbw" })
	compute, err := computeMsFlag(computeMs)
	if err != nil {
		return err
	}
	if err := intIn("--kv-seq", kvSeq, 0, 1<<24); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["micro-batches"] {
		if err := intIn("--micro-batches", micro, 1, math.MaxInt32); err != nil {
			return err
		}
	}
	if set["schedule"] {
		switch config.ScheduleMode(sched) {
		case config.ScheduleAuto, config.ScheduleLayerMajor, config.ScheduleMicroBatchMajor:
		default:
			return fmt.Errorf("--schedule %q: allowed: auto, layer-major, micro-batch-major", sched)
		}
	}
	m, err := policy.ParseModelSpec(model)
	if err != nil {
		return fmt.Errorf("--model: %w", err)
	}
	cfg, cleanup, err := loadConfig(cfgPath, "/nvme (not created by plan)", stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	if set["micro-batches"] {
		cfg.GradientAccumulationSteps, cfg.GradientAccumulationAuto = micro, false
	}
	if set["schedule"] {
		cfg.Zinf.Schedule = config.ScheduleMode(sched)
	}
	// The model's dtype is the parameters' dtype the runtime would use.
	if plan.ParamDType(cfg) != m.DType {
		fmt.Fprintf(stderr, "plan: parameters in %s as --model says (the config says %s)\n", m.DType, plan.ParamDType(cfg))
		cfg.BF16, cfg.FP16 = m.DType == tensor.BFloat16, m.DType == tensor.Float16
	}
	rank, _ := cfg.RankWorld()
	if rank >= m.World {
		rank = 0
	}
	p, err := zinf.PlanModel(ctx, cfg, zinf.Model{Tensors: m.Tensors(), Layers: m.Layers},
		zinf.Options{Rank: rank, WorldSize: m.World, ComputePerLayer: compute, NoBandwidthProbe: noProbe, Logger: cliLogger(stderr)})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "model %s: %d parameters\n\n", m, m.ParamCount())
	if err := p.WriteText(stdout); err != nil {
		return err
	}
	writeHideIO(stdout, p.Placement)
	plan.WritePlanStepBytes(stdout, cfg, p)
	if kvSeq > 0 {
		layerBytes := 2 * int64(max(m.Batch, 1)) * int64(kvSeq) * int64(m.Width) * int64(m.DType.Size())
		kp, err := plan.ForKVCache(cfg, m.Layers, layerBytes)
		if err != nil {
			fmt.Fprintf(stdout, "\nOpen refuses this KV cache: %v\n", err)
		} else {
			fmt.Fprintf(stdout, "\n%s\n", kp)
			if err := checkKVMemory(cfg, kp); err != nil {
				fmt.Fprintf(stdout, "\nOpen refuses this KV cache on this machine: %v\n", err)
			}
		}
	}
	res := p.Reservations
	if res.PoolBytes < res.MinPoolBytes {
		fmt.Fprintf(stdout, "\nOpen refuses this config: zinf.tiers.cpu_pinned_bytes is %s, below the minimum pool %s (%d bytes)\n",
			config.Size(res.PoolBytes), config.Size(res.MinPoolBytes), res.MinPoolBytes)
	}
	// The pool is mapped and locked whole: Open (and zinf train) refuse one
	// beyond the memory this process may take. plan still prints the plan
	// (and keeps the bandwidth it measured, as it says above): it reports.
	if err := checkPinnedPools(cfg, 1); err != nil {
		fmt.Fprintf(stdout, "\nOpen refuses this config on this machine: %v\n", err)
	}
	// Free space where the paths exist already.
	var here []swapper.SpaceNeed
	for _, d := range p.Disk {
		if st, err := os.Stat(d.Path); err == nil && st.IsDir() {
			here = append(here, d)
		}
	}
	if len(here) > 0 {
		if err := swapper.CheckSpace(here...); err != nil {
			var se *swapper.SpaceError
			if errors.As(err, &se) {
				fmt.Fprintf(stdout, "\nOpen refuses this config on this machine: %v\n", err)
			} else {
				fmt.Fprintf(stdout, "\nfree space not checked: %v\n", err)
			}
		} else {
			fmt.Fprintf(stdout, "\nfree space: the NVMe paths here hold what the plan needs (rank %d; ranks sharing a filesystem need it each)\n", p.Rank)
		}
	}
	if pr := p.Placement.Predicted; pr.NVMeWriteBytes > 0 {
		if !tbwSet {
			tbw = int64(cfg.Zinf.NVMeTBW)
		}
		fmt.Fprintln(stdout)
		what := "per rank, at the predicted step"
		if pr.Compute == 0 {
			what = "per rank, at the predicted step without compute time: an upper bound"
		}
		writeEndurance(stdout, what, pr.NVMeWriteBytes, pr.Total, tbw, cfg.NVMePaths())
		if m.World > 1 {
			fmt.Fprintf(stdout, "  the %d ranks write %d times this where they share the drives\n", m.World, m.World)
		}
	}
	return nil
}

// writeHideIO prints the micro-batches a layer-major step needs for its
// compute to cover its NVMe I/O (policy.Placement.MicroBatchesToHideIO),
// and how to give the compute when it is not known.
func writeHideIO(w io.Writer, pl *policy.Placement) {
	c := pl.MicroBatchesToHideIO()
	fmt.Fprintf(w, "\n%s\n", c)
	if c.Known() && c.IOPerStep > 0 {
		// The same compute split as training's usual: the backward pass
		// computes two products per weight, the forward one.
		cp := pl.Hints.ComputeSecondsPerLayer
		bp := pl.MicroBatchesToHideIOPasses(cp/3, 2*cp/3)
		fmt.Fprintf(w, "  by pass, the backward's compute twice the forward's (a loop that times its passes, zgomlx.Loop, measures the split): %s\n", strings.TrimPrefix(bp.String(), "micro-batches to hide the I/O: "))
	}
	switch {
	case c.IOPerStep <= 0:
	case !c.Known():
		fmt.Fprintln(w, "  give the compute: --compute-ms-per-layer (in Go: zinf.Options.ComputePerLayer, or Runtime.MicroBatchesToHideIO after a step or two, at the compute the runtime measured)")
	case c.MicroBatches > 1 && pl.Schedule != policy.ScheduleLayerMajor:
		fmt.Fprintf(w, "  in layer-major order (zinf.schedule layer-major; auto picks it at 2 or more micro-batches when it predicts it faster); this plan runs %s at %d, which reads the parameters again for every micro-batch\n", pl.Schedule, pl.MicroBatches)
	}
}
