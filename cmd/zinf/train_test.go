package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTrainVerifyJSON(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "train", "--layers", "2", "--width", "32", "--steps", "2", "--verify", "--json", "--dir", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"steps", "params", "state_bytes", "bitwise_equal", "step_ms_median", "io_wait_ms_median",
		"bytes_read", "bytes_written", "peak_rss_bytes", "pinned_bytes"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if m["bitwise_equal"] != true {
		t.Fatalf("bitwise_equal = %v:\n%s", m["bitwise_equal"], out)
	}
	// 2 layers of 32x32 weights and 32 biases.
	if m["steps"] != float64(2) || m["params"] != float64(2*(32*32+32)) {
		t.Fatalf("steps %v params %v", m["steps"], m["params"])
	}
	for _, k := range []string{"state_bytes", "bytes_read", "bytes_written", "peak_rss_bytes", "pinned_bytes"} {
		if v, _ := m[k].(float64); v <= 0 {
			t.Errorf("%s = %v, want > 0 (everything is offloaded to NVMe)", k, m[k])
		}
	}
	// The runtime removes its scratch swap files from --dir.
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("train left %v in --dir", got)
	}
}

func TestTrainText(t *testing.T) {
	code, out, errs := runCLI(t, "train", "--layers", "2", "--width", "16", "--steps", "1", "--verify")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "summary", out, "summary: 1 steps", "BIT FOR BIT", "step   1/1")
}

func TestTrainBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"zero_optimization": {"offload_param": {"device": "disk"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	notJSON := filepath.Join(dir, "broken.json")
	if err := os.WriteFile(notJSON, []byte(`{"aio": {`), 0o644); err != nil {
		t.Fatal(err)
	}
	swap := filepath.Join(dir, "swap")
	if err := os.Mkdir(swap, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--config", bad}, []string{"zero_optimization.offload_param.device", `"disk"`, "none, cpu, nvme"}},
		{[]string{"--config", notJSON}, []string{"broken.json"}},
		{[]string{"--config", filepath.Join(dir, "missing.json")}, []string{"missing.json", "no such file"}},
		{[]string{"--steps", "0"}, []string{"--steps 0"}},
		{[]string{"--steps", "-1"}, []string{"--steps -1"}},
		{[]string{"--prefetch", "-1"}, []string{"--prefetch -1"}},
		{[]string{"--compute-ms-per-layer", "-2"}, []string{"--compute-ms-per-layer -2"}},
		{[]string{"--layers", "0"}, []string{"layers 0"}},
		{[]string{"--width", "-3"}, []string{"width -3"}},
	} {
		args := append([]string{"train", "--layers", "2", "--width", "16", "--steps", "1", "--dir", swap}, c.args...)
		code, out, errs := runCLI(t, args...)
		if code == 0 {
			t.Errorf("train %q succeeded:\n%s", c.args, out)
			continue
		}
		wantAll(t, strings.Join(c.args, " "), errs, c.want...)
		if strings.Contains(errs, "goroutine ") {
			t.Fatalf("train %q panicked:\n%s", c.args, errs)
		}
		if got := tree(t, swap); !slices.Equal(got, []string{"."}) {
			t.Fatalf("train %q left %v", c.args, got)
		}
	}
}
