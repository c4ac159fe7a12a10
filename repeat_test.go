package zinf_test

import (
	"context"
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

// TestForwardRepeatingPrefetchesNextPass: an inference runtime whose loop
// announces each pass with ForwardRepeating (token generation: every
// decoding step the same forward pass) has a demand miss in its first
// pass only: the last layers of each pass prefetch the next pass's first
// ones. With Forward every pass starts on a demand miss. The values read
// are the same either way; ReleasePrefetched, after the last pass, leaves
// no parameter resident, and Close after a last pass that prefetched
// returns without error.
func TestForwardRepeatingPrefetchesNextPass(t *testing.T) {
	const layers, numel, passes = 4, 16 << 10, 4
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = 8 << 20
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.Zinf.Bandwidth.Probe = false
	descs := make([][]tensor.Desc, layers)
	for l := range descs {
		descs[l] = []tensor.Desc{{Name: fmt.Sprintf("w%d", l), Shape: []int{numel}}}
	}
	rt, err := zinf.Open(c, zinf.LayeredModel(descs...), zinf.Options{Inference: true, NoBandwidthProbe: true, PrefetchDepth: 2,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if d := rt.Placement().PrefetchDepth; d != 2 {
		t.Fatalf("planned prefetch depth %d, want 2", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the watchdog: a wait that hangs fails
	defer cancel()
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
	pass := func(start func()) {
		t.Helper()
		start()
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
	}
	misses := func() int64 { return rt.Metrics().Schedule.DemandMisses }

	for range passes {
		pass(rt.Forward)
	}
	if m := misses(); m != passes {
		t.Fatalf("%d passes announced by Forward: %d demand misses, want %d (each pass's first layer)", passes, m, passes)
	}
	for p := range passes {
		pass(rt.ForwardRepeating)
		if m := misses(); m != passes+1 {
			t.Fatalf("ForwardRepeating pass %d: %d demand misses in all, want %d: only the first repeating pass misses", p, m, passes+1)
		}
	}
	// The next pass's first layers were prefetched: their reads land
	// after the pass returns (asynchronously), so wait for them, within
	// the watchdog's minute.
	for rt.Metrics().Params.ResidentBytes == 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if st := rt.Metrics(); st.Params.ResidentBytes == 0 || st.Schedule.PeakPrefetchedBytes > st.Reservations.PrefetchBytes {
		t.Fatalf("after the last repeating pass: %d bytes resident (want the next pass's first layers), peak prefetched %d of a %d-byte window",
			st.Params.ResidentBytes, st.Schedule.PeakPrefetchedBytes, st.Reservations.PrefetchBytes)
	}
	rt.ReleasePrefetched()
	if r := rt.Metrics().Params.ResidentBytes; r != 0 {
		t.Fatalf("after ReleasePrefetched %d bytes of parameters stay resident", r)
	}
	// A last pass that prefetches layers never used, then Close.
	pass(rt.ForwardRepeating)
	if err := rt.Close(); err != nil {
		t.Fatalf("Close after a repeating pass: %v", err)
	}
}
