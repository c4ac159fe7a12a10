package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/internal/probe"
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
	// The runtime removes its scratch swap files from --dir. What may stay
	// is the bandwidth cache (.zinf-bandwidth.json, zinf's own file, kept
	// on purpose for the next run): it is written when this process has not
	// measured the filesystem yet, as when this test runs alone.
	got := slices.DeleteFunc(tree(t, dir), func(n string) bool { return n == probe.CacheName })
	if !slices.Equal(got, []string{"."}) {
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
		{[]string{"--schedule", "zig-zag"}, []string{`--schedule "zig-zag"`, "auto, layer-major, micro-batch-major"}},
		{[]string{"--micro-batches", "0"}, []string{"--micro-batches 0", "1.."}},
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

// TestTrainCheckpointFlags: every misuse of the checkpoint flags is
// refused before anything runs, naming the flag and what is allowed;
// nothing is created.
func TestTrainCheckpointFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(dir, "ck")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--checkpoint-every", "2"}, []string{"--checkpoint-every needs --checkpoint-dir"}},
		{[]string{"--resume"}, []string{"--resume needs --checkpoint-dir"}},
		{[]string{"--checkpoint-keep", "1", "--checkpoint-async"}, []string{"--checkpoint-keep needs --checkpoint-dir", "--checkpoint-async needs --checkpoint-dir"}},
		{[]string{"--checkpoint-dir", ""}, []string{`--checkpoint-dir "" is invalid`}},
		{[]string{"--checkpoint-dir", ck}, []string{"--checkpoint-dir needs --checkpoint-every N"}},
		{[]string{"--checkpoint-dir", ck, "--checkpoint-every", "0"}, []string{"--checkpoint-every 0 is invalid (allowed: 1.."}},
		{[]string{"--checkpoint-dir", ck, "--checkpoint-every", "-3"}, []string{"--checkpoint-every -3 is invalid (allowed: 1.."}},
		{[]string{"--checkpoint-dir", ck, "--checkpoint-every", "1", "--checkpoint-keep", "-1"}, []string{"--checkpoint-keep -1 is invalid (allowed: 0.."}},
		{[]string{"--checkpoint-dir", file, "--checkpoint-every", "1"}, []string{"--checkpoint-dir " + file + " is invalid: it is not a directory"}},
		{[]string{"--checkpoint-dir", ck, "--checkpoint-every", "1", "--resume"}, []string{"no committed checkpoint in " + ck}},
	} {
		args := append([]string{"train", "--layers", "2", "--width", "16", "--steps", "2", "--dir", dir}, c.args...)
		code, out, errs := runCLI(t, args...)
		if code != 1 {
			t.Errorf("%q: exit %d, want 1:\nstdout %s\nstderr %s", c.args, code, out, errs)
			continue
		}
		wantAll(t, strings.Join(c.args, " "), errs, c.want...)
	}
	if got := tree(t, dir); !slices.Equal(got, []string{".", "file"}) {
		t.Fatalf("refused runs left %v", got)
	}
}

// TestTrainResume: a run checkpoints each of 4 steps; another with
// --resume and --steps 7, at world size 2, continues from step 4, reports
// where it resumed and each save (step, dir, bytes, seconds) in --json,
// and equals in-memory training of 7 steps bit for bit. A fresh run on the
// same directory and a resume of another seed are refused, naming why.
func TestTrainResume(t *testing.T) {
	dir, swap := filepath.Join(t.TempDir(), "ck"), t.TempDir()
	base := []string{"train", "--layers", "2", "--width", "24", "--dir", swap, "--checkpoint-dir", dir, "--checkpoint-every", "2", "--json", "--quiet"}
	// The first run checkpoints every step and keeps them all.
	code, out, errs := runCLI(t, append(base, "--steps", "4", "--checkpoint-every", "1", "--checkpoint-keep", "0")...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	all := tree(t, dir)
	var first struct {
		Checkpoints []map[string]any `json:"checkpoints"`
		Resumed     any              `json:"resumed_from"`
	}
	if err := json.Unmarshal([]byte(out), &first); err != nil {
		t.Fatal(err)
	}
	if len(first.Checkpoints) != 4 || first.Resumed != nil {
		t.Fatalf("first run: %s", out)
	}
	for i, c := range first.Checkpoints {
		if c["step"] != float64(i+1) || c["dir"] != filepath.Join(dir, fmt.Sprintf("step-%06d", i+1)) || c["bytes"].(float64) <= 0 || c["seconds"].(float64) <= 0 {
			t.Errorf("checkpoint record %v", c)
		}
	}

	code, _, errs = runCLI(t, append(base, "--steps", "7")...)
	if code != 1 || !strings.Contains(errs, "already holds checkpoints") || !strings.Contains(errs, "--resume") {
		t.Fatalf("a fresh run over existing checkpoints: exit %d:\n%s", code, errs)
	}
	code, _, errs = runCLI(t, append(base, "--steps", "7", "--resume", "--seed", "9", "--batch", "3")...)
	if code != 1 || !strings.Contains(errs, "--seed") || !strings.Contains(errs, "--batch") {
		t.Fatalf("a resume with another seed and batch: exit %d:\n%s", code, errs)
	}
	code, _, errs = runCLI(t, append(base, "--steps", "3", "--resume")...)
	if code != 1 || !strings.Contains(errs, "past the 3 steps") {
		t.Fatalf("a resume past --steps: exit %d:\n%s", code, errs)
	}
	// The refused runs (whose --checkpoint-keep is the default 3) deleted
	// nothing.
	if got := tree(t, dir); !slices.Equal(got, all) {
		t.Fatalf("refused runs changed the checkpoint directory: %v, was %v", got, all)
	}

	t.Setenv("WORLD_SIZE", "2")
	code, out, errs = runCLI(t, append(base, "--steps", "7", "--resume", "--verify")...)
	if code != 0 {
		t.Fatalf("resume: exit %d:\n%s", code, errs)
	}
	var res struct {
		Steps        int                      `json:"steps"`
		StepsRun     int                      `json:"steps_run"`
		World        int                      `json:"world_size"`
		DataParallel int                      `json:"data_parallel"`
		Equal        bool                     `json:"bitwise_equal"`
		Resumed      map[string]any           `json:"resumed_from"`
		Checkpoints  []map[string]interface{} `json:"checkpoints"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Equal || res.Steps != 7 || res.StepsRun != 3 || res.World != 2 || res.DataParallel != 1 {
		t.Fatalf("resumed run: %s", out)
	}
	if res.Resumed["step"] != float64(4) || res.Resumed["dir"] != filepath.Join(dir, "step-000004") || res.Resumed["world_size"] != float64(1) {
		t.Fatalf("resumed_from %v", res.Resumed)
	}
	if len(res.Checkpoints) != 2 || res.Checkpoints[0]["step"] != float64(6) || res.Checkpoints[1]["step"] != float64(7) {
		t.Fatalf("checkpoints %v", res.Checkpoints)
	}
	// Default --checkpoint-keep 3 (the resumed run saves every 2 steps
	// and after the last): steps 4, 6 and 7 are left.
	if got := tree(t, dir); !slices.Contains(got, "step-000004") || slices.Contains(got, "step-000002") || !slices.Contains(got, "step-000007") {
		t.Fatalf("the checkpoint directory holds %v", got)
	}
}

// TestTrainResumeDamagedNewest: with the newest checkpoint's
// checkpoint.json damaged, --resume stops before training, naming that
// checkpoint, what is wrong and --resume-from (it used to fall back to
// the older one silently, retrain, and then fail "step-000003: checkpoint
// already exists"); --resume-from the older one into the same directory is
// refused up front, naming the checkpoint it would save over; into
// another directory it resumes and equals in-memory training bit for bit.
// The only checkpoint damaged is named too (not "no committed checkpoint").
func TestTrainResumeDamagedNewest(t *testing.T) {
	root, swap := t.TempDir(), t.TempDir()
	dir := filepath.Join(root, "ck")
	base := []string{"train", "--layers", "2", "--width", "16", "--dir", swap, "--checkpoint-every", "1", "--checkpoint-keep", "0", "--json", "--quiet"}
	if code, _, errs := runCLI(t, append(base, "--checkpoint-dir", dir, "--steps", "3")...); code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	newest := filepath.Join(dir, "step-000003")
	if err := os.WriteFile(filepath.Join(newest, "checkpoint.json"), []byte("{\"format\": \x00\x01"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := tree(t, dir)
	code, _, errs := runCLI(t, append(base, "--checkpoint-dir", dir, "--steps", "5", "--resume")...)
	if code != 1 {
		t.Fatalf("--resume over a damaged newest checkpoint: exit %d:\n%s", code, errs)
	}
	wantAll(t, "--resume", errs, newest, "checkpoint.json", "not valid JSON", "--resume-from "+filepath.Join(dir, "step-000002"))
	older := filepath.Join(dir, "step-000002")
	code, _, errs = runCLI(t, append(base, "--checkpoint-dir", dir, "--steps", "5", "--resume-from", older)...)
	if code != 1 {
		t.Fatalf("--resume-from into a directory holding a later checkpoint: exit %d:\n%s", code, errs)
	}
	wantAll(t, "--resume-from into the same directory", errs, "holds step-000003", "would save over", "--checkpoint-dir")
	if got := tree(t, dir); !slices.Equal(got, before) {
		t.Fatalf("refused runs changed the checkpoint directory: %v, was %v", got, before)
	}
	code, out, errs := runCLI(t, append(base, "--checkpoint-dir", filepath.Join(root, "ck2"), "--steps", "5", "--resume-from", older, "--verify")...)
	if code != 0 {
		t.Fatalf("--resume-from into another directory: exit %d:\n%s", code, errs)
	}
	var res struct {
		StepsRun int            `json:"steps_run"`
		Equal    bool           `json:"bitwise_equal"`
		Resumed  map[string]any `json:"resumed_from"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Equal || res.StepsRun != 3 || res.Resumed["step"] != float64(2) || res.Resumed["dir"] != older {
		t.Fatalf("resumed run: %s", out)
	}
	code, _, errs = runCLI(t, append(base, "--checkpoint-dir", dir, "--steps", "5", "--resume", "--resume-from", older)...)
	if code != 1 || !strings.Contains(errs, "--resume and --resume-from") {
		t.Fatalf("--resume with --resume-from: exit %d:\n%s", code, errs)
	}

	only := filepath.Join(root, "only")
	if code, _, errs := runCLI(t, append(base, "--checkpoint-dir", only, "--steps", "1")...); code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	if err := os.WriteFile(filepath.Join(only, "step-000001", "checkpoint.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, append(base, "--checkpoint-dir", only, "--steps", "2", "--resume")...)
	if code != 1 || strings.Contains(errs, "no committed checkpoint") {
		t.Fatalf("--resume over the only checkpoint, damaged: exit %d:\n%s", code, errs)
	}
	wantAll(t, "the only checkpoint damaged", errs, filepath.Join(only, "step-000001"), "checkpoint.json")
}

// TestRealWorldConfigs: three DeepSpeed configs as users have them (the
// Hugging Face Trainer's with "auto" values and aio.thread_count; one
// tuned with 1e8-element values written as floats; one offloading only the
// optimizer to NVMe) train at the default pinned budget. Their max_in_cpu
// (1e9 and 1e8 elements) is more than the budget holds: it is a cache, so
// it is clamped to what fits with exactly one warning naming the key and
// the size used, at any world size (it used to be refused:
// "param: Options.MaxInCPUBytes = 4000000000: must not exceed the pool's
// capacity"). Where offload_param.device is not nvme max_in_cpu is unused,
// and nothing warns about it.
func TestRealWorldConfigs(t *testing.T) {
	for _, c := range []struct {
		file  string
		warns bool
	}{{"hf_trainer_auto.json", true}, {"tuned_1e8.json", true}, {"optimizer_only_nvme.json", false}} {
		for _, world := range []string{"1", "2"} {
			t.Run(c.file+"-world"+world, func(t *testing.T) {
				b, err := os.ReadFile(filepath.Join("testdata", c.file))
				if err != nil {
					t.Fatal(err)
				}
				swap := t.TempDir()
				cfg := filepath.Join(t.TempDir(), c.file)
				if err := os.WriteFile(cfg, bytes.ReplaceAll(b, []byte("/local_nvme"), []byte(swap)), 0o644); err != nil {
					t.Fatal(err)
				}
				t.Setenv("WORLD_SIZE", world)
				code, out, errs := runCLI(t, "train", "--config", cfg, "--layers", "2", "--width", "32", "--steps", "2", "--verify", "--json", "--quiet")
				if code != 0 {
					t.Fatalf("exit %d:\n%s", code, errs)
				}
				if !strings.Contains(out, `"bitwise_equal":true`) {
					t.Fatalf("not bit for bit:\n%s", out)
				}
				n := 0
				for _, line := range strings.Split(errs, "\n") {
					if strings.Contains(line, "max_in_cpu") {
						n++
					}
				}
				switch {
				case c.warns && n != 1:
					t.Fatalf("want exactly one max_in_cpu warning, got %d:\n%s", n, errs)
				case c.warns:
					wantAll(t, "the warning", errs, "level=WARN", "zero_optimization.offload_param.max_in_cpu", "cache=")
				case n != 0:
					t.Fatalf("max_in_cpu is unused with offload_param.device none, yet:\n%s", errs)
				}
				if strings.Contains(errs, "MaxInCPUBytes") || strings.Contains(errs, "Options.") {
					t.Fatalf("a Go option name reached the user:\n%s", errs)
				}
			})
		}
	}
}

// TestTrainStepJSON: clipping that triggers, fp16 loss scaling and
// speculation from the flags; the JSON reports every step's learning
// rate, clip coefficient, overflow skip, loss scale and rollback, and the
// run still equals in-memory training bit for bit.
func TestTrainStepJSON(t *testing.T) {
	code, out, errs := runCLI(t, "train", "--layers", "2", "--width", "32", "--steps", "3", "--verify", "--json",
		"--clip", "0.001", "--fp16", "--speculate", "always", "--dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	var m struct {
		BitwiseEqual bool             `json:"bitwise_equal"`
		PerStep      []map[string]any `json:"per_step"`
		Rollbacks    int              `json:"speculation_rollbacks"`
		Clipped      int              `json:"clipped_steps"`
		LossScale    float64          `json:"loss_scale"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out)
	}
	if !m.BitwiseEqual || len(m.PerStep) != 3 || m.Clipped != 3 || m.LossScale != 65536 {
		t.Fatalf("result: %+v", m)
	}
	for i, s := range m.PerStep {
		for _, k := range []string{"lr", "clip_coef", "overflow_skipped", "loss_scale", "rolled_back", "grad_norm", "speculated"} {
			if _, ok := s[k]; !ok {
				t.Errorf("step %d lacks %q: %v", i+1, k, s)
			}
		}
		if c, _ := s["clip_coef"].(float64); !(c > 0 && c < 1) || s["clipped"] != true {
			t.Errorf("step %d: clip %v", i+1, s)
		}
	}
	if m.Rollbacks == 0 {
		// Only when the plan had room to overlap the step; it does at this size.
		t.Errorf("no speculative step was rolled back: %s", out)
	}
}

// TestTrainDeepSpeedConfig trains with a DeepSpeed config that sets
// gradient_clipping, WarmupLR, fp16 dynamic loss scaling and
// offload_optimizer nvme (config/testdata/ds_zero_infinity.json, its
// nvme paths pointed at a temp dir): the keys act (no "ignored" warning
// names them) and the run equals in-memory training.
func TestTrainDeepSpeedConfig(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "testdata", "ds_zero_infinity.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	text := strings.ReplaceAll(string(raw), "/local_nvme", dir)
	text = strings.Replace(text, `"aio": {`, `"zinf": {"device": "sim", "tiers": {"cpu_pinned_bytes": "32MiB"}}, "aio": {`, 1)
	path := filepath.Join(dir, "ds.json")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "train", "--config", path, "--layers", "2", "--width", "32", "--steps", "3", "--verify", "--json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	for _, k := range []string{"gradient_clipping", "scheduler", "fp16.loss_scale", "fp16.hysteresis"} {
		if strings.Contains(errs, k) {
			t.Errorf("stderr mentions %q:\n%s", k, errs)
		}
	}
	var m struct {
		BitwiseEqual bool `json:"bitwise_equal"`
		PerStep      []struct {
			LR        float64 `json:"lr"`
			LossScale float64 `json:"loss_scale"`
		} `json:"per_step"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// WarmupLR from 0 over 1000 steps (log): the first two steps at 0,
	// then rising; fp16 starts at 2^16.
	if !m.BitwiseEqual || len(m.PerStep) != 3 || m.PerStep[0].LR != 0 || m.PerStep[1].LR != 0 || !(m.PerStep[2].LR > 0) || m.PerStep[0].LossScale != 65536 {
		t.Fatalf("%+v\n%s", m, out)
	}
}

func TestTrainStepFlagsBad(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--clip", "-1"}, "--clip -1: must be a finite number >= 0"},
		{[]string{"--clip", "NaN"}, "--clip NaN"},
		{[]string{"--loss-scale", "-2"}, "--loss-scale -2"},
		{[]string{"--speculate", "maybe"}, `--speculate "maybe": allowed: auto, always, never`},
	} {
		args := append([]string{"train", "--layers", "2", "--width", "16", "--steps", "1"}, c.args...)
		code, out, errs := runCLI(t, args...)
		if code == 0 {
			t.Errorf("train %q succeeded:\n%s", c.args, out)
			continue
		}
		wantAll(t, strings.Join(c.args, " "), errs, c.want)
	}
}

// TestTrainSchedules: --schedule layer-major and micro-batch-major with
// --micro-batches 3, each with and without --overlap-update, all pass
// --verify (bit for bit in-memory training, run micro-batch-major) and
// give the same state_sha256; the JSON keeps step_ms_median,
// step_read_bytes and state_sha256 and says the schedule and whether the
// update overlapped; layer-major reads fewer NVMe bytes per step (its
// parameters once per pass, its gradients never read back before the
// step).
func TestTrainSchedules(t *testing.T) {
	type result struct {
		Schedule      string  `json:"schedule"`
		OverlapUpdate bool    `json:"overlap_update"`
		StateSHA256   string  `json:"state_sha256"`
		BitwiseEqual  *bool   `json:"bitwise_equal"`
		StepMsMedian  float64 `json:"step_ms_median"`
		StepReadBytes []int64 `json:"step_read_bytes"`
	}
	got := map[string]result{}
	for _, update := range []bool{false, true} {
		for _, sched := range []string{"layer-major", "micro-batch-major"} {
			what := fmt.Sprintf("--schedule %s --overlap-update=%v", sched, update)
			dir := t.TempDir()
			cfg := filepath.Join(dir, "ds.json")
			// Parameters on NVMe without a cache: every pass reads them.
			js := fmt.Sprintf(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q, "max_in_cpu": 0}, "offload_optimizer": {"device": "nvme", "nvme_path": %q}}}`, dir, dir)
			if err := os.WriteFile(cfg, []byte(js), 0o644); err != nil {
				t.Fatal(err)
			}
			code, out, errs := runCLI(t, "train", "--config", cfg, "--dir", dir, "--layers", "3", "--width", "32", "--steps", "2",
				"--micro-batches", "3", "--schedule", sched, fmt.Sprintf("--overlap-update=%v", update), "--verify", "--json")
			if code != 0 {
				t.Fatalf("%s: exit %d:\n%s", what, code, errs)
			}
			var r result
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("%s: %v\n%s", what, err, out)
			}
			if r.Schedule != sched || r.OverlapUpdate != update || r.BitwiseEqual == nil || !*r.BitwiseEqual || r.StateSHA256 == "" || r.StepMsMedian <= 0 || len(r.StepReadBytes) != 2 {
				t.Fatalf("%s: %+v", what, r)
			}
			got[what] = r
		}
	}
	var first string
	for what, r := range got {
		if first == "" {
			first = what
		}
		if r.StateSHA256 != got[first].StateSHA256 {
			t.Errorf("state_sha256: %s %s, %s %s", what, r.StateSHA256, first, got[first].StateSHA256)
		}
	}
	lm, mb := got["--schedule layer-major --overlap-update=false"].StepReadBytes[1], got["--schedule micro-batch-major --overlap-update=false"].StepReadBytes[1]
	if lm >= mb {
		t.Errorf("NVMe bytes read in step 2: layer-major %d, micro-batch-major %d", lm, mb)
	}
}
