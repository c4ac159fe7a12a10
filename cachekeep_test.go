package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestCacheKeepsSpreadInInference: an inference runtime with max_in_cpu
// keeps a fixed set of NVMe parameters in pinned memory, spread over the
// layers (every other layer of equal ones at half the weights), within
// max_in_cpu; after the first pass the cached ones are served from
// memory and each pass reads only the others, the values read unchanged.
// A training runtime on the same config keeps no fixed set.
func TestCacheKeepsSpreadInInference(t *testing.T) {
	const layers, numel, passes = 8, 64 << 10, 4 // 256 KiB a layer
	cfg := func() *config.Config {
		c := config.Default()
		c.SetScratchDir(t.TempDir())
		c.Zinf.Tiers.CPUPinnedBytes = 16 << 20
		c.ZeroOptimization.OffloadParam.MaxInCPU = layers / 2 * numel // elements: half the weights
		c.Zinf.Bandwidth.Probe = false
		return c
	}
	descs := make([][]tensor.Desc, layers)
	for l := range descs {
		descs[l] = []tensor.Desc{{Name: fmt.Sprintf("w%d", l), Shape: []int{numel}}}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the watchdog: a wait that hangs fails
	defer cancel()

	train, err := zinf.Open(cfg(), zinf.LayeredModel(descs...), zinf.Options{NoBandwidthProbe: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for l := range layers {
		if train.CacheKeeps(fmt.Sprintf("w%d", l)) {
			t.Fatalf("a training runtime keeps w%d for good", l)
		}
	}
	if err := train.Close(); err != nil {
		t.Fatal(err)
	}

	rt, err := zinf.Open(cfg(), zinf.LayeredModel(descs...), zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	var kept []int
	for l := range layers {
		if rt.CacheKeeps(fmt.Sprintf("w%d", l)) {
			kept = append(kept, l)
		}
	}
	if !slices.Equal(kept, []int{0, 2, 4, 6}) {
		t.Fatalf("layers kept %v: want every other one of %d equal layers at half the weights", kept, layers)
	}
	want := make([][]float32, layers)
	for l := range want {
		want[l] = make([]float32, numel)
		for i := range want[l] {
			want[l][i] = float32(l*numel + i)
		}
		if err := rt.Init(ctx, fmt.Sprintf("w%d", l), want[l]); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]float32, numel)
	var reads []int64
	for range passes {
		before := rt.Metrics().BytesRead
		rt.Forward()
		for l := range layers {
			if err := rt.BeginLayer(ctx, l); err != nil {
				t.Fatal(err)
			}
			err := rt.ReadParam(ctx, fmt.Sprintf("w%d", l), got)
			rt.EndLayer(l)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want[l]) {
				t.Fatalf("layer %d: read %v..., want %v...", l, got[:3], want[l][:3])
			}
		}
		reads = append(reads, rt.Metrics().BytesRead-before)
	}
	// The cache takes a partition when its layer is released; ristretto
	// applies its sets asynchronously, so the second pass may still miss
	// some. The last reads the layers not kept only.
	if last, streamed := reads[len(reads)-1], int64(layers-len(kept))*numel*4; last != streamed {
		t.Fatalf("the last pass read %d bytes, want the %d of the %d layers not kept (passes: %v)", last, streamed, layers-len(kept), reads)
	}
}

// TestWarmCache: WarmCache reads the kept set once, before any pass, so
// that the first pass already reads only the weights not kept; on a
// training runtime it reads nothing.
func TestWarmCache(t *testing.T) {
	const layers, numel = 8, 64 << 10 // 256 KiB a layer
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = layers / 2 * numel
	cfg.Zinf.Bandwidth.Probe = false
	descs := make([][]tensor.Desc, layers)
	for l := range descs {
		descs[l] = []tensor.Desc{{Name: fmt.Sprintf("w%d", l), Shape: []int{numel}}}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := zinf.Open(cfg, zinf.LayeredModel(descs...), zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	vals := make([]float32, numel)
	kept := 0
	for l := range layers {
		if err := rt.Init(ctx, fmt.Sprintf("w%d", l), vals); err != nil {
			t.Fatal(err)
		}
		if rt.CacheKeeps(fmt.Sprintf("w%d", l)) {
			kept++
		}
	}
	read, err := rt.WarmCache(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(kept) * numel * 4; kept == 0 || read != want {
		t.Fatalf("WarmCache read %d bytes, want the %d kept layers' %d", read, kept, want)
	}
	before := rt.Metrics().BytesRead
	rt.Forward()
	for l := range layers {
		if err := rt.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		rt.EndLayer(l)
	}
	if got, want := rt.Metrics().BytesRead-before, int64(layers-kept)*numel*4; got != want {
		t.Fatalf("the first pass after WarmCache read %d bytes, want the %d of the layers not kept", got, want)
	}

	// A cancelled warm-up returns, says why, and the runtime closes.
	cfg.SetScratchDir(t.TempDir())
	rt2, err := zinf.Open(cfg, zinf.LayeredModel(descs...), zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for l := range layers {
		if err := rt2.Init(ctx, fmt.Sprintf("w%d", l), vals); err != nil {
			t.Fatal(err)
		}
	}
	cancelled, stop := context.WithCancel(ctx)
	stop()
	if _, err := rt2.WarmCache(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("WarmCache on a cancelled context: %v, want context.Canceled", err)
	}
	if err := rt2.Close(); err != nil {
		t.Errorf("Close after a cancelled warm-up: %v", err)
	}
}
