package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestBenchScale runs zinf bench-scale small: one JSON object with the
// figures, nothing left in --path; bad flags are named.
func TestBenchScale(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "bench-scale", "--path", dir, "--state", "4MiB", "--pool", "16MiB", "--width", "64", "--steps", "2", "--probe-size", "1MiB", "--mixed-seconds", "0.2", "--mixed-size", "2MiB", "--json")
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
	for _, c := range [][]string{{"--state", "0"}, {"--pool", "1"}, {"--steps", "0"}, {"--width", "2"}, {"--mixed-seconds", "-1"}, {"--mixed-seconds", "601"}, {"--mixed-size", "1000"}} {
		code, _, errs := runCLI(t, append([]string{"bench-scale", "--path", dir}, c...)...)
		if code == 0 || !strings.Contains(errs, c[0]) {
			t.Errorf("%v: exit %d, %s", c, code, errs)
		}
	}
}
