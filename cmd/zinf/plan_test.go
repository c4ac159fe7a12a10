package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	code, out, errs := runCLI(t, "plan", "--model", "layers=4,width=256")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	// 4 layers of 256x256 weights and 256 biases.
	wantAll(t, "plan", out, "layers=4,width=256", "263168 parameters", "TIER", "HOLDS", "BYTES", "gpu", "cpu", "nvme", "predicted step")

	code, out, errs = runCLI(t, "plan", "--model", "layers=4,width=256,dtype=bf16,batch=2,world=2", "--compute-ms-per-layer", "1.5")
	if code != 0 {
		t.Fatalf("bf16 world 2: exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "dtype=bf16", "world=2", "TIER")
}

func TestPlanBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"aio": {"queue_depth": 0}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--model", "layers=4,widht=256"}, []string{"--model", `unknown key "widht"`}},
		{[]string{"--model", "layers=0,width=256"}, []string{"--model", "layers", `"0"`}},
		{[]string{"--model", "layers=4,width=x"}, []string{"--model", "width", `"x"`}},
		{[]string{"--model", "layers=4,width=256,dtype=int8"}, []string{"--model", "dtype", "int8"}},
		{[]string{"--model", ""}, []string{"--model", "empty"}},
		{[]string{"--model", "layers=4,width=256", "--config", bad}, []string{"aio.queue_depth"}},
		{[]string{"--model", "layers=4,width=256", "--config", "/nonexistent.json"}, []string{"/nonexistent.json"}},
	} {
		code, out, errs := runCLI(t, append([]string{"plan"}, c.args...)...)
		if code == 0 {
			t.Errorf("plan %q succeeded:\n%s", c.args, out)
			continue
		}
		wantAll(t, strings.Join(c.args, " "), errs, c.want...)
	}
}
