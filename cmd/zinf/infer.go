package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/zinfio/zinf/examples/infer"
)

func init() {
	register("infer", "run layer-streamed inference with weights on NVMe (--verify compares with in-memory)", runInfer)
}

func runInfer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("infer", stderr)
	var (
		cfgPath, dir string
		o            infer.Options
		computeMs    float64
		asJSON       bool
		seed         uint64
	)
	fs.StringVar(&cfgPath, "config", "", "config file (default: the embedded one)")
	fs.StringVar(&dir, "dir", "", "swap directory when the config names none (default: the system's temporary directory; the run removes its swap files)")
	fs.IntVar(&o.Spec.Layers, "layers", 8, "model layers")
	fs.IntVar(&o.Spec.Width, "width", 512, "layer width")
	fs.IntVar(&o.Spec.Batch, "batch", 8, "rows per batch")
	fs.Uint64Var(&seed, "seed", 1, "weights and data seed")
	fs.IntVar(&o.Batches, "batches", 4, "batches to run")
	fs.IntVar(&o.Prefetch, "prefetch", 2, "layers streamed ahead")
	fs.Float64Var(&computeMs, "compute-ms-per-layer", 0, "simulated GPU time per layer")
	fs.BoolVar(&o.Verify, "verify", false, "compare outputs with in-memory inference bit for bit")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	o.Spec.Seed = seed
	compute, cerr := computeMsFlag(computeMs)
	if err := errors.Join(positive("--batches", o.Batches), positive("--prefetch", o.Prefetch), cerr,
		modelFlags(o.Spec.Layers, o.Spec.Width, o.Spec.Batch)); err != nil {
		return err
	}
	cfg, cleanup, err := loadConfig(cfgPath, dir, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := checkPinnedPools(cfg, 1); err != nil {
		return err
	}
	o.Config = cfg
	o.ComputePerLayer = compute
	o.Logger = cliLogger(stderr)
	if !asJSON {
		o.Progress = stdout
	}
	res, err := infer.Run(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "%d batches, %d params streamed from NVMe: batch median %.1f ms, io-wait %.1f ms total, %d bytes read, %d demand misses\n",
		res.Batches, res.Params, res.BatchMsMedian, res.IOWaitMs, res.BytesRead, res.DemandMisses)
	if res.OutputEqual != nil {
		if !*res.OutputEqual {
			return fmt.Errorf("streamed outputs differ from in-memory inference")
		}
		fmt.Fprintln(stdout, "outputs equal in-memory inference bit for bit")
	}
	return nil
}
