package zinf_test

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/tensor"
)

// TestAbortStepAfterFailedBackward: a backward pass fails half-way (the
// second layer's swap-in hits EIO) after the first layer's gradient was
// accumulated and its update started. AbortStep drops both; the step run
// again from the start, and the steps after it, equal in-memory Adam bit
// for bit, as if the failure had never happened. AbortStep also drops the
// gradients of earlier micro-steps.
func TestAbortStepAfterFailedBackward(t *testing.T) {
	ctx, watch := watchdog(t, 2*time.Minute)
	c, _ := testConfig(t)
	inj := faults.New(1)
	m := zinf.LayeredModel(
		[]tensor.Desc{{Name: "l0.w", Shape: []int{64, 33}}},
		[]tensor.Desc{{Name: "l1.w", Shape: []int{3001}}, {Name: "l1.b", Shape: []int{7}}},
	)
	rt, err := zinf.Open(c, m, zinf.Options{Faults: inj})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	init := initValues(m)
	initAll(ctx, t, []*zinf.Runtime{rt}, init)
	ref := newAdamRef(c, init)

	// A micro-step that is later given up with the rest of the step.
	for _, d := range m.Tensors {
		if err := rt.AccumulateGrad(ctx, d.Name, gradOf(init[d.Name])); err != nil {
			t.Fatal(err)
		}
	}
	// The last micro-step: layer 1's gradient goes in and its update
	// starts; layer 0's swap-in fails.
	rt.Backward()
	if err := rt.BeginLayer(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, name := range rt.LayerTensors(1) {
		if err := rt.AccumulateGrad(ctx, name, gradOf(init[name])); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.StepLayer(ctx, 1); err != nil {
		t.Fatal(err)
	}
	rt.EndLayer(1)
	inj.Add(faults.Rule{Kind: faults.Reads, PathContains: filepath.Join("/", "zinf-param-"), Err: syscall.EIO})
	rt.Params.Release(rt.LayerTensors(0)...) // a prefetched copy would hide the fault
	err = rt.BeginLayer(ctx, 0)
	if err == nil {
		err = rt.ReadParam(ctx, "l0.w", make([]float32, 64*33))
	}
	if err == nil || inj.Hits() == 0 {
		t.Fatalf("layer 0 read with every parameter read failing: %v (%d faults fired)", err, inj.Hits())
	}
	if !errors.Is(err, syscall.EIO) && !errors.Is(err, aio.ErrIO) {
		t.Fatalf("not EIO: %v", err)
	}
	rt.EndLayer(0)
	inj.Clear()
	rt.AbortStep()
	if s := rt.Metrics().Steps; s != 0 {
		t.Fatalf("%d steps after AbortStep, want 0", s)
	}
	master, expAvg, _, err := rt.ReadOptimizerState(ctx, "l1.w")
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range init["l1.w"] {
		if master[i] != w || expAvg[i] != 0 {
			t.Fatalf("l1.w[%d]: master %v exp_avg %v after AbortStep, want %v and 0", i, master[i], expAvg[i], w)
		}
	}
	// The step again from the start, then two more: in-memory Adam's bits.
	trainLoop(ctx, t, []*zinf.Runtime{rt}, ref, 3)
}
