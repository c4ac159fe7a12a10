package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// parseErr parses text and returns its *Error, failing the test if Parse
// succeeded or returned another kind of error.
func parseErr(t *testing.T, text string) *Error {
	t.Helper()
	c, err := Parse([]byte(text))
	if err == nil {
		t.Fatalf("Parse(%s) succeeded: %+v", text, c)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Parse error is %T, not *Error: %v", err, err)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Parse error does not match ErrInvalid")
	}
	return e
}

func mustParse(t *testing.T, text string) *Config {
	t.Helper()
	c, err := Parse([]byte(text))
	if err != nil {
		t.Fatalf("Parse(%s): %v", text, err)
	}
	return c
}

// unsetRankEnv keeps the caller's launcher variables (RANK and
// WORLD_SIZE, Open MPI's, Slurm's) out of a test.
func unsetRankEnv(t *testing.T) {
	t.Helper()
	for _, l := range Launchers {
		for _, k := range []string{l.RankEnv, l.SizeEnv} {
			t.Setenv(k, "") // restores the old value after the test
			os.Unsetenv(k)
		}
	}
}

func TestParseInvalid(t *testing.T) {
	unsetRankEnv(t)
	for _, tc := range []struct {
		name string
		in   string
		want Problem // Line and Column are not compared
		line string  // the whole line Error() must contain
	}{
		{
			name: "bad offload device",
			in:   `{"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}}`,
			want: Problem{Key: "zero_optimization.offload_param.device", Value: `"disk"`, Msg: "is not allowed", Allowed: "none, cpu, nvme"},
			line: `zero_optimization.offload_param.device: "disk" is not allowed (allowed: none, cpu, nvme)`,
		},
		{
			name: "queue depth as a word",
			in:   `{"aio": {"queue_depth": "eight"}}`,
			want: Problem{Key: "aio.queue_depth", Value: `"eight"`, Msg: "is a string, not an integer", Allowed: "1..4096"},
			line: `aio.queue_depth: "eight" is a string, not an integer (allowed: 1..4096)`,
		},
		{
			name: "queue depth too deep",
			in:   `{"aio": {"queue_depth": 5000}}`,
			want: Problem{Key: "aio.queue_depth", Value: "5000", Msg: "is out of range", Allowed: "1..4096"},
			line: `aio.queue_depth: 5000 is out of range (allowed: 1..4096)`,
		},
		{
			name: "fractional integer",
			in:   `{"aio": {"queue_depth": 8.5}}`,
			want: Problem{Key: "aio.queue_depth", Value: "8.5", Msg: "is not an integer"},
		},
		{
			name: "typo with suggestion",
			in:   `{"zero_optimization": {"stage": 3, "offload_parm": {"device": "cpu"}}}`,
			want: Problem{Key: "zero_optimization.offload_parm", Msg: `unknown key (did you mean "zero_optimization.offload_param"?)`},
			line: `zero_optimization.offload_parm: unknown key (did you mean "zero_optimization.offload_param"?)`,
		},
		{
			name: "key in the wrong section",
			in:   `{"zero_optimization": {"queue_depth": 8}}`,
			want: Problem{Key: "zero_optimization.queue_depth", Msg: `unknown key here (did you mean "aio.queue_depth"?)`},
		},
		{
			name: "unknown key with the allowed list",
			in:   `{"aio": {"flux_capacitor": 1}}`,
			want: Problem{Key: "aio.flux_capacitor", Msg: "unknown key",
				Allowed: "block_size, queue_depth, intra_op_parallelism, thread_count, single_submit, overlap_events, use_gds"},
		},
		{
			name: "case and separator typo",
			in:   `{"aio": {"Queue-Depth": 8}}`,
			want: Problem{Key: "aio.Queue-Depth", Msg: `unknown key (did you mean "aio.queue_depth"?)`},
		},
		{
			name: "buffer count zero",
			in:   `{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "buffer_count": 0}}}`,
			want: Problem{Key: "zero_optimization.offload_param.buffer_count", Value: "0", Msg: "is out of range", Allowed: ">= 1"},
		},
		{
			name: "offload_param needs stage 3",
			in:   `{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}`,
			want: Problem{Key: "zero_optimization.offload_param.device", Value: `"cpu"`, Msg: "needs zero_optimization.stage 3 (stage is 2)"},
		},
		{
			name: "nvme optimizer needs stage 3",
			in:   `{"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}}`,
			want: Problem{Key: "zero_optimization.offload_optimizer.device", Value: `"nvme"`, Msg: "needs zero_optimization.stage 3 (stage is 1)"},
		},
		{
			name: "cpu optimizer needs a ZeRO stage",
			in:   `{"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}`,
			want: Problem{Key: "zero_optimization.offload_optimizer.device", Value: `"cpu"`, Msg: "needs zero_optimization.stage 1, 2 or 3 (stage is 0)"},
		},
		{
			name: "nvme needs a path",
			in:   `{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}`,
			want: Problem{Key: "zero_optimization.offload_param.nvme_path", Value: `""`, Msg: `is empty but device is "nvme"`,
				Allowed: "a directory, here or in zinf.nvme_paths"},
		},
		{
			name: "stage out of range",
			in:   `{"zero_optimization": {"stage": 4}}`,
			want: Problem{Key: "zero_optimization.stage", Value: "4", Msg: "is out of range", Allowed: "0..3"},
		},
		{
			name: "sub group size zero",
			in:   `{"zero_optimization": {"sub_group_size": 0}}`,
			want: Problem{Key: "zero_optimization.sub_group_size", Value: "0", Msg: "is out of range", Allowed: ">= 1"},
		},
		{
			name: "ratio out of range",
			in:   `{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}}`,
			want: Problem{Key: "zero_optimization.offload_optimizer.ratio", Value: "1.5", Msg: "is out of range", Allowed: "greater than 0, at most 1"},
		},
		{
			name: "ratio zero",
			in:   `{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0}}}`,
			want: Problem{Key: "zero_optimization.offload_optimizer.ratio", Value: "0", Msg: "is out of range", Allowed: "greater than 0, at most 1"},
		},
		{
			name: "partial offload needs stage 3",
			in:   `{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}`,
			want: Problem{Key: "zero_optimization.offload_optimizer.ratio", Value: "0.5", Msg: "below 1 needs zero_optimization.stage 3 (stage is 2)"},
		},
		{
			name: "block size odd",
			in:   `{"aio": {"block_size": 3000}}`,
			want: Problem{Key: "aio.block_size", Value: "3000", Msg: "is not allowed", Allowed: "a power of two or a multiple of 4096"},
		},
		{
			name: "block size not a size",
			in:   `{"aio": {"block_size": "big"}}`,
			want: Problem{Key: "aio.block_size", Value: `"big"`, Msg: "is not a size",
				Allowed: `a byte count: a number or a string such as "64MiB", "4GiB", "1.5GB"`},
		},
		{
			name: "block size zero",
			in:   `{"aio": {"block_size": "0KiB"}}`,
			want: Problem{Key: "aio.block_size", Value: `"0KiB"`, Msg: "is not allowed", Allowed: "a power of two or a multiple of 4096"},
		},
		{
			name: "intra op parallelism",
			in:   `{"aio": {"intra_op_parallelism": 65}}`,
			want: Problem{Key: "aio.intra_op_parallelism", Value: "65", Msg: "is out of range", Allowed: "1..64"},
		},
		{
			name: "bool as string",
			in:   `{"aio": {"single_submit": "false"}}`,
			want: Problem{Key: "aio.single_submit", Value: `"false"`, Msg: "is a string, not a boolean (true or false)"},
		},
		{
			name: "rank not below world size",
			in:   `{"zinf": {"rank": 4, "world_size": 4}}`,
			want: Problem{Key: "zinf.rank", Value: "4", Msg: "is not below zinf.world_size 4", Allowed: "0..3"},
		},
		{
			name: "world size zero",
			in:   `{"zinf": {"rank": 0, "world_size": 0}}`,
			want: Problem{Key: "zinf.world_size", Value: "0", Msg: "is out of range", Allowed: ">= 1"},
		},
		{
			name: "pipeline depth",
			in:   `{"zinf": {"pipeline_depth": 17}}`,
			want: Problem{Key: "zinf.pipeline_depth", Value: "17", Msg: "is out of range", Allowed: "0..16"},
		},
		{
			name: "direct mode",
			in:   `{"zinf": {"direct": "always"}}`,
			want: Problem{Key: "zinf.direct", Value: `"always"`, Msg: "is not allowed", Allowed: "required, optional, off"},
		},
		{
			name: "backend",
			in:   `{"zinf": {"backend": "io_uring"}}`,
			want: Problem{Key: "zinf.backend", Value: `"io_uring"`, Msg: "is not allowed", Allowed: "auto, uring, libaio, posix"},
		},
		{
			name: "gds mode",
			in:   `{"zinf": {"gds": true}}`,
			want: Problem{Key: "zinf.gds", Value: "true", Msg: "is a boolean, not a string", Allowed: "off, auto, required"},
		},
		{
			name: "gds required on the simulator",
			in:   `{"zinf": {"gds": "required", "device": "sim"}}`,
			want: Problem{Key: "zinf.gds", Value: `"required"`, Msg: `needs a CUDA device (zinf.device is "sim")`},
		},
		{
			name: "device",
			in:   `{"zinf": {"device": "tpu"}}`,
			want: Problem{Key: "zinf.device", Value: `"tpu"`, Msg: "is not allowed", Allowed: "auto, sim, cuda"},
		},
		{
			name: "negative size",
			in:   `{"zinf": {"tiers": {"cpu_pinned_bytes": -1}}}`,
			want: Problem{Key: "zinf.tiers.cpu_pinned_bytes", Value: "-1", Msg: "is out of range", Allowed: ">= 0 and < 8EiB"},
		},
		{
			name: "pinned budget zero",
			in:   `{"zinf": {"tiers": {"cpu_pinned_bytes": "0MiB"}}}`,
			want: Problem{Key: "zinf.tiers.cpu_pinned_bytes", Value: `"0MiB"`, Msg: "is out of range", Allowed: ">= 1"},
		},
		{
			name: "nvme_paths element",
			in:   `{"zinf": {"nvme_paths": ["/a", 7]}}`,
			want: Problem{Key: "zinf.nvme_paths[1]", Value: "7", Msg: "is a number, not a string"},
		},
		{
			name: "nvme_paths duplicate",
			in:   `{"zinf": {"nvme_paths": ["/a", "/a/"]}}`,
			want: Problem{Key: "zinf.nvme_paths[1]", Value: `"/a/"`, Msg: "is listed twice"},
		},
		{
			name: "section not an object",
			in:   `{"aio": [1, 2]}`,
			want: Problem{Key: "aio", Value: "[1, 2]", Msg: "is an array, not an object"},
		},
		{
			name: "unsupported optimizer",
			in:   `{"optimizer": {"type": "Lamb"}}`,
			want: Problem{Key: "optimizer.type", Value: `"Lamb"`, Msg: "is not allowed", Allowed: "Adam, AdamW, SGD, Adagrad, Lion"},
		},
		{
			name: "betas",
			in:   `{"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}}`,
			want: Problem{Key: "optimizer.params.betas", Value: "[0.9]", Msg: "is not a pair of numbers", Allowed: "[beta1, beta2], each in [0, 1)"},
		},
		{
			name: "beta out of range",
			in:   `{"optimizer": {"type": "Adam", "params": {"betas": [0.9, 1]}}}`,
			want: Problem{Key: "optimizer.params.betas[1]", Value: "1", Msg: "is out of range", Allowed: ">= 0 and < 1"},
		},
		{
			name: "eps zero",
			in:   `{"optimizer": {"type": "Adam", "params": {"eps": 0}}}`,
			want: Problem{Key: "optimizer.params.eps", Value: "0", Msg: "is out of range", Allowed: "> 0"},
		},
		{
			name: "amsgrad",
			in:   `{"optimizer": {"type": "Adam", "params": {"amsgrad": true}}}`,
			want: Problem{Key: "optimizer.params.amsgrad", Value: "true", Msg: "is not supported by zinf", Allowed: "false"},
		},
		{
			name: "fp16 and bf16",
			in:   `{"fp16": {"enabled": true}, "bf16": {"enabled": true}}`,
			want: Problem{Key: "bf16.enabled", Value: "true", Msg: "conflicts with fp16.enabled true", Allowed: "at most one of bf16 and fp16"},
		},
		{
			name: "gradient accumulation",
			in:   `{"gradient_accumulation_steps": 0}`,
			want: Problem{Key: "gradient_accumulation_steps", Value: "0", Msg: "is out of range", Allowed: ">= 1"},
		},
		{
			name: "optimizer workers",
			in:   `{"zinf": {"optimizer_workers": 1025}}`,
			want: Problem{Key: "zinf.optimizer_workers", Value: "1025", Msg: "is out of range", Allowed: "0..1024"},
		},
		{
			name: "huge integer",
			in:   `{"zinf": {"prefetch_depth": 1e30}}`,
			want: Problem{Key: "zinf.prefetch_depth", Value: "1e30", Msg: "is out of range", Allowed: "0..1024"},
		},
		{
			name: "duplicate key",
			in:   `{"aio": {"queue_depth": 8, "queue_depth": 16}}`,
			want: Problem{Key: "aio.queue_depth", Msg: "is written more than once"},
		},
		{
			name: "both names of intra_op_parallelism",
			in:   `{"aio": {"thread_count": 2, "intra_op_parallelism": 4}}`,
			want: Problem{Key: "aio.thread_count", Value: "2", Msg: "is the old name of aio.intra_op_parallelism; write only aio.intra_op_parallelism"},
		},
		{
			name: "not an object",
			in:   `[{"aio": {}}]`,
			want: Problem{Msg: "a config must be a JSON object, not an array"},
			line: "line 1, column 1: a config must be a JSON object, not an array",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parseErr(t, tc.in)
			var found bool
			for _, p := range e.Problems {
				p.Line, p.Column = 0, 0
				if p == tc.want {
					found = true
				}
			}
			if !found {
				t.Errorf("want problem %+v\ngot:\n%v", tc.want, e)
			}
			if tc.line != "" && !strings.Contains(e.Error(), tc.line) {
				t.Errorf("Error() does not contain %q:\n%s", tc.line, e)
			}
			for _, p := range e.Problems {
				if p.Key != "" && !strings.HasPrefix(e.Error(), "config: ") {
					t.Errorf("Error() lacks its prefix: %s", e)
				}
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	unsetRankEnv(t)
	e := parseErr(t, `{
  "zero_optimization": {
    "stage": 2,
    "offload_parm": {},
    "offload_param": {"device": "disk", "buffer_count": 0}
  },
  "aio": {"queue_depth": "eight", "block_size": 3000},
  "zinf": {"rank": 2, "world_size": 2, "direct": "sometimes"}
}`)
	wantKeys := []string{
		"zero_optimization.offload_parm",
		"zero_optimization.offload_param.device",
		"zero_optimization.offload_param.buffer_count",
		"aio.queue_depth",
		"aio.block_size",
		"zinf.rank",
		"zinf.direct",
	}
	var got []string
	for _, p := range e.Problems {
		got = append(got, p.Key)
	}
	if !reflect.DeepEqual(got, wantKeys) {
		t.Fatalf("problem keys (in file order) = %q\nwant %q\n%v", got, wantKeys, e)
	}
	lines := strings.Split(e.Error(), "\n")
	if len(lines) != len(wantKeys)+1 || lines[0] != "config: 7 problems:" {
		t.Fatalf("Error() is not one header and one line per problem:\n%s", e)
	}
	// Problems point at the file.
	if p := e.Problems[0]; p.Line != 4 || p.Column != 5 {
		t.Errorf("offload_parm at %d:%d, want 4:5", p.Line, p.Column)
	}
	if p := e.Problems[3]; p.Line != 7 || p.Column != 26 {
		t.Errorf("queue_depth value at %d:%d, want 7:26", p.Line, p.Column)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := Default()
	c.SetScratchDir(t.TempDir())
	if err := c.Validate(); err != nil {
		t.Fatalf("valid default: %v", err)
	}
	c.ZeroOptimization.OffloadParam.BufferCount = 0
	c.ZeroOptimization.OffloadOptimizer.Ratio = 2
	c.AIO.BlockSize = 3000
	c.AIO.QueueDepth = 0
	c.AIO.IntraOpParallelism = 100
	c.Zinf.WorldSize = 2
	c.Zinf.Rank = 5
	c.Zinf.PipelineDepth = -1
	c.Zinf.Backend = "spdk"
	c.FP16, c.BF16 = true, true
	err := c.Validate()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Validate = %v, want *Error", err)
	}
	want := map[string]string{
		"zero_optimization.offload_param.buffer_count": "zero_optimization.offload_param.buffer_count: 0 is out of range (allowed: >= 1)",
		"zero_optimization.offload_optimizer.ratio":    "zero_optimization.offload_optimizer.ratio: 2 is out of range (allowed: greater than 0, at most 1)",
		"aio.block_size":           "aio.block_size: 3000 is not allowed (allowed: a power of two or a multiple of 4096)",
		"aio.queue_depth":          "aio.queue_depth: 0 is out of range (allowed: 1..4096)",
		"aio.intra_op_parallelism": "aio.intra_op_parallelism: 100 is out of range (allowed: 1..64)",
		"zinf.rank":                "zinf.rank: 5 is not below zinf.world_size 2 (allowed: 0..1)",
		"zinf.pipeline_depth":      "zinf.pipeline_depth: -1 is out of range (allowed: 0..16)",
		"zinf.backend":             `zinf.backend: "spdk" is not allowed (allowed: auto, uring, libaio, posix)`,
		"bf16.enabled":             "bf16.enabled: true conflicts with fp16.enabled true (allowed: at most one of bf16 and fp16)",
	}
	if len(e.Problems) != len(want) {
		t.Errorf("got %d problems, want %d:\n%v", len(e.Problems), len(want), e)
	}
	for _, p := range e.Problems {
		if w, ok := want[p.Key]; !ok || p.String() != w {
			t.Errorf("problem %q, want %q", p.String(), w)
		}
		if !strings.Contains(err.Error(), p.String()) {
			t.Errorf("Error() misses %q", p.String())
		}
	}
}

func TestZeroConfigIsInvalid(t *testing.T) {
	// A Config built from nothing is not silently accepted.
	err := (&Config{}).Validate()
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) < 5 {
		t.Fatalf("Validate of a zero Config = %v", err)
	}
}

func TestLoadDeepSpeedZeroInfinity(t *testing.T) {
	unsetRankEnv(t)
	path := filepath.Join("testdata", "ds_zero_infinity.json")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != path {
		t.Errorf("Source = %q", c.Source)
	}
	z := c.ZeroOptimization
	if z.Stage != 3 || z.SubGroupSize != 1e9 {
		t.Errorf("zero = %+v", z)
	}
	wantParam := OffloadParam{Device: OffloadNVMe, NVMePath: "/local_nvme", BufferCount: 5, BufferSize: 1e8, MaxInCPU: 1e9, PinMemory: true}
	if z.OffloadParam != wantParam {
		t.Errorf("offload_param = %+v\nwant %+v", z.OffloadParam, wantParam)
	}
	wantOpt := OffloadOptimizer{Device: OffloadNVMe, NVMePath: "/local_nvme", BufferCount: 4, PinMemory: true, Ratio: 1}
	if z.OffloadOptimizer != wantOpt {
		t.Errorf("offload_optimizer = %+v\nwant %+v", z.OffloadOptimizer, wantOpt)
	}
	wantAIO := AIO{BlockSize: 256 * KiB, QueueDepth: 32, IntraOpParallelism: 1, OverlapEvents: true}
	if c.AIO != wantAIO {
		t.Errorf("aio = %+v\nwant %+v", c.AIO, wantAIO)
	}
	wantOptim := Optimizer{Type: OptimizerAdam, LR: 0.001, Betas: [2]float64{0.8, 0.999}, Eps: 1e-8, WeightDecay: 3e-7, AdamWMode: true}
	if c.Optimizer != wantOptim {
		t.Errorf("optimizer = %+v\nwant %+v", c.Optimizer, wantOptim)
	}
	if !c.FP16 || c.BF16 || c.MicroBatch != 4 || c.GradientAccumulationSteps != 1 {
		t.Errorf("fp16 %v bf16 %v micro %d gas %d", c.FP16, c.BF16, c.MicroBatch, c.GradientAccumulationSteps)
	}
	// zinf's defaults fill what DeepSpeed does not say.
	if c.Zinf.PipelineDepth != 1 || c.Zinf.OptimizerWorkers != 0 || c.Zinf.GDS != GDSOff || c.Zinf.Device != DeviceAuto ||
		!c.Zinf.Checksums || c.Zinf.Direct != DirectOptional || c.Zinf.Tiers.CPUPinnedBytes != 256*MiB {
		t.Errorf("zinf = %+v", c.Zinf)
	}
	if got := c.NVMePaths(); !reflect.DeepEqual(got, []string{"/local_nvme"}) {
		t.Errorf("NVMePaths = %q", got)
	}
	if r, w := c.RankWorld(); r != 0 || w != 1 {
		t.Errorf("RankWorld = %d, %d", r, w)
	}

	var threadWarning, ignoredWarning string
	for _, w := range c.Warnings {
		if strings.Contains(w, "thread_count") {
			threadWarning = w
		}
		if strings.HasPrefix(w, "ignored (DeepSpeed key not used by zinf): ") {
			ignoredWarning = w
		}
	}
	if threadWarning != "aio.thread_count is DeepSpeed's old name for aio.intra_op_parallelism; read as intra_op_parallelism 1" {
		t.Errorf("thread_count warning = %q (warnings %q)", threadWarning, c.Warnings)
	}
	// The training keys are read, not ignored.
	wantScaling := LossScaling{LossScale: 0, InitialScalePower: 16, LossScaleWindow: 1000, Hysteresis: 2, MinLossScale: 1}
	if c.GradientClipping != 1 || c.LossScaling != wantScaling || c.Scheduler.Type != SchedulerWarmupLR ||
		c.Scheduler.WarmupMinLR != 0 || c.Scheduler.WarmupMaxLR != 0.001 || c.Scheduler.WarmupNumSteps != 1000 || c.Scheduler.WarmupType != WarmupLog {
		t.Errorf("training keys: clipping %v, loss scaling %+v, scheduler %+v", c.GradientClipping, c.LossScaling, c.Scheduler)
	}
	for _, k := range []string{"gradient_clipping", "scheduler", "fp16.loss_scale", "fp16.hysteresis", "fp16.min_loss_scale"} {
		if contains(c.Ignored, k) || strings.Contains(ignoredWarning, k) {
			t.Errorf("%q is listed as ignored: %q", k, c.Ignored)
		}
	}
	for _, k := range []string{
		"train_batch_size", "steps_per_print", "wall_clock_breakdown", "zero_optimization.contiguous_gradients",
		"zero_optimization.overlap_comm", "zero_optimization.stage3_prefetch_bucket_size",
		"zero_optimization.stage3_gather_16bit_weights_on_model_save",
	} {
		if !contains(c.Ignored, k) {
			t.Errorf("Ignored lacks %q: %q", k, c.Ignored)
		}
		if !strings.Contains(ignoredWarning, k) {
			t.Errorf("ignored warning lacks %q: %q", k, ignoredWarning)
		}
	}
	if len(c.Warnings) != 2 {
		t.Errorf("warnings = %q", c.Warnings)
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.json")
	_, err := Load(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
	if errors.Is(err, ErrInvalid) {
		t.Errorf("a missing file is not an invalid config")
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{\n  \"aio\": {\"queue_depth\": 0}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	var e *Error
	if !errors.As(err, &e) || e.Source != bad {
		t.Fatalf("Load(bad) = %v", err)
	}
	want := "config: " + bad + ": aio.queue_depth: 0 is out of range (allowed: 1..4096)"
	if err.Error() != want {
		t.Errorf("Error() = %q\nwant %q", err, want)
	}
	if p := e.Problems[0]; p.Line != 2 || p.Column != 26 {
		t.Errorf("position %d:%d, want 2:26", p.Line, p.Column)
	}
}

func TestSyntaxErrors(t *testing.T) {
	for _, tc := range []struct {
		in        string
		line, col int
		msg       string
	}{
		{"{\n  \"aio\": {\"queue_depth\": 8,}\n}", 2, 28, "invalid character '}'"},
		{"{\n  \"aio\": {\"queue_depth\": 8}\n", 3, 1, "unexpected end of JSON input"},
		{"{\"a\": 1} {}", 1, 10, "after top-level value"},
		{"{}x", 1, 3, "after top-level value"},
		{"{'aio': {}}", 1, 2, "invalid character '\\''"},
		{"", 1, 1, "the file is empty"},
		{"\n\n   ", 3, 4, "the file is empty"},
	} {
		e := parseErr(t, tc.in)
		if len(e.Problems) != 1 {
			t.Fatalf("%q: %v", tc.in, e)
		}
		p := e.Problems[0]
		if p.Line != tc.line || p.Column != tc.col || !strings.Contains(p.Msg, tc.msg) {
			t.Errorf("%q: got %d:%d %q; want %d:%d containing %q", tc.in, p.Line, p.Column, p.Msg, tc.line, tc.col, tc.msg)
		}
		if !strings.Contains(e.Error(), "line ") {
			t.Errorf("%q: Error() = %q lacks the position", tc.in, e)
		}
	}
}

func TestDefault(t *testing.T) {
	unsetRankEnv(t)
	c := Default()
	if c.Zinf.Device != DeviceSim || c.ZeroOptimization.Stage != 3 ||
		c.ZeroOptimization.OffloadParam.Device != OffloadNVMe || c.ZeroOptimization.OffloadOptimizer.Device != OffloadNVMe {
		t.Errorf("Default = %+v", c)
	}
	if !c.NeedsScratchDir() || len(c.NVMePaths()) != 0 {
		t.Errorf("Default should need a scratch dir")
	}
	var e *Error
	if err := c.Validate(); !errors.As(err, &e) || len(e.Problems) != 2 ||
		e.Problems[0].Key != "zero_optimization.offload_param.nvme_path" ||
		e.Problems[1].Key != "zero_optimization.offload_optimizer.nvme_path" {
		t.Fatalf("Default().Validate() = %v", err)
	}
	dir := t.TempDir()
	c.SetScratchDir(dir)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.NeedsScratchDir() || !reflect.DeepEqual(c.NVMePaths(), []string{dir}) {
		t.Errorf("NVMePaths = %q", c.NVMePaths())
	}
	if len(c.Warnings) != 0 || len(c.Ignored) != 0 {
		t.Errorf("default config has warnings %q", c.Warnings)
	}
	// DefaultJSON is the file Default reads, and a copy.
	j := DefaultJSON()
	j[0] = 'x'
	if DefaultJSON()[0] != '{' {
		t.Errorf("DefaultJSON is not a copy")
	}
	if c.GPUBytes(0) != int64(256*MiB) {
		t.Errorf("GPUBytes = %d", c.GPUBytes(0))
	}
}

func TestGPUBytes(t *testing.T) {
	c := defaults()
	if got := c.GPUBytes(0); got != int64(DefaultSimGPUBytes) {
		t.Errorf("sim fallback = %d", got)
	}
	if got := c.GPUBytes(80 << 30); got != 80<<30 {
		t.Errorf("device free = %d", got)
	}
	c.Zinf.Tiers.GPUBytes = 2 * GiB
	if got := c.GPUBytes(80 << 30); got != 2<<30 {
		t.Errorf("configured = %d", got)
	}
}

func TestRankWorldFromEnvironment(t *testing.T) {
	unsetRankEnv(t)
	t.Setenv("RANK", "3")
	t.Setenv("WORLD_SIZE", "8")
	c := mustParse(t, `{}`)
	if r, w := c.RankWorld(); r != 3 || w != 8 {
		t.Errorf("RankWorld from env = %d, %d", r, w)
	}
	// The file wins over the environment.
	c = mustParse(t, `{"zinf": {"rank": 1, "world_size": 2}}`)
	if r, w := c.RankWorld(); r != 1 || w != 2 {
		t.Errorf("RankWorld from file = %d, %d", r, w)
	}
	// A rank the environment puts outside the world is reported.
	t.Setenv("RANK", "8")
	e := parseErr(t, `{}`)
	if len(e.Problems) != 1 || e.Problems[0].String() != "zinf.rank: 8 is not below zinf.world_size 8 (allowed: 0..7)" {
		t.Errorf("got %v", e)
	}
	// Garbage in the environment is reported, not ignored, by Parse and by
	// Validate on Default (which must not panic).
	t.Setenv("RANK", "three")
	e = parseErr(t, `{}`)
	if len(e.Problems) != 1 || e.Problems[0].String() != `zinf.rank: "three" (from $RANK) is not a non-negative integer` {
		t.Errorf("got %v", e)
	}
	if err := Default().Validate(); err == nil || !strings.Contains(err.Error(), "$RANK") {
		t.Errorf("Default().Validate() = %v", err)
	}
	// Unset variables give 0 and 1.
	unsetRankEnv(t)
	c = mustParse(t, `{}`)
	if r, w := c.RankWorld(); r != 0 || w != 1 {
		t.Errorf("RankWorld without env = %d, %d", r, w)
	}
	// Open MPI's and Slurm's variables, in that order; never a rank from
	// one launcher with a size from another.
	t.Setenv("SLURM_PROCID", "5")
	t.Setenv("SLURM_NTASKS", "6")
	if r, w := mustParse(t, `{}`).RankWorld(); r != 5 || w != 6 {
		t.Errorf("RankWorld from Slurm = %d, %d", r, w)
	}
	t.Setenv("OMPI_COMM_WORLD_RANK", "2")
	t.Setenv("OMPI_COMM_WORLD_SIZE", "4")
	if r, w := mustParse(t, `{}`).RankWorld(); r != 2 || w != 4 {
		t.Errorf("RankWorld from Open MPI = %d, %d", r, w)
	}
	t.Setenv("RANK", "0")
	if r, w := mustParse(t, `{}`).RankWorld(); r != 0 || w != 1 {
		t.Errorf("RankWorld with RANK only = %d, %d (WORLD_SIZE must not come from another launcher)", r, w)
	}
	t.Setenv("RANK", "")
	os.Unsetenv("RANK")
	t.Setenv("OMPI_COMM_WORLD_SIZE", "x")
	t.Setenv("OMPI_COMM_WORLD_RANK", "0")
	if e := parseErr(t, `{}`); len(e.Problems) != 1 || !strings.Contains(e.Problems[0].String(), "$OMPI_COMM_WORLD_SIZE") {
		t.Errorf("a bad OMPI_COMM_WORLD_SIZE: %v", e)
	}
}

func TestDerivedDefaults(t *testing.T) {
	unsetRankEnv(t)
	const opt = `{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"%s}}%s}`
	for _, tc := range []struct {
		flags, zinf string
		want        int
		auto        bool
	}{
		{"", "", 1, true},
		{`, "pipeline_read": true`, "", 1, true},
		{`, "pipeline_read": false`, "", 1, true},
		{`, "pipeline_read": false, "pipeline_write": false`, "", 0, false},
		{`, "pipeline_read": true, "pipeline_write": false`, "", 1, true},
		{`, "pipeline_read": false, "pipeline_write": false`, `, "zinf": {"pipeline_depth": 3}`, 3, false},
		{`, "pipeline_read": true, "pipeline_write": true`, `, "zinf": {"pipeline_depth": 0}`, 0, false},
		{`, "pipeline_read": false, "pipeline_write": false`, `, "zinf": {"pipeline_depth": "auto"}`, 1, true},
	} {
		c := mustParse(t, strings.Replace(strings.Replace(opt, "%s", tc.flags, 1), "%s", tc.zinf, 1))
		if c.Zinf.PipelineDepth != tc.want || c.Zinf.PipelineDepthAuto != tc.auto {
			t.Errorf("flags %q zinf %q: pipeline_depth %d auto %v, want %d auto %v", tc.flags, tc.zinf, c.Zinf.PipelineDepth, c.Zinf.PipelineDepthAuto, tc.want, tc.auto)
		}
	}

	if c := mustParse(t, `{"aio": {"use_gds": true}}`); c.Zinf.GDS != GDSAuto {
		t.Errorf("use_gds true: gds %q", c.Zinf.GDS)
	}
	if c := mustParse(t, `{"aio": {"use_gds": true}, "zinf": {"gds": "required", "device": "cuda"}}`); c.Zinf.GDS != GDSRequired {
		t.Errorf("explicit gds: %q", c.Zinf.GDS)
	}
	c := mustParse(t, `{"aio": {"use_gds": true}, "zinf": {"gds": "off"}}`)
	if c.Zinf.GDS != GDSOff || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "use_gds") {
		t.Errorf("gds off despite use_gds: %q %q", c.Zinf.GDS, c.Warnings)
	}

	// zinf.nvme_paths takes precedence over the offload paths, with a
	// warning for a path left unused.
	c = mustParse(t, `{"zero_optimization": {"stage": 3,
		"offload_param": {"device": "nvme", "nvme_path": "/old"},
		"offload_optimizer": {"device": "nvme"}},
		"zinf": {"nvme_paths": ["/nvme0", "/nvme1"]}}`)
	if !reflect.DeepEqual(c.NVMePaths(), []string{"/nvme0", "/nvme1"}) {
		t.Errorf("NVMePaths = %q", c.NVMePaths())
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], `"/old" is not used`) {
		t.Errorf("warnings = %q", c.Warnings)
	}
	// Without it, the offload paths, deduplicated.
	c = mustParse(t, `{"zero_optimization": {"stage": 3,
		"offload_param": {"device": "nvme", "nvme_path": "/a"},
		"offload_optimizer": {"device": "nvme", "nvme_path": "/a/"}}}`)
	if !reflect.DeepEqual(c.NVMePaths(), []string{"/a"}) {
		t.Errorf("NVMePaths = %q", c.NVMePaths())
	}
	c = mustParse(t, `{"zero_optimization": {"stage": 3,
		"offload_param": {"device": "cpu", "nvme_path": "/unused"},
		"offload_optimizer": {"device": "nvme", "nvme_path": "/b"}}}`)
	if !reflect.DeepEqual(c.NVMePaths(), []string{"/b"}) {
		t.Errorf("NVMePaths = %q", c.NVMePaths())
	}
}

func TestDeprecatedAndCompatibleForms(t *testing.T) {
	unsetRankEnv(t)
	c := mustParse(t, `{"zero_optimization": true}`)
	if c.ZeroOptimization.Stage != 1 || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "deprecated") {
		t.Errorf("zero_optimization true: stage %d, warnings %q", c.ZeroOptimization.Stage, c.Warnings)
	}
	c = mustParse(t, `{"zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true, "cpu_offload_use_pin_memory": true}}`)
	z := c.ZeroOptimization
	if z.OffloadOptimizer.Device != OffloadCPU || z.OffloadParam.Device != OffloadCPU ||
		!z.OffloadParam.PinMemory || !z.OffloadOptimizer.PinMemory || len(c.Warnings) != 3 {
		t.Errorf("cpu_offload: %+v, warnings %q", z, c.Warnings)
	}
	// The section wins over the old switch.
	c = mustParse(t, `{"zero_optimization": {"stage": 3, "cpu_offload": true, "offload_optimizer": {"device": "none"}}}`)
	if c.ZeroOptimization.OffloadOptimizer.Device != OffloadNone {
		t.Errorf("offload_optimizer section lost to cpu_offload")
	}
	c = mustParse(t, `{"bfloat16": {"enabled": true}}`)
	if !c.BF16 || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "bfloat16") {
		t.Errorf("bfloat16: %v %q", c.BF16, c.Warnings)
	}
	parseErr(t, `{"bfloat16": {"enabled": true}, "bf16": {"enabled": true}}`)

	// Hugging Face's "auto" reads as the default, with a warning; but
	// gradient_accumulation_steps "auto" lets the planner pick k, said by
	// GradientAccumulationAuto and not warned about.
	c = mustParse(t, `{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
		"fp16": {"enabled": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
		"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}}`)
	if c.MicroBatch != 1 || c.GradientAccumulationSteps != 1 || !c.GradientAccumulationAuto || c.FP16 || c.Optimizer.LR != 1e-3 || len(c.Warnings) != 7 {
		t.Errorf("auto: %+v, warnings %q", c, c.Warnings)
	}
	for _, w := range c.Warnings {
		if strings.Contains(w, "gradient_accumulation_steps") {
			t.Errorf("gradient_accumulation_steps \"auto\" warned: %q", w)
		}
	}
	// "auto" is not accepted where zinf does not know what it would mean.
	parseErr(t, `{"aio": {"queue_depth": "auto"}}`)

	// Optimizer types in any case; null means default.
	c = mustParse(t, `{"optimizer": {"type": "adamw", "params": null}, "aio": {"queue_depth": null}}`)
	if c.Optimizer.Type != OptimizerAdamW || c.AIO.QueueDepth != 8 || !c.Optimizer.DecoupledWeightDecay() {
		t.Errorf("optimizer %+v, queue depth %d", c.Optimizer, c.AIO.QueueDepth)
	}
	c = mustParse(t, `{"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}}`)
	if c.Optimizer.DecoupledWeightDecay() {
		t.Errorf("Adam with adam_w_mode false decouples weight decay")
	}
	// A UTF-8 byte order mark is skipped.
	mustParse(t, "\xef\xbb\xbf{}")
}

func TestUnknownKeySuggestions(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"zero_optimisation": {}}`, `zero_optimisation: unknown key (did you mean "zero_optimization"?)`},
		{`{"aio": {"thread_cnt": 1}}`, `aio.thread_cnt: unknown key (did you mean "aio.thread_count"?)`},
		{`{"aio": {"blcok_size": 4096}}`, `aio.blcok_size: unknown key (did you mean "aio.block_size"?)`},
		{`{"zinf": {"nvme_path": "/x"}}`, `zinf.nvme_path: unknown key (did you mean "zinf.nvme_paths"?)`},
		{`{"zinf": {"tiers": {"gpu": 1}}}`, `zinf.tiers.gpu: unknown key (allowed: gpu_bytes, cpu_pinned_bytes)`},
		{`{"zinf": {"stage": 3}}`, `zinf.stage: unknown key here (did you mean "zero_optimization.stage"?)`},
		{`{"fp61": {"enabled": true}}`, `fp61: unknown key (did you mean "fp16"?)`},
		{`{"zinff": {}}`, `zinff: unknown key (did you mean "zinf"?)`},
		{`{"something_else_entirely": 1}`, `something_else_entirely: unknown key`},
	} {
		e := parseErr(t, tc.in)
		if e.Problems[0].String() != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.in, e.Problems[0].String(), tc.want)
		}
	}
}

func TestProblemString(t *testing.T) {
	for _, tc := range []struct {
		p    Problem
		want string
	}{
		{Problem{Key: "a.b", Value: `"x"`, Msg: "is not allowed", Allowed: "y, z"}, `a.b: "x" is not allowed (allowed: y, z)`},
		{Problem{Key: "a.b", Msg: "unknown key"}, `a.b: unknown key`},
		{Problem{Msg: "invalid JSON: boom", Line: 3, Column: 7}, `line 3, column 7: invalid JSON: boom`},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	if got := (&Error{Source: "f.json"}).Error(); got != "config: f.json: invalid" {
		t.Errorf("empty Error = %q", got)
	}
}

func TestLongValuesAreShortened(t *testing.T) {
	long := strings.Repeat("x", 500)
	e := parseErr(t, `{"zinf": {"device": "`+long+`"}}`)
	if v := e.Problems[0].Value; len(v) > maxRaw+3 || !strings.HasSuffix(v, "...") {
		t.Errorf("value %q not shortened", v)
	}
}

// comparable strips what a round trip legitimately loses.
func comparable(c *Config) Config {
	out := *c
	out.Warnings, out.Ignored, out.Source, out.envProblems = nil, nil, "", nil
	return out
}

func TestMarshalRoundTrip(t *testing.T) {
	unsetRankEnv(t)
	ds, err := Load(filepath.Join("testdata", "ds_zero_infinity.json"))
	if err != nil {
		t.Fatal(err)
	}
	def := Default()
	def.SetScratchDir("/scratch")
	withPaths := mustParse(t, `{"zinf": {"nvme_paths": ["/n0", "/n1"], "swap_file_bytes": "1GiB", "rank": 1, "world_size": 2}}`)
	for _, c := range []*Config{ds, def, withPaths} {
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if !reflect.DeepEqual(comparable(c), comparable(back)) {
			t.Errorf("round trip changed the config:\n%+v\n%+v", comparable(c), comparable(back))
		}
		if len(back.Warnings) != 0 {
			t.Errorf("marshalled config has warnings: %q", back.Warnings)
		}
		// The environment does not change a written config.
		t.Setenv("RANK", "1")
		t.Setenv("WORLD_SIZE", "4")
		again, err := Parse(out)
		if err != nil || !reflect.DeepEqual(comparable(c), comparable(again)) {
			t.Errorf("env changed the re-read config: %v", err)
		}
		unsetRankEnv(t)
	}
}

func TestAIOSection(t *testing.T) {
	out, err := AIOSection(AIO{BlockSize: 256 * KiB, QueueDepth: 32, IntraOpParallelism: 4, OverlapEvents: true, UseGDS: false})
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "aio": {
    "block_size": 262144,
    "queue_depth": 32,
    "intra_op_parallelism": 4,
    "single_submit": false,
    "overlap_events": true,
    "use_gds": false
  }
}
`
	if string(out) != want {
		t.Errorf("AIOSection =\n%s\nwant\n%s", out, want)
	}
	unsetRankEnv(t)
	c := mustParse(t, string(out))
	if c.AIO.BlockSize != 256*KiB || c.AIO.QueueDepth != 32 || c.AIO.IntraOpParallelism != 4 || len(c.Warnings) != 0 {
		t.Errorf("re-read %+v %q", c.AIO, c.Warnings)
	}
	_, err = AIOSection(AIO{BlockSize: 100, QueueDepth: 0, IntraOpParallelism: 1})
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) != 2 {
		t.Errorf("AIOSection(invalid) = %v", err)
	}
}

// TestOptimizerWorkers: zinf.optimizer_workers parses, survives a
// round trip through MarshalJSON, and is left out of files that do not set
// it.
func TestOptimizerWorkers(t *testing.T) {
	c, err := Parse([]byte(`{"zinf": {"optimizer_workers": 3}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Zinf.OptimizerWorkers != 3 {
		t.Fatalf("optimizer_workers = %d, want 3", c.Zinf.OptimizerWorkers)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if back.Zinf.OptimizerWorkers != 3 {
		t.Fatalf("after a round trip optimizer_workers = %d, want 3:\n%s", back.Zinf.OptimizerWorkers, out)
	}
	d, err := Parse([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err = d.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "optimizer_workers") {
		t.Errorf("a default config writes optimizer_workers:\n%s", out)
	}
}
