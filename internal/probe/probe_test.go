package probe_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/probe"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func engine(t *testing.T) aio.Engine {
	t.Helper()
	e, err := aio.New(aio.Options{Backend: aio.BackendAuto, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestMeasure(t *testing.T) {
	dir := t.TempDir()
	e := engine(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rd, wr, err := probe.Measure(ctx, dir, e, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{rd, wr} {
		if !(v > 0) || math.IsInf(v, 0) {
			t.Fatalf("read %g, write %g bytes/s: want positive finite figures", rd, wr)
		}
	}
	if st := e.Stats(); st.WriteBytes != 4<<20 || st.ReadBytes != 4<<20 {
		t.Fatalf("the probe moved %d written, %d read; want 4 MiB each way", st.WriteBytes, st.ReadBytes)
	}
	if left := names(t, dir); len(left) != 0 {
		t.Fatalf("the probe left %v", left)
	}
}

func TestMeasureRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	e := engine(t)
	for _, n := range []int64{1, -5, 8 << 30} {
		if _, _, err := probe.Measure(t.Context(), dir, e, n); err == nil || !strings.Contains(err.Error(), "probe size") {
			t.Errorf("size %d: %v", n, err)
		}
	}
	if _, _, err := probe.Measure(t.Context(), dir, nil, 0); err == nil {
		t.Error("nil engine accepted")
	}
	if _, _, err := probe.Measure(t.Context(), filepath.Join(dir, "missing"), e, 1<<20); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing path: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := probe.Measure(ctx, dir, e, 8<<20); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if left := names(t, dir); len(left) != 0 {
		t.Fatalf("failed probes left %v", left)
	}
}

func TestBandwidthCache(t *testing.T) {
	dir := t.TempDir()
	e := engine(t)
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	opts := probe.Options{Bytes: 2 << 20, Logger: quiet, Now: func() time.Time { return now }}
	first, err := probe.Bandwidth(t.Context(), dir, e, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first.Cached || first.ReadBps <= 0 || first.WriteBps <= 0 || first.ProbeBytes != 2<<20 || first.Key == "" {
		t.Fatalf("first call: %+v", first)
	}
	if got := names(t, dir); len(got) != 1 || got[0] != probe.CacheName {
		t.Fatalf("want only the cache file, got %v", got)
	}
	moved := e.Stats().WriteBytes

	now = now.Add(time.Hour)
	second, err := probe.Bandwidth(t.Context(), dir, e, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !second.Cached || second.ReadBps != first.ReadBps || second.WriteBps != first.WriteBps || !second.Measured.Equal(first.Measured) {
		t.Fatalf("second call should reuse %+v, got %+v", first, second)
	}
	if e.Stats().WriteBytes != moved {
		t.Fatal("a cached result still probed")
	}

	now = now.Add(probe.DefaultMaxAge)
	third, err := probe.Bandwidth(t.Context(), dir, e, opts)
	if err != nil {
		t.Fatal(err)
	}
	if third.Cached || !third.Measured.Equal(now) || e.Stats().WriteBytes == moved {
		t.Fatalf("an old measurement should be renewed: %+v", third)
	}
	if fourth, _ := probe.Bandwidth(t.Context(), dir, e, opts); !fourth.Cached || !fourth.Measured.Equal(now) {
		t.Fatalf("the renewed measurement should be cached: %+v", fourth)
	}
}

// TestBandwidthBadCache: a cache file that is malformed, oversized, of
// implausible figures or a symlink is ignored with a warning, the path is
// measured, and the file is left exactly as it was.
func TestBandwidthBadCache(t *testing.T) {
	cases := map[string][]byte{
		"malformed":   []byte(`{"version":1,"entries":{"x":`),
		"oversized":   append([]byte(`{"version":1,"entries":{}}`), bytes.Repeat([]byte(" "), 70<<10)...),
		"implausible": []byte(`{"version":1,"entries":{"k":{"read_bps":1e20,"write_bps":1,"probe_bytes":1,"measured":"2025-01-01T00:00:00Z"}}}`),
		"negative":    []byte(`{"version":1,"entries":{"k":{"read_bps":-1,"write_bps":1,"probe_bytes":1,"measured":"2025-01-01T00:00:00Z"}}}`),
		"version":     []byte(`{"version":99,"entries":{}}`),
		"not-json":    []byte("hello\x00\xff"),
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cache := filepath.Join(dir, probe.CacheName)
			if err := os.WriteFile(cache, content, 0o644); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			r, err := probe.Bandwidth(t.Context(), dir, engine(t), probe.Options{Bytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil || r.Cached || r.ReadBps <= 0 {
				t.Fatalf("want a fresh measurement: %+v, %v", r, err)
			}
			if !strings.Contains(logs.String(), "ignoring the bandwidth cache") || !strings.Contains(logs.String(), cache) {
				t.Fatalf("want a warning naming %s:\n%s", cache, logs.String())
			}
			if got, _ := os.ReadFile(cache); !bytes.Equal(got, content) {
				t.Fatal("the cache file zinf could not read was changed")
			}
		})
	}
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(t.TempDir(), "user-file")
		if err := os.WriteFile(target, []byte("keep me"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, probe.CacheName)); err != nil {
			t.Fatal(err)
		}
		if _, err := probe.Bandwidth(t.Context(), dir, engine(t), probe.Options{Bytes: 1 << 20, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(target); string(got) != "keep me" {
			t.Fatalf("the symlink's target was changed: %q", got)
		}
		if fi, err := os.Lstat(filepath.Join(dir, probe.CacheName)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("the symlink was replaced: %v", err)
		}
	})
}

// TestMeasureKilledLeavesNothing: a process killed (SIGKILL) during a
// probe leaves no file in the directory; the probe file has no name on
// Linux (O_TMPFILE), so there is nothing to clean up after a crash.
func TestMeasureKilledLeavesNothing(t *testing.T) {
	if dir := os.Getenv("ZINF_PROBE_CHILD_DIR"); dir != "" {
		e, err := aio.New(aio.Options{Backend: aio.BackendAuto, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("probing\n")
		probe.Measure(context.Background(), dir, e, probe.MaxBytes)
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("unnamed probe files are Linux's O_TMPFILE")
	}
	for _, delay := range []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond} {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestMeasureKilledLeavesNothing$", "-test.count=1")
		cmd.Env = append(os.Environ(), "ZINF_PROBE_CHILD_DIR="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 8)
		if _, err := io.ReadFull(out, line); err != nil || string(line) != "probing\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the child did not start its probe: %q, %v", line, err)
		}
		time.Sleep(delay)
		cmd.Process.Kill()
		cmd.Wait()
		if left := names(t, dir); len(left) != 0 {
			t.Fatalf("a probe killed %v after it began left %v", delay, left)
		}
	}
}

// TestBandwidthNoStore: with NoStore the probe measures and leaves the
// path as it was; Store then caches the result, which the next Bandwidth
// reuses. A run refused after its probe (zinf.Open) thus creates nothing.
func TestBandwidthNoStore(t *testing.T) {
	dir := t.TempDir()
	e := engine(t)
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	opts := probe.Options{Bytes: 2 << 20, Logger: quiet, Now: func() time.Time { return now }, NoStore: true}
	r, err := probe.Bandwidth(t.Context(), dir, e, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(t, dir); len(got) != 0 {
		t.Fatalf("a probe with NoStore left %v", got)
	}
	probe.Store(dir, r, probe.Options{Logger: quiet})
	if got := names(t, dir); len(got) != 1 || got[0] != probe.CacheName {
		t.Fatalf("after Store: %v, want only the cache file", got)
	}
	opts.NoStore = false
	again, err := probe.Bandwidth(t.Context(), dir, e, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cached || again.ReadBps != r.ReadBps || again.WriteBps != r.WriteBps {
		t.Fatalf("after Store: %+v, want the stored %+v from the cache", again, r)
	}
}
