package zinf_test

import (
	"context"
	"errors"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/swapper/param"
)

// TestErrClosed: after Close, every loop method returns an error matching
// the one top-level sentinel zinf.ErrClosed (and still the layer's own).
func TestErrClosed(t *testing.T) {
	c, _ := testConfig(t)
	m := oneTensor("w", 5000)
	rt, err := zinf.Open(c, m, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := make([]float32, 5000)
	if err := rt.Init(ctx, "w", w); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"BeginLayer":         func() error { return rt.BeginLayer(ctx, 0) },
		"ReadParam":          func() error { return rt.ReadParam(ctx, "w", w) },
		"AccumulateGrad":     func() error { return rt.AccumulateGrad(ctx, "w", w) },
		"Step":               func() error { return rt.Step(ctx) },
		"ReadOptimizerState": func() error { _, _, _, err := rt.ReadOptimizerState(ctx, "w"); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, zinf.ErrClosed) {
			t.Errorf("%s after Close: %v, want an error matching zinf.ErrClosed", name, err)
		}
	}
	if err := rt.ReadParam(ctx, "w", w); !errors.Is(err, param.ErrClosed) {
		t.Errorf("ReadParam after Close: %v, want param.ErrClosed too", err)
	}
}
