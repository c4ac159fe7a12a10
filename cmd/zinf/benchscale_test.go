package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestBenchScale runs zinf bench-scale small with one configuration
// (--configs fp32): one JSON object with the figures, nothing left in
// --path; bad flags are named.
func TestBenchScale(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "bench-scale", "--configs", "fp32", "--path", dir, "--state", "4MiB", "--pool", "16MiB", "--width", "64", "--steps", "2", "--probe-size", "1MiB", "--mixed-seconds", "0.2", "--mixed-size", "2MiB", "--json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	var r struct {
		StateBytes   int64     `json:"state_bytes"`
		PeakRSSBytes int64     `json:"peak_rss_bytes"`
		StepMs       []float64 `json:"step_ms"`
		PredictedMs  []float64 `json:"predicted_ms"`
		Ratio        float64   `json:"predicted_over_achieved"`
		Sampled      int64     `json:"sample_checked"`
		DiskBusy     []float64 `json:"disk_busy"`
		DiskBusyGBps []float64 `json:"disk_busy_gbps"`
		DiskInFlight []float64 `json:"disk_in_flight"`
		Before       struct {
			Mixed *struct {
				Read  float64 `json:"read_gbps"`
				Write float64 `json:"write_gbps"`
				Sum   float64 `json:"gbps"`
				Secs  float64 `json:"seconds"`
			} `json:"mixed"`
		} `json:"Before"`
		MixedPredictedMs []float64 `json:"mixed_predicted_ms"`
		MixedRatio       float64   `json:"mixed_predicted_over_achieved"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out)
	}
	if r.StateBytes < 4<<20 || r.PeakRSSBytes <= 0 || len(r.StepMs) != 2 || len(r.PredictedMs) != 2 || r.Ratio <= 0 || r.Sampled <= 0 ||
		len(r.DiskBusy) != 2 || len(r.DiskBusyGBps) != 2 || len(r.DiskInFlight) != 2 || r.DiskBusy[1] < 0 || r.DiskBusy[1] > 1 {
		t.Fatalf("figures: %+v", r)
	}
	// The mixed probe ran both directions for its 0.2 s, and the steps'
	// bytes at its rate make the second prediction.
	if m := r.Before.Mixed; m == nil || m.Read <= 0 || m.Write <= 0 || m.Sum != m.Read+m.Write || m.Secs < 0.2 ||
		len(r.MixedPredictedMs) != 2 || r.MixedPredictedMs[1] <= 0 || r.MixedRatio <= 0 {
		t.Fatalf("mixed probe: %+v, %v, %v", m, r.MixedPredictedMs, r.MixedRatio)
	}
	wantAll(t, "stderr", errs, "bench-scale:", "bandwidth before training", "bandwidth before training, mixed", "step   2/2")
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("bench-scale left %v", ents)
	}
	for _, c := range [][]string{{"--state", "0"}, {"--pool", "1"}, {"--steps", "0"}, {"--width", "2"}, {"--mixed-seconds", "-1"}, {"--mixed-seconds", "601"}, {"--mixed-size", "1000"}, {"--configs", "fp32,int4"}, {"--configs", "fp32,fp32"}, {"--rounds", "0"}} {
		code, _, errs := runCLI(t, append([]string{"bench-scale", "--path", dir}, c...)...)
		if code == 0 || !strings.Contains(errs, c[0]) {
			t.Errorf("%v: exit %d, %s", c, code, errs)
		}
	}
}

// TestBenchScaleCompare runs make bench-scale's comparison small, as a
// user runs it (the default --configs fp32,compact): blocks alternating
// fp32, compact, compact, fp32; per configuration the median step with its
// range, bytes per parameter per step at the disk and in the plan (44 for
// fp32; bf16 parameters, 8-bit moments and kept gradients under 20), and
// the ratio of the medians; nothing left in --path.
func TestBenchScaleCompare(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "bench-scale", "--path", dir, "--state", "8MiB", "--pool", "32MiB", "--width", "256", "--steps", "2", "--rounds", "2",
		"--probe-size", "1MiB", "--mixed-seconds", "0", "--json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	var c struct {
		Blocks []struct {
			Variant string `json:"variant"`
		} `json:"blocks"`
		Configs []struct {
			Variant   string    `json:"variant"`
			StepMs    []float64 `json:"step_ms"`
			Median    float64   `json:"step_ms_median"`
			Min       float64   `json:"step_ms_min"`
			Max       float64   `json:"step_ms_max"`
			Disk      float64   `json:"disk_bytes_per_param"`
			Plan      float64   `json:"plan_bytes_per_param"`
			DiskVsPln float64   `json:"disk_vs_plan_pct"`
		} `json:"configs"`
		Ratio float64 `json:"median_ratio"`
	}
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out)
	}
	var order []string
	for _, b := range c.Blocks {
		order = append(order, b.Variant)
	}
	if strings.Join(order, ",") != "fp32,compact,compact,fp32" || len(c.Configs) != 2 {
		t.Fatalf("blocks %v, configs %+v", order, c.Configs)
	}
	for i, s := range c.Configs {
		if len(s.StepMs) != 4 || s.Min > s.Median || s.Median > s.Max || s.Min <= 0 {
			t.Errorf("%s: steps %v, median %v (%v..%v)", s.Variant, s.StepMs, s.Median, s.Min, s.Max)
		}
		if s.Disk < 0 || (s.Disk > 0 && s.DiskVsPln != (s.Disk-s.Plan)/s.Plan*100) {
			t.Errorf("%s: %v bytes per parameter at the disk, %v%% of the plan's %v", s.Variant, s.Disk, s.DiskVsPln, s.Plan)
		}
		if want := []string{"fp32", "compact"}[i]; s.Variant != want {
			t.Errorf("config %d is %s; want %s", i, s.Variant, want)
		}
	}
	if c.Configs[0].Plan != 44 || c.Configs[1].Plan >= 20 || c.Configs[1].Plan < 18 {
		t.Errorf("the plan's bytes per parameter per step: fp32 %v (want 44), compact %v (want 18..20)", c.Configs[0].Plan, c.Configs[1].Plan)
	}
	if c.Ratio != c.Configs[1].Median/c.Configs[0].Median {
		t.Errorf("ratio %v; the medians give %v", c.Ratio, c.Configs[1].Median/c.Configs[0].Median)
	}
	wantAll(t, "stderr", errs, "alternating blocks", "round 1 of 2, fp32", "round 2 of 2, fp32")
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("bench-scale left %v", ents)
	}
	// The text report: the table and the ratio.
	code, out, errs = runCLI(t, "bench-scale", "--path", dir, "--state", "8MiB", "--pool", "32MiB", "--width", "256", "--steps", "1", "--rounds", "1",
		"--probe-size", "1MiB", "--mixed-seconds", "0")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "stdout", out, "bench-scale comparison", "median step ms (range)", "disk vs plan", "median step compact / fp32")
}
