package probe_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/probe"
)

// TestResultsFile: entries are added per path and kept, looked up for the
// path or the nearest directory above it, and read back as written.
func TestResultsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bw.json")
	when := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := probe.WriteResult(file, "/nvme0", probe.PathResult{ReadBps: 3e9, WriteBps: 2e9, Measured: when, Method: "m"}); err != nil {
		t.Fatal(err)
	}
	if err := probe.WriteResult(file, "/nvme1/swap", probe.PathResult{ReadBps: 1e9, WriteBps: 1e9, Measured: when}); err != nil {
		t.Fatal(err)
	}
	res, err := probe.ReadResults(file)
	if err != nil || len(res) != 2 {
		t.Fatalf("%v %v", res, err)
	}
	for path, want := range map[string]string{"/nvme0": "/nvme0", "/nvme0/run/a": "/nvme0", "/nvme1/swap/x": "/nvme1/swap", "/nvme1": "", "/other": ""} {
		key, r, ok := probe.LookupResult(res, path)
		if key != want || ok != (want != "") {
			t.Errorf("lookup %s: %q %v, want %q", path, key, ok, want)
		}
		if want == "/nvme0" && (r.ReadBps != 3e9 || r.WriteBps != 2e9 || !r.Measured.Equal(when) || r.Method != "m") {
			t.Errorf("lookup %s: %+v", path, r)
		}
	}
	if err := probe.WriteResult(file, "/nvme0", probe.PathResult{ReadBps: 0, WriteBps: 1}); err == nil {
		t.Error("an implausible figure was written")
	}
	if left, _ := filepath.Glob(file + ".*"); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestResultsFileRefused: content that is not a results file is an error
// naming the file, and WriteResult leaves it and symlinks alone.
func TestResultsFileRefused(t *testing.T) {
	dir := t.TempDir()
	cases := map[string][]byte{
		"foreign":   []byte(`{"a": 1}`),
		"version":   []byte(`{"format": "zinf-bandwidth", "version": 9, "paths": {}}`),
		"relative":  []byte(`{"format": "zinf-bandwidth", "version": 1, "paths": {"nvme": {"read_bytes_per_sec": 1, "write_bytes_per_sec": 1, "measured": "2025-01-01T00:00:00Z"}}}`),
		"nan":       []byte(`{"format": "zinf-bandwidth", "version": 1, "paths": {"/n": {"read_bytes_per_sec": 1e300, "write_bytes_per_sec": 1, "measured": "2025-01-01T00:00:00Z"}}}`),
		"oversized": append([]byte(`{"format": "zinf-bandwidth", "version": 1, "paths": {}}`), bytes.Repeat([]byte(" "), probe.MaxResultsBytes)...),
		"binary":    []byte("\x00\xff"),
	}
	for name, content := range cases {
		f := filepath.Join(dir, name+".json")
		os.WriteFile(f, content, 0o644)
		if _, err := probe.ReadResults(f); err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("%s: ReadResults = %v", name, err)
		}
		if err := probe.WriteResult(f, "/nvme0", probe.PathResult{ReadBps: 1e9, WriteBps: 1e9}); err == nil {
			t.Errorf("%s: WriteResult replaced it", name)
		}
		if got, _ := os.ReadFile(f); !bytes.Equal(got, content) {
			t.Errorf("%s: changed", name)
		}
	}
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	link := filepath.Join(dir, "link.json")
	os.Symlink(target, link)
	if err := probe.WriteResult(link, "/nvme0", probe.PathResult{ReadBps: 1e9, WriteBps: 1e9}); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symlink: %v", err)
	}
	if got, _ := os.ReadFile(target); string(got) != "keep" {
		t.Errorf("the link's target changed: %q", got)
	}
	if _, err := probe.ReadResults(dir); err == nil {
		t.Error("a directory was read as a results file")
	}
}
