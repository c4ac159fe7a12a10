package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/examples/train"
	"github.com/zinfio/zinf/policy"
)

func init() {
	register("train", "run the simulated training example with offload as the config says (--verify compares with in-memory training)", runTrain)
}

// loadConfig reads --config (or the embedded default) and, when the config
// offloads to NVMe without a path, points it at dir (or a new temp dir that
// cleanup removes).
func loadConfig(path, dir string, stderr io.Writer) (cfg *config.Config, cleanup func(), err error) {
	cleanup = func() {}
	if path == "" {
		cfg = config.Default()
	} else if cfg, err = config.Load(path); err != nil {
		return nil, cleanup, err
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, "config:", w)
	}
	if cfg.NeedsScratchDir() {
		if dir == "" {
			d, err := os.MkdirTemp("", "zinf-swap-")
			if err != nil {
				return nil, cleanup, err
			}
			dir = d
			cleanup = func() { os.RemoveAll(d) }
		}
		cfg.SetScratchDir(dir)
	}
	if err := cfg.Validate(); err != nil {
		cleanup()
		return nil, func() {}, err
	}
	return cfg, cleanup, nil
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("train", stderr)
	var (
		cfgPath, dir  string
		spec          train.Spec
		o             train.Options
		computeMs     float64
		asJSON, quiet bool
	)
	fs.StringVar(&cfgPath, "config", "", "config file (DeepSpeed JSON + zinf section); default: the embedded one")
	fs.StringVar(&dir, "dir", "", "swap directory when the config names none (default: a temp dir, removed)")
	fs.IntVar(&spec.Layers, "layers", 8, "model layers")
	fs.IntVar(&spec.Width, "width", 512, "layer width")
	fs.IntVar(&spec.Batch, "batch", 8, "rows per micro-batch per rank")
	var seed uint64
	fs.Uint64Var(&seed, "seed", 1, "initialization and data seed")
	fs.IntVar(&o.Steps, "steps", 5, "optimizer steps")
	fs.BoolVar(&o.Verify, "verify", false, "also train in memory and compare final weights and optimizer states bit for bit")
	fs.Float64Var(&computeMs, "compute-ms-per-layer", 0, "simulated GPU time per layer per pass (to measure overlap)")
	fs.IntVar(&o.PrefetchDepth, "prefetch", 0, "layers to prefetch ahead (0: the policy decides)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object with the results")
	fs.BoolVar(&quiet, "quiet", false, "no per-step progress")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	spec.Seed = seed
	// Zero would silently mean "the default" below the command line.
	compute, cerr := computeMsFlag(computeMs)
	if err := errors.Join(positive("--steps", o.Steps), notNegative("--prefetch", o.PrefetchDepth), cerr,
		modelFlags(spec.Layers, spec.Width, spec.Batch)); err != nil {
		return err
	}
	cfg, cleanup, err := loadConfig(cfgPath, dir, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	o.Config, o.Spec = cfg, spec
	o.ComputePerLayer = compute
	o.Logger = cliLogger(stderr)
	if !quiet {
		o.Progress = stderr
		if !asJSON {
			o.Progress = stdout
		}
	}
	res, err := train.Run(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	return printTrainSummary(stdout, res, o.Verify)
}

func printTrainSummary(w io.Writer, r *train.Result, verify bool) error {
	fmt.Fprintf(w, "\nsummary: %d steps, %d params (%s of state), world size %d, %s, backend %s\n", r.Steps, r.Params, policy.FormatBytes(r.StateBytes), r.World, r.DType, r.Backend)
	fmt.Fprintf(w, "  step time median %.1f ms (policy predicted %.1f ms), io-wait median %.1f ms, prefetch depth %d, demand misses %d\n",
		r.StepMsMedian, r.PredictedMs, r.IOWaitMsMedian, r.PrefetchDepth, r.DemandMisses)
	if r.InMemoryStepMsMedian > 0 {
		fmt.Fprintf(w, "  overlap: the same loop in memory takes %.1f ms per step (%.1f ms of it simulated GPU time): offloaded / in-memory = %.2fx (optimizer step overlapped with backward: %v)\n",
			r.InMemoryStepMsMedian, r.ComputeMs, r.StepMsMedian/r.InMemoryStepMsMedian, r.OverlapStep)
	}
	fmt.Fprintf(w, "  NVMe: read %s (%.3f GB/s), written %s (%.3f GB/s)\n", policy.FormatBytes(r.BytesRead), r.ReadGBps, policy.FormatBytes(r.BytesWritten), r.WriteGBps)
	fmt.Fprintf(w, "  memory: peak RSS %s, pinned pool %s (locked: %v)\n", policy.FormatBytes(r.PeakRSSBytes), policy.FormatBytes(r.PinnedBytes), r.PinnedLocked)
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
