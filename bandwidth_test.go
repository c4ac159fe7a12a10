package zinf_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/probe"
	"github.com/zinfio/zinf/tensor"
)

// bwModel is small enough to open quickly and has NVMe traffic to
// predict.
var bwModel = zinf.LayeredModel(
	[]tensor.Desc{{Name: "a", Shape: []int{300, 301}}},
	[]tensor.Desc{{Name: "b", Shape: []int{300, 301}}},
	[]tensor.Desc{{Name: "c", Shape: []int{300, 301}}},
)

// bwConfig is testConfig with a pool that holds bwModel.
func bwConfig(t *testing.T) (*config.Config, string) {
	c, dir := testConfig(t)
	c.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	return c, dir
}

func openBW(t *testing.T, c *config.Config, o zinf.Options) *zinf.Runtime {
	t.Helper()
	rt, err := zinf.Open(c, bwModel, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// sources lists each path's source.
func sources(bw zinf.Bandwidth) []zinf.BandwidthSource {
	var out []zinf.BandwidthSource
	for _, p := range bw.Paths {
		out = append(out, p.Source)
	}
	return out
}

func onlySource(t *testing.T, what string, bw zinf.Bandwidth, want zinf.BandwidthSource) {
	t.Helper()
	if len(bw.Paths) == 0 {
		t.Fatalf("%s: no paths", what)
	}
	for _, p := range bw.Paths {
		if p.Source != want {
			t.Fatalf("%s: sources %v, want all %q:\n%s", what, sources(bw), want, bw)
		}
	}
}

// TestBandwidthFromConfig: the config's figures are each path's; several
// paths add up in the plan's tiers; the prediction follows the figure.
func TestBandwidthFromConfig(t *testing.T) {
	zinf.ForgetBandwidths()
	open := func(readBps, writeBps int64, paths int) *zinf.Runtime {
		c, dir := bwConfig(t)
		c.Zinf.Bandwidth.ReadBytesPerSec, c.Zinf.Bandwidth.WriteBytesPerSec = config.Size(readBps), config.Size(writeBps)
		for i := range paths {
			p := filepath.Join(dir, "p", string(rune('a'+i)))
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			c.Zinf.NVMePaths = append(c.Zinf.NVMePaths, p)
		}
		return openBW(t, c, zinf.Options{})
	}
	one := open(1e9, 5e8, 1)
	onlySource(t, "config figures", one.Bandwidth(), zinf.BandwidthFromConfig)
	if p := one.Bandwidth().Paths[0]; p.ReadBps != 1e9 || p.WriteBps != 5e8 {
		t.Fatalf("path figures %+v, want the config's 1e9 / 5e8", p)
	}
	tiers := one.Placement().Tiers
	if tiers.NVMeReadBps != 1e9 || tiers.NVMeWriteBps != 5e8 || tiers.NVMeBandwidthSource != "config" {
		t.Fatalf("plan tiers %+v", tiers)
	}
	three := open(1e9, 5e8, 3)
	if tt := three.Placement().Tiers; tt.NVMeReadBps != 3e9 || tt.NVMeWriteBps != 15e8 || tt.NVMePaths != 3 {
		t.Fatalf("three striped paths: tiers %+v, want 3x the per-path figures", tt)
	}
	// Figures given in Options are used as they are.
	c, _ := bwConfig(t)
	given := zinf.Bandwidth{Paths: []zinf.PathBandwidth{{Path: c.NVMePaths()[0], ReadBps: 4e9, WriteBps: 3e9, Source: zinf.BandwidthFromFile, Detail: "shared"}}}
	shared := openBW(t, c, zinf.Options{Bandwidth: &given})
	if got := shared.Bandwidth(); len(got.Paths) != 1 || got.Paths[0] != given.Paths[0] || shared.Placement().Tiers.NVMeReadBps != 4e9 {
		t.Fatalf("Options.Bandwidth %+v: runtime has %+v", given, got)
	}
	// A slower device: a longer predicted step, optimizer I/O the most.
	slow := open(1e8, 5e7, 1)
	if s, f := slow.Placement().Predicted, one.Placement().Predicted; !(s.OptimizerIO > f.OptimizerIO && s.Total > f.Total) {
		t.Fatalf("at 1/10 the bandwidth the prediction did not grow: slow %+v, fast %+v", s, f)
	}
	if s, f := slow.Placement().Predicted.OptimizerIO, one.Placement().Predicted.OptimizerIO; s < 5*f {
		t.Errorf("optimizer I/O at 1/10 the bandwidth: %v vs %v", s, f)
	}
}

// writeResults records figures for path in a results file, as `zinf tune
// --bandwidth-file` does.
func writeResults(t *testing.T, file, path string, read, write float64) {
	t.Helper()
	if err := probe.WriteResult(file, path, probe.PathResult{ReadBps: read, WriteBps: write, Measured: time.Now(), Method: "test"}); err != nil {
		t.Fatal(err)
	}
}

// TestBandwidthPrecedence walks the sources in order: config figures over
// a tune file over the probe cache over a probe, and the defaults when
// nothing may be probed.
func TestBandwidthPrecedence(t *testing.T) {
	zinf.ForgetBandwidths()
	c, dir := bwConfig(t)
	c.Zinf.Bandwidth.ProbeBytes = 1 << 20 // keep the probe short
	results := filepath.Join(t.TempDir(), "bw.json")
	// The entry is for the directory above the swap path: it holds below.
	writeResults(t, results, filepath.Dir(dir), 7e9, 6e9)

	// 1. Config figures win over everything.
	c.Zinf.Bandwidth.ReadBytesPerSec, c.Zinf.Bandwidth.WriteBytesPerSec = 3e9, 2e9
	c.Zinf.Bandwidth.File = results
	rt := openBW(t, c, zinf.Options{})
	onlySource(t, "config + file", rt.Bandwidth(), zinf.BandwidthFromConfig)
	rt.Close()

	// 2. Then the tune file.
	c.Zinf.Bandwidth.ReadBytesPerSec, c.Zinf.Bandwidth.WriteBytesPerSec = 0, 0
	rt = openBW(t, c, zinf.Options{})
	onlySource(t, "file", rt.Bandwidth(), zinf.BandwidthFromFile)
	if p := rt.Bandwidth().Paths[0]; p.ReadBps != 7e9 || p.WriteBps != 6e9 || !strings.Contains(p.Detail, results) {
		t.Fatalf("file figures %+v", p)
	}
	if tt := rt.Placement().Tiers; tt.NVMeReadBps != 7e9 || tt.NVMeBandwidthSource != "tune file" {
		t.Fatalf("plan tiers %+v", tt)
	}
	rt.Close()
	if _, err := os.Stat(filepath.Join(dir, probe.CacheName)); !os.IsNotExist(err) {
		t.Fatalf("a path with figures was probed: %v", err)
	}

	// 3. Without them, a probe at Open, cached in the path.
	c.Zinf.Bandwidth.File = ""
	rt = openBW(t, c, zinf.Options{})
	onlySource(t, "probe", rt.Bandwidth(), zinf.BandwidthFromProbe)
	measured := rt.Bandwidth().Paths[0]
	if !(measured.ReadBps > 0 && measured.WriteBps > 0) {
		t.Fatalf("probe: %+v", measured)
	}
	rt.Close()
	data, err := os.ReadFile(filepath.Join(dir, probe.CacheName))
	if err != nil {
		t.Fatalf("the probe left no cache: %v", err)
	}
	var cache struct {
		Entries map[string]struct {
			ProbeBytes int64 `json:"probe_bytes"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(data, &cache); err != nil || len(cache.Entries) != 1 {
		t.Fatalf("cache %s: %v", data, err)
	}
	for _, e := range cache.Entries {
		if e.ProbeBytes != 1<<20 {
			t.Fatalf("the probe moved %d bytes each way, want zinf.bandwidth.probe_bytes = 1 MiB", e.ProbeBytes)
		}
	}

	// 4. The next open reads the cache (also with probing off), figures
	// unchanged; a fresh process would read the cache file.
	zinf.ForgetBandwidths()
	c.Zinf.Bandwidth.Probe = false
	rt = openBW(t, c, zinf.Options{})
	onlySource(t, "cache file", rt.Bandwidth(), zinf.BandwidthFromCache)
	if p := rt.Bandwidth().Paths[0]; p.ReadBps != measured.ReadBps || p.WriteBps != measured.WriteBps {
		t.Fatalf("cached %+v, measured %+v", p, measured)
	}
	rt.Close()
	// Within one process a fresh directory of the same filesystem reuses
	// the measurement.
	c2, _ := bwConfig(t)
	rt = openBW(t, c2, zinf.Options{})
	onlySource(t, "same filesystem, same process", rt.Bandwidth(), zinf.BandwidthFromCache)
	rt.Close()

	// 5. Nothing cached and probing off: the defaults, said so.
	zinf.ForgetBandwidths()
	c3, dir3 := bwConfig(t)
	rt = openBW(t, c3, zinf.Options{NoBandwidthProbe: true})
	onlySource(t, "no probe", rt.Bandwidth(), zinf.BandwidthDefault)
	if tt := rt.Placement().Tiers; tt.NVMeReadBps != zinf.DefaultNVMeReadBps || tt.NVMeWriteBps != zinf.DefaultNVMeWriteBps {
		t.Fatalf("default tiers %+v", tt)
	}
	if _, err := os.Stat(filepath.Join(dir3, probe.CacheName)); !os.IsNotExist(err) {
		t.Fatalf("Options.NoBandwidthProbe probed: %v", err)
	}
}

// TestBandwidthFileErrors: a zinf.bandwidth.file that cannot be used
// stops Open with an error naming the key; a path the file does not list
// falls through to the next source.
func TestBandwidthFileErrors(t *testing.T) {
	zinf.ForgetBandwidths()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"format": "zinf-bandwidth", "version": 1, "paths": {"/x": {"read_bytes_per_sec": -1, "write_bytes_per_sec": 1}}}`), 0o644)
	notOurs := filepath.Join(dir, "notes.json")
	os.WriteFile(notOurs, []byte(`{"hello": "world"}`), 0o644)
	for name, file := range map[string]string{"missing": filepath.Join(dir, "nope.json"), "implausible": bad, "foreign": notOurs, "directory": dir} {
		c, _ := bwConfig(t)
		c.Zinf.Bandwidth.File = file
		_, err := zinf.Open(c, bwModel, zinf.Options{NoBandwidthProbe: true})
		if err == nil || !strings.Contains(err.Error(), "zinf.bandwidth.file") || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A file for other paths only.
	other := filepath.Join(dir, "other.json")
	writeResults(t, other, "/somewhere/else", 1e9, 1e9)
	c, _ := bwConfig(t)
	c.Zinf.Bandwidth.File = other
	rt := openBW(t, c, zinf.Options{NoBandwidthProbe: true})
	onlySource(t, "file without the path", rt.Bandwidth(), zinf.BandwidthDefault)
}

// TestPlanModelBandwidth: PlanModel resolves the bandwidth as Open does
// and prints each figure with its source.
func TestPlanModelBandwidth(t *testing.T) {
	zinf.ForgetBandwidths()
	c, _ := bwConfig(t)
	c.Zinf.Bandwidth.ReadBytesPerSec, c.Zinf.Bandwidth.WriteBytesPerSec = 2500e6, 1250e6
	p, err := zinf.PlanModel(context.Background(), c, bwModel, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	onlySource(t, "plan", p.Bandwidth, zinf.BandwidthFromConfig)
	var sb strings.Builder
	if err := p.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(config)", "read 2.3 GiB/s, write 1.2 GiB/s (config", "minimum pool", "swap files (copy-on-write)"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("plan text lacks %q:\n%s", want, sb.String())
		}
	}
}
