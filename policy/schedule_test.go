package policy_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/policy"
)

// scheduleSetup is a disk-bound setup: 8 layers of 1024² fp32 with
// parameters, gradients and optimizer states on NVMe, and less compute
// per layer than reading it takes.
func scheduleSetup(t *testing.T) (policy.Tiers, []policy.Tensor) {
	t.Helper()
	spec, err := policy.ParseModelSpec("layers=8,width=1024,dtype=fp32")
	if err != nil {
		t.Fatal(err)
	}
	return policy.Tiers{GPUBytes: 1 << 30, CPUBytes: 1 << 30, NVMeReadBps: 2e9, NVMeWriteBps: 1.5e9, NVMePaths: 1}, spec.Inventory(0, 1)
}

// TestPlanSeesMicroBatches: the prediction counts the micro-batches of a
// step. Micro-batch-major reads the parameters 2k times and each gradient
// back k-1 times (its NVMe bytes grow with k), and each layer's hand-off
// waits for the gradient write before it (one write-behind buffer);
// layer-major reads the parameters twice whatever k (flat bytes), and
// only its compute grows.
// Auto picks the faster, layer-major when the step is disk-bound and
// k > 1, micro-batch-major at k = 1 (the same order); the table shows
// both predictions; a wrong schedule word is refused.
func TestPlanSeesMicroBatches(t *testing.T) {
	tiers, inv := scheduleSetup(t)
	plan := func(k int, sched string) *policy.Placement {
		t.Helper()
		p, err := policy.Plan(tiers, inv, policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme", ComputeSecondsPerLayer: 0.002, MicroBatches: k, Schedule: sched})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	one := plan(1, "")
	// At k = 1 the orders are one; layer-major's plan only holds more
	// gradient memory (its writes need not wait for each other).
	if l, m := one.PredictedLayerMajor, one.PredictedMicroBatchMajor; one.Schedule != policy.ScheduleMicroBatchMajor ||
		l.NVMeReadBytes != m.NVMeReadBytes || l.NVMeWriteBytes != m.NVMeWriteBytes || l.Total > m.Total+time.Microsecond {
		t.Errorf("k=1: schedule %s, layer-major %+v, micro-batch-major %+v", one.Schedule, l, m)
	}
	var param, grad int64
	for _, x := range inv {
		switch x.Kind {
		case policy.Param:
			param += x.Bytes
		case policy.Grad:
			grad += x.Bytes
		}
	}
	for _, k := range []int{2, 4, 8} {
		p := plan(k, "auto")
		lm, mb := p.PredictedLayerMajor, p.PredictedMicroBatchMajor
		if p.Schedule != policy.ScheduleLayerMajor || p.Predicted.Total != lm.Total {
			t.Errorf("k=%d: auto chose %s (layer-major %v, micro-batch-major %v)", k, p.Schedule, lm.Total, mb.Total)
		}
		if lm.NVMeReadBytes != one.Predicted.NVMeReadBytes || lm.NVMeWriteBytes != one.Predicted.NVMeWriteBytes {
			t.Errorf("k=%d: layer-major moves %d/%d bytes, k=1 %d/%d: want flat in k", k, lm.NVMeReadBytes, lm.NVMeWriteBytes,
				one.Predicted.NVMeReadBytes, one.Predicted.NVMeWriteBytes)
		}
		kk := int64(k)
		if want := one.Predicted.NVMeReadBytes + 2*(kk-1)*param + (kk-1)*grad; mb.NVMeReadBytes != want {
			t.Errorf("k=%d: micro-batch-major reads %d bytes, want %d (2k parameter reads, k-1 gradient read-backs)", k, mb.NVMeReadBytes, want)
		}
		if want := one.Predicted.NVMeWriteBytes + (kk-1)*grad; mb.NVMeWriteBytes != want {
			t.Errorf("k=%d: micro-batch-major writes %d bytes, want %d (k gradient writes)", k, mb.NVMeWriteBytes, want)
		}
		if d := lm.Compute - time.Duration(k)*one.Predicted.Compute; lm.Compute != mb.Compute || d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("k=%d: compute layer-major %v, micro-batch-major %v; want both k x %v", k, lm.Compute, mb.Compute, one.Predicted.Compute)
		}
		if mb.Total <= one.Predicted.Total || lm.Total >= mb.Total {
			t.Errorf("k=%d: predicted layer-major %v, micro-batch-major %v, k=1 %v", k, lm.Total, mb.Total, one.Predicted.Total)
		}
		var buf bytes.Buffer
		if err := p.WriteTable(&buf); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"schedule: layer-major (zinf.schedule auto", "  layer-major ", "  micro-batch-major "} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("k=%d: the table lacks %q:\n%s", k, want, buf.String())
			}
		}
		if forced := plan(k, policy.ScheduleMicroBatchMajor); forced.Schedule != policy.ScheduleMicroBatchMajor || forced.Predicted.Total != mb.Total {
			t.Errorf("k=%d: schedule micro-batch-major asked, got %s (%v)", k, forced.Schedule, forced.Predicted.Total)
		}
	}
	_, err := policy.Plan(tiers, inv, policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme", Schedule: "zig-zag"})
	if !errors.Is(err, policy.ErrInvalid) || !strings.Contains(err.Error(), `zinf.schedule "zig-zag"`) {
		t.Errorf("schedule zig-zag: %v", err)
	}
}
