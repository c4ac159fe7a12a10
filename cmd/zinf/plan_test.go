package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/policy"
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
		{[]string{"--micro-batches", "0"}, []string{"--micro-batches 0"}},
		{[]string{"--schedule", "fast"}, []string{`--schedule "fast"`, "layer-major"}},
	} {
		code, out, errs := runCLI(t, append([]string{"plan"}, c.args...)...)
		if code == 0 {
			t.Errorf("plan %q succeeded:\n%s", c.args, out)
			continue
		}
		wantAll(t, strings.Join(c.args, " "), errs, c.want...)
	}
}

// TestPlanSchedules: with --micro-batches 8, plan prints the step
// predicted in both orders with each one's NVMe bytes per step, and the
// one it chose; --schedule fixes it.
func TestPlanSchedules(t *testing.T) {
	code, out, errs := runCLI(t, "plan", "--model", "layers=4,width=256,dtype=fp32", "--micro-batches", "8", "--compute-ms-per-layer", "0.1", "--no-probe")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "8 micro-batches per step", "  layer-major        predicted step", "  micro-batch-major  predicted step", "nvme read", "per step")
	code, out, errs = runCLI(t, "plan", "--model", "layers=4,width=256,dtype=fp32", "--micro-batches", "8", "--schedule", "micro-batch-major", "--no-probe")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan --schedule", out, "schedule: micro-batch-major (zinf.schedule)")
}

// TestPlanEndurance: with everything on NVMe, a step writes each
// parameter's optimizer states (12 bytes) and updated value (4), and its
// gradient (4) only when it does not stay in pinned memory: the 64 MiB
// pool keeps every gradient (zinf.pinned_grads auto), so 16; plan says
// so, sets it per day against zinf.nvme_tbw, or --tbw when given, and
// names the path the bytes go to.
func TestPlanEndurance(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ds.json")
	if err := os.WriteFile(cfg, []byte(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "`+dir+`", "max_in_cpu": 0, "buffer_size": 1},
		"offload_optimizer": {"device": "nvme", "nvme_path": "`+dir+`"}},
		"zinf": {"tiers": {"gpu_bytes": "2MiB", "cpu_pinned_bytes": "64MiB"}, "nvme_tbw": "300TB"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	params := 4 * (256*256 + 256)
	written := fmt.Sprintf("(%d bytes) written per step", params*16)
	code, out, errs := runCLI(t, "plan", "--config", cfg, "--model", "layers=4,width=256", "--compute-ms-per-layer", "2")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "nvme endurance (per rank, at the predicted step)", written, "per day", "of a 300 TB endurance rating per day", "written to "+dir)
	code, out, errs = runCLI(t, "plan", "--config", cfg, "--model", "layers=4,width=256,world=2", "--tbw", "1.5PB")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan --tbw", out, "an upper bound", fmt.Sprintf("(%d bytes) written per step", params*8), "of a 1.5 PB endurance rating", "the 2 ranks write 2 times this")
	// zinf.pinned_grads off: every gradient is written behind again.
	off := filepath.Join(dir, "off.json")
	if err := os.WriteFile(off, []byte(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "`+dir+`", "max_in_cpu": 0, "buffer_size": 1},
		"offload_optimizer": {"device": "nvme", "nvme_path": "`+dir+`"}},
		"zinf": {"tiers": {"gpu_bytes": "2MiB", "cpu_pinned_bytes": "64MiB"}, "nvme_tbw": "300TB", "pinned_grads": "off"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCLI(t, "plan", "--config", off, "--model", "layers=4,width=256", "--compute-ms-per-layer", "2")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan, pinned_grads off", out, fmt.Sprintf("(%d bytes) written per step", params*20))
	if code, _, errs := runCLI(t, "plan", "--tbw", "-1TB"); code == 0 || !strings.Contains(errs, "-tbw") {
		t.Fatalf("--tbw -1TB: exit %d %s", code, errs)
	}
}

// TestPlanKVCache: --kv-seq plans a generation's KV cache (layers x 2 x
// batch x seq x width x dtype) on the tier zinf.kv_cache chooses, and a
// budget below its need is refused with the bytes needed.
func TestPlanKVCache(t *testing.T) {
	code, out, errs := runCLI(t, "plan", "--model", "layers=4,width=256,dtype=bf16,batch=8", "--kv-seq", "1024", "--no-probe")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan --kv-seq", out, "kv cache: memory, 4 layers x 8MiB = 32MiB in memory")
	dir := t.TempDir()
	for _, c := range []struct{ json, want string }{
		{`{"zinf": {"kv_cache": {"device": "cpu", "bytes": "8MiB"}}}`, "Open refuses this KV cache: zinf: zinf.kv_cache.bytes = 8MiB is too small for this KV cache on cpu (4 layers x 8MiB): the pinned cache needs 32MiB (33554432 bytes)"},
		{`{"zinf": {"kv_cache": {"device": "auto", "bytes": "16MiB"}, "nvme_paths": ["` + dir + `"]}}`, "kv cache: nvme, 4 layers x 8MiB = 32MiB in swap files (64MiB of disk, copy-on-write), pinned staging 24MiB"},
	} {
		cfg := filepath.Join(dir, "kv.json")
		if err := os.WriteFile(cfg, []byte(c.json), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errs := runCLI(t, "plan", "--config", cfg, "--model", "layers=4,width=256,dtype=bf16,batch=8", "--kv-seq", "1024", "--no-probe")
		if code != 0 {
			t.Fatalf("%s: exit %d:\n%s", c.json, code, errs)
		}
		wantAll(t, c.json, out, c.want)
	}
	if code, _, errs := runCLI(t, "plan", "--kv-seq", "-1"); code == 0 || !strings.Contains(errs, "--kv-seq") {
		t.Fatalf("--kv-seq -1: exit %d, %s", code, errs)
	}
}

// TestPlanKVCacheBeyondMemory: in a 2 GiB memory cgroup (faked), plan
// --kv-seq reports that Open would refuse a 16 GiB KV cache in memory with
// the pinned pool, naming both figures, the limit and what to change; a
// cache that fits says nothing of the kind.
func TestPlanKVCacheBeyondMemory(t *testing.T) {
	testenv.FakeCgroup(t, 2<<30, 0)
	code, out, errs := runCLI(t, "plan", "--model", "layers=4,width=4096,dtype=bf16,batch=64", "--kv-seq", "4096", "--no-probe")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "16 GiB cache", out, "kv cache: memory, 4 layers x 4GiB = 16GiB in memory",
		"Open refuses this KV cache on this machine: the KV cache on memory (16 GiB (17179869184 bytes))",
		"more than the 2 GiB", "cgroup", "zinf.kv_cache.device nvme")
	code, out, errs = runCLI(t, "plan", "--model", "layers=4,width=256,dtype=bf16,batch=8", "--kv-seq", "1024", "--no-probe")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	if strings.Contains(out, "Open refuses this KV cache") {
		t.Fatalf("a 32 MiB cache in a 2 GiB cgroup is refused:\n%s", out)
	}
}

// TestPlanMicroBatchesToHideIO: zinf plan prints the micro-batches a
// layer-major step needs for its compute to cover its NVMe I/O, derived
// here from the model's shapes and the config's bandwidth: every parameter
// read in both passes and every gradient written once (the passes), the
// gradients and Adam's states read and the states and parameters written
// (the optimizer step, overlapping the backward pass), over one
// micro-batch's compute. Under gradient_accumulation_steps "auto" the
// plan takes that k; without the compute plan says how to give it.
func TestPlanMicroBatchesToHideIO(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ds.json")
	cfg := fmt.Sprintf(`{"gradient_accumulation_steps": "auto",
		"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q}, "offload_optimizer": {"device": "nvme", "nvme_path": %q}},
		"zinf": {"tiers": {"cpu_pinned_bytes": "256MiB"}, "bandwidth": {"read_bytes_per_sec": 2e9, "write_bytes_per_sec": 1e9}}}`, dir, dir)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := policy.ParseModelSpec("layers=4,width=256,dtype=fp32")
	if err != nil {
		t.Fatal(err)
	}
	var params, grads, states float64
	for _, x := range spec.Inventory(0, 1) {
		switch x.Kind {
		case policy.Param:
			params += float64(x.Bytes)
		case policy.Grad:
			grads += float64(x.Bytes)
		case policy.OptimState:
			states += float64(x.Bytes)
		}
	}
	const read, write, layers = 2e9, 1e9, 4
	io := 2*params/read + grads/write + (grads+states)/read + (states+params)/write
	const computeMs = 0.02 // per layer and pass: a micro-batch is 2 x 4 of them
	perMicro := 2 * layers * computeMs / 1e3
	k := int(math.Ceil(io/perMicro - 1e-9))
	want := fmt.Sprintf("micro-batches to hide the I/O: k >= %d (compute %s per micro-batch, I/O %s per step)",
		k, policy.FormatDuration(time.Duration(math.Round(perMicro*1e9))), policy.FormatDuration(time.Duration(math.Round(io*1e9))))
	code, out, errs := runCLI(t, "plan", "--config", cfgPath, "--no-probe", "--model", "layers=4,width=256,dtype=fp32", "--compute-ms-per-layer", fmt.Sprint(computeMs))
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, want+"\n", fmt.Sprintf(`gradient_accumulation_steps "auto": k = %d`, k), fmt.Sprintf("%d micro-batches per step", k))
	// By pass: the backward pass (two thirds of the compute) carries
	// the gradients' and the optimizer's I/O, so it asks more
	// micro-batches than the total against the total.
	m := regexp.MustCompile(`(?m)^micro-batches to hide the I/O: k >= ([0-9]+) \(compute .*\n  by pass, the backward's compute twice the forward's \(a loop that times its passes, zgomlx.Loop, measures the split\): k >= ([0-9]+) \(each pass's compute covering its own I/O: forward ` +
		regexp.QuoteMeta(policy.FormatDuration(time.Duration(math.Round(perMicro/3*1e9)))) + ` per micro-batch against .*, backward ` +
		regexp.QuoteMeta(policy.FormatDuration(time.Duration(math.Round(2*perMicro/3*1e9)))) + ` against `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("plan has no by-pass line after the micro-batches line:\n%s", out)
	}
	if kt, _ := strconv.Atoi(m[1]); func() bool { kp, _ := strconv.Atoi(m[2]); return kp <= kt }() {
		t.Errorf("by pass k %s, the total's %s: want more (the backward pass carries most of the I/O)", m[2], m[1])
	}

	// A compute of the I/O's size hides it at one micro-batch.
	code, out, errs = runCLI(t, "plan", "--config", cfgPath, "--no-probe", "--model", "layers=4,width=256,dtype=fp32", "--compute-ms-per-layer", fmt.Sprint(io*1e3/(2*layers)*1.01))
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "micro-batches to hide the I/O: already hidden at k=1 (compute ")

	// Without the compute: not known, and how to give it; "auto" plans
	// for two micro-batches meanwhile.
	code, out, errs = runCLI(t, "plan", "--config", cfgPath, "--no-probe", "--model", "layers=4,width=256,dtype=fp32")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "micro-batches to hide the I/O: not known without the compute per layer (I/O "+policy.FormatDuration(time.Duration(io*1e9)),
		"give the compute: --compute-ms-per-layer", `gradient_accumulation_steps "auto": k = 2`)
}

// TestMicroBatchesFlagOverridesAuto: --micro-batches is the user's k over
// a config's gradient_accumulation_steps "auto", in zinf plan and in zinf
// train's step flags.
func TestMicroBatchesFlagOverridesAuto(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ds.json")
	cfg := fmt.Sprintf(`{"gradient_accumulation_steps": "auto",
		"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q}, "offload_optimizer": {"device": "nvme", "nvme_path": %q}},
		"zinf": {"bandwidth": {"read_bytes_per_sec": 2e9, "write_bytes_per_sec": 1e9}}}`, dir, dir)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "plan", "--config", cfgPath, "--no-probe", "--model", "layers=4,width=256,dtype=fp32", "--compute-ms-per-layer", "0.02", "--micro-batches", "5")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "5 micro-batches per step", "micro-batches to hide the I/O: k >= ")
	if strings.Contains(out, `gradient_accumulation_steps "auto"`) {
		t.Errorf("--micro-batches 5 still planned as auto:\n%s", out)
	}

	c, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	s := stepFlags{micro: 3, set: map[string]bool{"micro-batches": true}}
	if err := s.apply(c); err != nil {
		t.Fatal(err)
	}
	if c.GradientAccumulationSteps != 3 || c.GradientAccumulationAuto {
		t.Errorf("zinf train --micro-batches 3 over auto: k %d, auto %v", c.GradientAccumulationSteps, c.GradientAccumulationAuto)
	}
}
