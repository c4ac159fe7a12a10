package main

import (
	"context"
	"fmt"
	"io"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/policy"
)

func init() {
	register("plan", "print where a model's tensors would live, memory per tier and the predicted step time", runPlan)
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plan", stderr)
	var cfgPath, model string
	var computeMs float64
	fs.StringVar(&cfgPath, "config", "", "config file (default: the embedded one)")
	fs.StringVar(&model, "model", "layers=24,width=4096,dtype=bf16,batch=8,world=1", "model: layers=N,width=N,dtype=fp32|bf16|fp16,batch=N,world=N")
	fs.Float64Var(&computeMs, "compute-ms-per-layer", 0, "compute time per layer per pass, for the prediction")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	compute, err := computeMsFlag(computeMs)
	if err != nil {
		return err
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
	p, err := zinf.PlanFor(cfg, m, compute)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "model %s: %d parameters\n\n", m, m.ParamCount())
	return p.WriteTable(stdout)
}
