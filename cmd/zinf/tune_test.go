package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

var tinyGrid = []string{"--size", "8MiB", "--loops", "1", "--block-sizes", "256KiB", "--queue-depths", "4", "--parallel", "1", "--backends", "posix"}

// TestTune runs a one-point grid: progress on stderr, a table, and a config
// section with DeepSpeed's exact aio keys and JSON types that config.Parse
// accepts, alone and merged into a full config.
func TestTune(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, append([]string{"tune", "--path", dir}, tinyGrid...)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "stderr", errs, "tuning "+dir, "[  1/4]", "[  4/4]", "left)")
	wantAll(t, "stdout", out, "backend", "qd", "single_submit", "overlap_events", "read GB/s", "write GB/s", "score", "best: backend posix")
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("tune left %v", got)
	}

	const marker = "config section that reproduces it:\n"
	i := strings.Index(out, marker)
	if i < 0 {
		t.Fatalf("no config section:\n%s", out)
	}
	section := []byte(out[i+len(marker):])
	var sec struct {
		AIO  map[string]json.RawMessage `json:"aio"`
		Zinf map[string]json.RawMessage `json:"zinf"`
	}
	if err := json.Unmarshal(section, &sec); err != nil {
		t.Fatalf("config section is not JSON: %v\n%s", err, section)
	}
	types := map[string]string{"block_size": "number", "queue_depth": "number", "intra_op_parallelism": "number",
		"single_submit": "bool", "overlap_events": "bool"}
	for key, want := range types {
		raw, ok := sec.AIO[key]
		if !ok {
			t.Errorf("aio.%s missing:\n%s", key, section)
			continue
		}
		var v any
		json.Unmarshal(raw, &v)
		switch v.(type) {
		case float64:
			if want != "number" {
				t.Errorf("aio.%s = %s, want a %s", key, raw, want)
			}
		case bool:
			if want != "bool" {
				t.Errorf("aio.%s = %s, want a %s", key, raw, want)
			}
		default:
			t.Errorf("aio.%s = %s, want a %s", key, raw, want)
		}
	}
	if string(sec.AIO["block_size"]) != "262144" || string(sec.AIO["queue_depth"]) != "4" || string(sec.AIO["intra_op_parallelism"]) != "1" {
		t.Errorf("aio section does not reproduce the only grid point:\n%s", section)
	}
	if string(sec.Zinf["backend"]) != `"posix"` {
		t.Errorf("zinf.backend = %s, want \"posix\"", sec.Zinf["backend"])
	}

	cfg, err := config.Parse(section)
	if err != nil {
		t.Fatalf("config.Parse rejects the section: %v\n%s", err, section)
	}
	if cfg.AIO.BlockSize != 256<<10 || cfg.AIO.QueueDepth != 4 || cfg.Zinf.Backend != config.BackendPosix {
		t.Fatalf("parsed: aio %+v, backend %q", cfg.AIO, cfg.Zinf.Backend)
	}

	// Merged into the embedded default config, as a user would paste it.
	var full map[string]any
	if err := json.Unmarshal(config.DefaultJSON(), &full); err != nil {
		t.Fatal(err)
	}
	var parsed map[string]map[string]any
	json.Unmarshal(section, &parsed)
	full["aio"] = parsed["aio"]
	full["zinf"].(map[string]any)["backend"] = parsed["zinf"]["backend"]
	zero := full["zero_optimization"].(map[string]any)
	for _, k := range []string{"offload_param", "offload_optimizer"} {
		zero[k].(map[string]any)["nvme_path"] = dir
	}
	merged, _ := json.Marshal(full)
	path := filepath.Join(t.TempDir(), "ds_config.json")
	if err := os.WriteFile(path, merged, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err = config.Load(path)
	if err != nil {
		t.Fatalf("merged config: %v", err)
	}
	if cfg.AIO.BlockSize != 256<<10 || cfg.AIO.QueueDepth != 4 || cfg.Zinf.Backend != config.BackendPosix || len(cfg.Warnings) != 0 {
		t.Fatalf("merged config: aio %+v, backend %q, warnings %v", cfg.AIO, cfg.Zinf.Backend, cfg.Warnings)
	}
}

// TestTuneBadInput: a bad grid is refused whole, before the first run.
func TestTuneBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"no path", []string{"--size", "8MiB"}, []string{"--path is required"}},
		{"missing path", []string{"--path", filepath.Join(dir, "nope")}, []string{"--path", "nope"}},
		{"zero size", []string{"--path", dir, "--size", "0"}, []string{"--size 0"}},
		{"zero loops", []string{"--path", dir, "--loops", "0"}, []string{"--loops 0"}},
		{"bad grid", []string{"--path", dir, "--size", "8MiB", "--backends", "posix,spdk", "--block-sizes", "256KiB,1000", "--queue-depths", "4,5000", "--parallel", "1,65"},
			[]string{`--backends: "spdk"`, "--block-sizes", "1000", "--queue-depths: 5000", "--parallel: 65"}},
		{"unparsable list", []string{"--path", dir, "--queue-depths", "4,deep"}, []string{"--queue-depths", "deep"}},
		{"zero in a list", []string{"--path", dir, "--block-sizes", "0"}, []string{"--block-sizes", `"0"`}},
		{"direct policy", []string{"--path", dir, "--direct", "sometimes"}, []string{"--direct", "sometimes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := runCLI(t, append([]string{"tune"}, c.args...)...)
			if code == 0 {
				t.Fatalf("succeeded:\n%s", out)
			}
			wantAll(t, "the error", errs, c.want...)
			if strings.Contains(errs, "tuning ") {
				t.Errorf("the sweep started before the input was checked:\n%s", errs)
			}
			if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
				t.Fatalf("a rejected tune left %v", got)
			}
		})
	}
}

// TestTunePlot: zinf tune --plot draws the sweep; an existing or unknown
// picture file is refused before the sweep runs.
func TestTunePlot(t *testing.T) {
	dir := t.TempDir()
	pic := filepath.Join(dir, "tune.svg")
	grid := []string{"--size", "8MiB", "--loops", "1", "--block-sizes", "256KiB,1MiB", "--queue-depths", "4", "--parallel", "1", "--backends", "posix"}
	code, _, errs := runCLI(t, append([]string{"tune", "--path", dir, "--plot", pic}, grid...)...)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errs)
	}
	wantAll(t, "stderr", errs, "plot: "+pic)
	b, err := os.ReadFile(pic)
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, "the SVG", string(b), "posix qd 4", "256K", "1M", "zinf tune "+dir)
	for _, bad := range []string{pic, filepath.Join(dir, "tune.jpg")} {
		code, _, errs := runCLI(t, append([]string{"tune", "--path", dir, "--plot", bad}, grid...)...)
		if code == 0 || strings.Contains(errs, "tuning ") {
			t.Errorf("--plot %s: exit %d, and the sweep ran:\n%s", bad, code, errs)
		}
	}
}
