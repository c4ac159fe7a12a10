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
	code, out, errs := runCLI(t, "bench-scale", "--path", dir, "--state", "4MiB", "--pool", "16MiB", "--width", "64", "--steps", "2", "--probe-size", "1MiB", "--json")
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
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out)
	}
	if r.StateBytes < 4<<20 || r.PeakRSSBytes <= 0 || len(r.StepMs) != 2 || len(r.PredictedMs) != 2 || r.Ratio <= 0 || r.Sampled <= 0 ||
		len(r.DiskBusy) != 2 || len(r.DiskBusyGBps) != 2 || len(r.DiskInFlight) != 2 || r.DiskBusy[1] < 0 || r.DiskBusy[1] > 1 {
		t.Fatalf("figures: %+v", r)
	}
	wantAll(t, "stderr", errs, "bench-scale:", "bandwidth before training", "step   2/2")
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("bench-scale left %v", ents)
	}
	for _, c := range [][]string{{"--state", "0"}, {"--pool", "1"}, {"--steps", "0"}, {"--width", "2"}} {
		code, _, errs := runCLI(t, append([]string{"bench-scale", "--path", dir}, c...)...)
		if code == 0 || !strings.Contains(errs, c[0]) {
			t.Errorf("%v: exit %d, %s", c, code, errs)
		}
	}
}
