package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestPinnedStallTimeoutSet: zinf.pinned_stall_timeout, and
// Options.PinnedStallTimeout over it, set the runtime's pinned-pool stall
// timer: a wait for parameter memory that sees no release fails with
// buffers.ErrStalled after 1 s, not after the 2-minute default (the
// context would end it first, after 60 s).
func TestPinnedStallTimeoutSet(t *testing.T) {
	for _, c := range []struct {
		name string
		key  config.Duration
		opt  time.Duration
	}{{"config", config.Duration(time.Second), 0}, {"options", 0, time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			cfg, _ := testConfig(t)
			if c.key != 0 {
				cfg.Zinf.PinnedStallTimeout = c.key
			}
			rt, err := zinf.Open(cfg, oneTensor("w", 5000), zinf.Options{NoBandwidthProbe: true, PinnedStallTimeout: c.opt})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			// The largest buffer the parameters' region holds is more
			// than half of it: a second one waits for the first.
			n := zinf.PoolOf(rt).MaxBufferBytesFor(buffers.PurposeParams)
			held, err := zinf.PoolOf(rt).Acquire(ctx, n, buffers.PurposeParams)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			t0 := time.Now()
			_, err = zinf.PoolOf(rt).Acquire(ctx, n, buffers.PurposeParams)
			if !errors.Is(err, buffers.ErrStalled) {
				t.Fatalf("after %v: %v, want ErrStalled from a 1 s stall timer", time.Since(t0).Round(time.Millisecond), err)
			}
		})
	}
}

// TestBeginLayerStallNamesBegunLayers: a loop that begins layers without
// ending them, at the minimum pool, waits for parameter memory its own
// layers hold; the stall error (after zinf.pinned_stall_timeout, here
// 1 s) names the layers begun and not ended.
func TestBeginLayerStallNamesBegunLayers(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Zinf.PinnedStallTimeout = config.Duration(time.Second)
	var layers [][]tensor.Desc
	for l := range 4 {
		layers = append(layers, []tensor.Desc{{Name: fmt.Sprintf("l%d", l), Shape: []int{64 << 10}}})
	}
	m := zinf.LayeredModel(layers...)
	plan, err := zinf.PlanModel(t.Context(), cfg, m, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(plan.Reservations.MinPoolBytes)
	rt, err := zinf.Open(cfg, m, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for l := range 4 {
		if err := rt.Init(ctx, fmt.Sprintf("l%d", l), make([]float32, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	rt.Forward()
	for l := range 4 {
		err := rt.BeginLayer(ctx, l)
		if err == nil {
			continue
		}
		if !errors.Is(err, buffers.ErrStalled) || l < 1 {
			t.Fatalf("begin layer %d: %v, want ErrStalled", l, err)
		}
		want := "layer 0 is begun and not ended"
		if l > 1 {
			want = "layers 0, 1 are begun and not ended"
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("begin layer %d: %q does not say %q", l, err, want)
		}
		return
	}
	t.Fatal("every layer began without an EndLayer: the pool is larger than its minimum")
}
