package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestBandwidthKeys: the zinf.bandwidth section parses with its defaults,
// sizes with units, and round-trips through MarshalJSON.
func TestBandwidthKeys(t *testing.T) {
	c, err := config.Parse([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if b := c.Zinf.Bandwidth; b.ReadBytesPerSec != 0 || b.WriteBytesPerSec != 0 || b.File != "" || !b.Probe || b.ProbeBytes != 16*config.MiB {
		t.Fatalf("defaults: %+v", b)
	}
	c, err = config.Parse([]byte(`{"zinf": {"bandwidth": {"read_bytes_per_sec": "3.2GB", "write_bytes_per_sec": 2e9, "file": "bw.json", "probe": false, "probe_bytes": "4MiB"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	b := c.Zinf.Bandwidth
	if b.ReadBytesPerSec != 3_200_000_000 || b.WriteBytesPerSec != 2e9 || b.File != "bw.json" || b.Probe || b.ProbeBytes != 4*config.MiB {
		t.Fatalf("parsed: %+v", b)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if back.Zinf.Bandwidth != b {
		t.Fatalf("round trip: %+v, want %+v", back.Zinf.Bandwidth, b)
	}
}

// TestBandwidthKeysRefused: every bad value is reported by its key.
func TestBandwidthKeysRefused(t *testing.T) {
	for _, c := range []struct {
		json string
		want []string
	}{
		{`{"read_bytes_per_sec": "3GB"}`, []string{"zinf.bandwidth.write_bytes_per_sec", "is missing", "both figures or neither"}},
		{`{"write_bytes_per_sec": "3GB"}`, []string{"zinf.bandwidth.read_bytes_per_sec", "is missing"}},
		{`{"read_bytes_per_sec": "1TB", "write_bytes_per_sec": 1}`, []string{"zinf.bandwidth.read_bytes_per_sec", `"1TB"`, "out of range", "0..100000000000"}},
		{`{"read_bytes_per_sec": -1, "write_bytes_per_sec": 1}`, []string{"zinf.bandwidth.read_bytes_per_sec"}},
		{`{"read_bytes_per_sec": "fast", "write_bytes_per_sec": 1}`, []string{"zinf.bandwidth.read_bytes_per_sec", `"fast"`}},
		{`{"probe_bytes": "512KiB"}`, []string{"zinf.bandwidth.probe_bytes", `"512KiB"`, "1048576..1073741824"}},
		{`{"probe_bytes": "2GiB"}`, []string{"zinf.bandwidth.probe_bytes", "out of range"}},
		{`{"probe": "yes"}`, []string{"zinf.bandwidth.probe", "boolean"}},
		{`{"file": 7}`, []string{"zinf.bandwidth.file", "string"}},
		{`{"file": "  "}`, []string{"zinf.bandwidth.file", "is not a file name"}},
		{`{"probe_byte": 1}`, []string{"zinf.bandwidth.probe_byte", "unknown key", "probe_bytes"}},
	} {
		_, err := config.Parse([]byte(`{"zinf": {"bandwidth": ` + c.json + `}}`))
		var e *config.Error
		if !errors.As(err, &e) {
			t.Errorf("%s: want a config error, got %v", c.json, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q not in %v", c.json, w, err)
			}
		}
	}
}

// TestBandwidthFileRelative: a relative zinf.bandwidth.file is read next
// to the config file it is written in.
func TestBandwidthFileRelative(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ds.json")
	if err := os.WriteFile(path, []byte(`{"zinf": {"bandwidth": {"file": "tune/bw.json"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.BandwidthFile(), filepath.Join(dir, "tune", "bw.json"); got != want {
		t.Fatalf("BandwidthFile() = %q, want %q", got, want)
	}
	c.Zinf.Bandwidth.File = "/abs/bw.json"
	if got := c.BandwidthFile(); got != "/abs/bw.json" {
		t.Fatalf("absolute: %q", got)
	}
	p, _ := config.Parse([]byte(`{"zinf": {"bandwidth": {"file": "bw.json"}}}`))
	if got := p.BandwidthFile(); got != "bw.json" {
		t.Fatalf("parsed from bytes (no file): %q", got)
	}
}
