package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/internal/probe"
)

// TestTuneBandwidthFileToPlan: `zinf tune --bandwidth-file` records the
// best figures for the path; a config pointing zinf.bandwidth.file at it
// makes `zinf plan` use them and say so; a second tune of another path
// keeps the first entry.
func TestTuneBandwidthFileToPlan(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	file := filepath.Join(t.TempDir(), "bw.json")
	code, out, errs := runCLI(t, append([]string{"tune", "--path", dir, "--bandwidth-file", file}, tinyGrid...)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "tune output", out, "recorded in "+file, `"bandwidth": {"file"`)
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("tune left %v", got)
	}
	results, err := probe.ReadResults(file)
	if err != nil {
		t.Fatal(err)
	}
	_, r, ok := probe.LookupResult(results, dir)
	if !ok || !(r.ReadBps > 0 && r.WriteBps > 0) || !strings.Contains(r.Method, "backend posix") {
		t.Fatalf("results %+v", results)
	}
	if code, _, errs := runCLI(t, append([]string{"tune", "--path", other, "--bandwidth-file", file}, tinyGrid...)...); code != 0 {
		t.Fatalf("second tune: exit %d:\n%s", code, errs)
	}
	if results, err = probe.ReadResults(file); err != nil || len(results) != 2 {
		t.Fatalf("after a second path: %v, %v", results, err)
	}

	cfg := filepath.Join(t.TempDir(), "ds.json")
	os.WriteFile(cfg, []byte(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "`+dir+`"},
		"offload_optimizer": {"device": "nvme", "nvme_path": "`+dir+`"}}, "zinf": {"bandwidth": {"file": "`+file+`"}}}`), 0o644)
	code, out, errs = runCLI(t, "plan", "--config", cfg, "--model", "layers=3,width=128")
	if code != 0 {
		t.Fatalf("plan: exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "(tune file)", dir+": read", "tune file: "+file, "minimum pool", "swap files (copy-on-write)", "free space")
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("plan wrote into the swap path: %v", got)
	}
}

// TestTuneBandwidthFileRefused: a --bandwidth-file zinf would have to
// overwrite without having written it, or could not write, is refused
// before the sweep, and is left as it was.
func TestTuneBandwidthFileRefused(t *testing.T) {
	dir := t.TempDir()
	notes := filepath.Join(t.TempDir(), "notes.json")
	os.WriteFile(notes, []byte(`{"mine": true}`), 0o644)
	target := filepath.Join(t.TempDir(), "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	link := filepath.Join(t.TempDir(), "link.json")
	os.Symlink(target, link)
	for name, c := range map[string]struct{ file, want string }{
		"foreign file": {notes, "will not replace it"},
		"symlink":      {link, "symbolic link"},
		"no directory": {filepath.Join(dir, "nope", "bw.json"), "does not exist"},
	} {
		t.Run(name, func(t *testing.T) {
			code, _, errs := runCLI(t, append([]string{"tune", "--path", dir, "--bandwidth-file", c.file}, tinyGrid...)...)
			if code == 0 {
				t.Fatal("accepted")
			}
			wantAll(t, "error", errs, "--bandwidth-file", c.want)
			if strings.Contains(errs, "tuning ") {
				t.Errorf("the sweep started first:\n%s", errs)
			}
		})
	}
	if b, _ := os.ReadFile(notes); string(b) != `{"mine": true}` {
		t.Fatalf("the foreign file changed: %q", b)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("the link's target changed: %q", b)
	}
}

// TestPlanBandwidthAndDisk: `zinf plan` prints each NVMe path's bandwidth
// with its source (the config's figures here) and the disk each path
// needs counting copy-on-write, which is more than the tensors once.
func TestPlanBandwidthAndDisk(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "ds.json")
	os.WriteFile(cfg, []byte(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme/a"},
		"offload_optimizer": {"device": "nvme", "nvme_path": "/nvme/a"}}, "zinf": {"bandwidth": {"read_bytes_per_sec": "3GB", "write_bytes_per_sec": "1GB"}}}`), 0o644)
	code, out, errs := runCLI(t, "plan", "--config", cfg, "--model", "layers=4,width=256")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "plan", out, "read 2.8 GiB/s write 953.7 MiB/s (config)", "/nvme/a: read 2.8 GiB/s, write 953.7 MiB/s (config",
		"nvme disk: free space each path needs", "/nvme/a: ", "swap files (copy-on-write)")
}
