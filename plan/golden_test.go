package plan_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/tensor"
)

var update = flag.Bool("update", false, "rewrite the plans of testdata/golden/*.txt from the planner")

// goldenSeparator divides a golden file's inputs from the plan's text.
const goldenSeparator = "----\n"

// TestGoldenPlans plans the configurations the README and the demos use,
// each written in testdata/golden/NAME.txt as its inputs (the `zinf plan`
// flags: model, config, compute, schedule, micro-batches, rank), then a
// line of dashes, then the plan's text as `zinf plan` prints it (the
// placement table, the bandwidth, the disk, the pinned reservations, the
// NVMe bytes per step). The planner is pure: the bandwidth is the
// config's figures or the defaults and the stores' geometry is a sizing
// store's, so the text is the same on every machine. A change of a plan
// shows as a diff of its text; go test ./plan -run TestGoldenPlans
// -update rewrites the texts after a change that is meant.
func TestGoldenPlans(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no golden plans in testdata/golden")
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			inputs, want, ok := strings.Cut(string(raw), goldenSeparator)
			if !ok {
				t.Fatalf("%s: no %q line after the inputs", path, strings.TrimSpace(goldenSeparator))
			}
			got, err := goldenPlan(inputs)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if *update {
				if err := os.WriteFile(path, []byte(inputs+goldenSeparator+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != want {
				t.Errorf("%s: the plan changed (go test ./plan -run TestGoldenPlans -update rewrites it if meant):\n%s", path, lineDiff(want, got))
			}
		})
	}
}

// goldenPlan reads a golden file's inputs ("key: value" lines, # for
// comments) and returns the plan's text.
func goldenPlan(inputs string) (string, error) {
	modelSpec, cfgName := "", "default"
	var compute time.Duration
	var schedule string
	micro, rank := 0, 0
	for i, line := range strings.Split(inputs, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return "", fmt.Errorf("line %d: %q is not key: value", i+1, line)
		}
		v = strings.TrimSpace(v)
		var err error
		switch k {
		case "model":
			modelSpec = v
		case "config":
			cfgName = v
		case "compute":
			compute, err = time.ParseDuration(v)
		case "schedule":
			schedule = v
		case "micro-batches":
			micro, err = strconv.Atoi(v)
		case "rank":
			rank, err = strconv.Atoi(v)
		default:
			return "", fmt.Errorf("line %d: unknown key %q (allowed: model, config, compute, schedule, micro-batches, rank)", i+1, k)
		}
		if err != nil {
			return "", fmt.Errorf("line %d: %s: %w", i+1, k, err)
		}
	}
	m, err := policy.ParseModelSpec(modelSpec)
	if err != nil {
		return "", fmt.Errorf("model: %w", err)
	}
	cfg := config.Default()
	if cfgName != "default" {
		if cfg, err = config.Load(filepath.Join("testdata", "golden", cfgName)); err != nil {
			return "", err
		}
	}
	// As zinf plan does: the model's dtype is the parameters' dtype, and
	// the swap files go to a path that need not exist.
	cfg.BF16, cfg.FP16 = m.DType == tensor.BFloat16, m.DType == tensor.Float16
	cfg.SetScratchDir("/nvme")
	if micro > 0 {
		cfg.GradientAccumulationSteps, cfg.GradientAccumulationAuto = micro, false
	}
	if schedule != "" {
		cfg.Zinf.Schedule = config.ScheduleMode(schedule)
	}
	in, err := plan.Check(cfg, plan.Model{Tensors: m.Tensors(), Layers: m.Layers}, plan.Given{Rank: rank, WorldSize: m.World})
	if err != nil {
		return "", err
	}
	ms := plan.Measured{Bandwidth: plan.StaticBandwidth(cfg), Stores: plan.GeometryOf(&in.Settings)}
	p, err := plan.Make(in, ms, plan.Options{ComputePerLayer: compute})
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "model %s: %d parameters\n\n", m, m.ParamCount())
	if err := p.WriteText(&b); err != nil {
		return "", err
	}
	plan.WritePlanStepBytes(&b, cfg, p)
	return b.String(), nil
}

// lineDiff lists the lines that differ between want and got, numbered.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %q\n  got  %q\n", i+1, wl, gl)
		}
	}
	return b.String()
}
