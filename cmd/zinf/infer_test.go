package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInferVerify(t *testing.T) {
	code, out, errs := runCLI(t, "infer", "--layers", "2", "--width", "32", "--verify")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "stdout", out, "batch 4/4", "outputs equal in-memory inference bit for bit")

	code, out, errs = runCLI(t, "infer", "--layers", "2", "--width", "32", "--batches", "2", "--verify", "--json")
	if code != 0 {
		t.Fatalf("--json: exit %d:\n%s", code, errs)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if m["output_equal"] != true || m["batches"] != float64(2) || m["params"] != float64(2*(32*32+32)) {
		t.Fatalf("JSON %v", m)
	}
	if v, _ := m["bytes_read"].(float64); v <= 0 {
		t.Fatalf("bytes_read = %v: the weights were not streamed from NVMe", m["bytes_read"])
	}
}

func TestInferBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"zero_optimization": {"offload_param": {"device": "disk"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--batches", "-1"}, []string{"--batches -1"}},
		{[]string{"--batches", "0"}, []string{"--batches 0"}},
		{[]string{"--prefetch", "-1"}, []string{"--prefetch -1"}},
		{[]string{"--compute-ms-per-layer", "-1"}, []string{"--compute-ms-per-layer -1"}},
		{[]string{"--layers", "0"}, []string{"layers 0"}},
		{[]string{"--config", bad}, []string{"zero_optimization.offload_param.device", `"disk"`}},
	} {
		args := append([]string{"infer", "--layers", "2", "--width", "8"}, c.args...)
		code, out, errs := runCLI(t, args...)
		if code == 0 {
			t.Errorf("infer %q succeeded:\n%s", c.args, out)
			continue
		}
		if strings.Contains(errs, "goroutine ") {
			t.Fatalf("infer %q panicked:\n%s", c.args, errs)
		}
		wantAll(t, strings.Join(c.args, " "), errs, c.want...)
	}
}
