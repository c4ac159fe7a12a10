package scalebench

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
)

// TestCompareSmall compares fp32 with the compact configuration (bf16
// parameters, 8-bit moments, gradients kept pinned) on one small model:
// the blocks alternate A B, B A; every configuration gets rounds x steps
// steps; the plan counts 44 bytes per parameter per step for fp32 and, for
// the compact one with every gradient kept, 2*2 + 2 bytes of bf16
// parameters and 2*(4 + 2*(1 + 4/256)) of record for the 8-bit weights
// (the biases, under 4096 elements, keep fp32 states: 2*12 bytes); zinf's
// stores move that within 3% in every step; the ratio is the medians'; nothing is left
// in the path.
func TestCompareSmall(t *testing.T) {
	dir := t.TempDir()
	var out strings.Builder
	c, err := Compare(context.Background(), CompareOptions{Options: Options{Dir: dir, StateBytes: 8 << 20, PoolBytes: 32 << 20, Width: 256, Steps: 2,
		ProbeBytes: 1 << 20, MixedSeconds: -1, Progress: &out, Logger: quiet}, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, b := range c.Blocks {
		order = append(order, b.Variant)
	}
	if strings.Join(order, " ") != "fp32 compact compact fp32" {
		t.Fatalf("blocks ran %v; want fp32 compact compact fp32", order)
	}
	if len(c.Configs) != 2 || c.Configs[0].Variant != VariantFP32 || c.Configs[1].Variant != VariantCompact {
		t.Fatalf("configs %+v", c.Configs)
	}
	fp32, compact := c.Configs[0], c.Configs[1]
	if fp32.Params != compact.Params || fp32.Params == 0 {
		t.Fatalf("params %d and %d: the same model for both", fp32.Params, compact.Params)
	}
	n := float64(fp32.Params)
	layers := fp32.Params / (256*256 + 256)
	w, b := float64(layers*256*256), float64(layers*256)
	wantCompact := (w*(6+2*(4+2*(1+4.0/256))) + b*(6+2*12)) / n
	for _, s := range []struct {
		cfg  *ConfigSummary
		plan float64
	}{{fp32, 44}, {compact, wantCompact}} {
		if len(s.cfg.StepMs) != 4 || s.cfg.StepMsMin > s.cfg.StepMsMedian || s.cfg.StepMsMedian > s.cfg.StepMsMax || s.cfg.StepMsMin <= 0 {
			t.Errorf("%s: steps %v, median %v (%v..%v)", s.cfg.Variant, s.cfg.StepMs, s.cfg.StepMsMedian, s.cfg.StepMsMin, s.cfg.StepMsMax)
		}
		if math.Abs(s.cfg.PlanBytesPerParam-s.plan) > 1e-9 {
			t.Errorf("%s: the plan counts %v bytes per parameter per step; want %v", s.cfg.Variant, s.cfg.PlanBytesPerParam, s.plan)
		}
		// zinf's stores, with the gradients the optimizer took from a
		// write still in flight instead of reading them back (which the
		// plan counts as read), move the plan's bytes within 3%.
		for _, blk := range c.Blocks {
			if blk.Variant != s.cfg.Variant {
				continue
			}
			for i := range blk.ReadBytes {
				got := float64(blk.ReadBytes[i]+blk.ServedBytes[i]+blk.WriteBytes[i]) / n
				if d := math.Abs(got-s.plan) / s.plan; d > 0.03 {
					t.Errorf("%s: a step's stores moved %v bytes per parameter (served from pinned memory included), %.1f%% from the plan's %v", s.cfg.Variant, got, 100*d, s.plan)
				}
			}
		}
		// At the disk: every process's I/O, so only bounded below here.
		if s.cfg.DiskBytesPerParam != 0 && s.cfg.DiskBytesPerParam < 0.9*s.plan {
			t.Errorf("%s: the disk moved %v bytes per parameter per step, the plan %v", s.cfg.Variant, s.cfg.DiskBytesPerParam, s.plan)
		}
		if s.cfg.SampleChecked == 0 {
			t.Errorf("%s: no sampled check", s.cfg.Variant)
		}
	}
	if compact.StateBytes >= fp32.StateBytes || fp32.StateBytes != 20*fp32.Params {
		t.Errorf("state: fp32 %d bytes, compact %d", fp32.StateBytes, compact.StateBytes)
	}
	if c.Ratio != compact.StepMsMedian/fp32.StepMsMedian {
		t.Errorf("ratio %v; the medians give %v", c.Ratio, compact.StepMsMedian/fp32.StepMsMedian)
	}
	if c.DiskNeedBytes <= 0 || c.DiskNeedAllBytes <= c.DiskNeedBytes {
		t.Errorf("disk: %d for the largest, %d for both", c.DiskNeedBytes, c.DiskNeedAllBytes)
	}
	var sb strings.Builder
	if err := c.Write(&sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"median step compact / fp32", "disk vs plan", "fp32 ", "compact "} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, sb.String())
		}
	}
	for _, want := range []string{"alternating blocks", "round 1 of 2, fp32", "round 2 of 2, compact", "bench-scale: compact configuration", "bytes per parameter per step (compact)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the run left %v in the path", ents)
	}
}

// TestCompareBadOptions: bad configurations and rounds are named before
// anything runs.
func TestCompareBadOptions(t *testing.T) {
	dir := t.TempDir()
	_, err := Compare(context.Background(), CompareOptions{Options: Options{Dir: dir}, Variants: []string{"fp32", "fp16", "fp32"}, Rounds: -1})
	for _, want := range []string{`--configs "fp16"`, `names "fp32" twice`, "--rounds -1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if _, err := Run(context.Background(), Options{Dir: dir, Variant: "int4"}); err == nil || !strings.Contains(err.Error(), `"int4"`) {
		t.Errorf("variant int4: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("refused runs left %v", ents)
	}
}
