package zinf_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
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
			n := rt.Pool.MaxBufferBytesFor(buffers.PurposeParams)
			held, err := rt.Pool.Acquire(ctx, n, buffers.PurposeParams)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			t0 := time.Now()
			_, err = rt.Pool.Acquire(ctx, n, buffers.PurposeParams)
			if !errors.Is(err, buffers.ErrStalled) {
				t.Fatalf("after %v: %v, want ErrStalled from a 1 s stall timer", time.Since(t0).Round(time.Millisecond), err)
			}
		})
	}
}
