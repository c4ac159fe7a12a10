package policy_test

import (
	"math"
	"testing"
	"time"

	"github.com/zinfio/zinf/policy"
)

// TestCostsInPrediction: the CPU costs on the I/O path a runtime measures
// (Hints.Costs, Placement.WithCosts) lengthen the predicted step where
// they lie: checksums on every NVMe byte, the gradient hand-offs k times
// per layer in layer-major and once per pass in micro-batch-major, the
// optimizer's arithmetic in the optimizer step. No costs change nothing;
// the homes, buffers, depth and schedule never change.
func TestCostsInPrediction(t *testing.T) {
	tiers, inv := scheduleSetup(t)
	const k = 4
	p, err := policy.Plan(tiers, inv, policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme", ComputeSecondsPerLayer: 0.002, MicroBatches: k})
	if err != nil {
		t.Fatal(err)
	}
	if same := p.WithCosts(policy.Costs{}); same.PredictedLayerMajor.Total != p.PredictedLayerMajor.Total ||
		same.PredictedMicroBatchMajor.Total != p.PredictedMicroBatchMajor.Total || same.Predicted.Total != p.Predicted.Total {
		t.Errorf("no costs changed the prediction: %v/%v -> %v/%v", p.PredictedLayerMajor.Total, p.PredictedMicroBatchMajor.Total,
			same.PredictedLayerMajor.Total, same.PredictedMicroBatchMajor.Total)
	}

	// The optimizer's arithmetic: all of it in OptimizerIO.
	const arith = 0.050
	q := p.WithCosts(policy.Costs{OptimizerComputeSeconds: arith})
	for _, c := range []struct {
		name      string
		was, with policy.StepPrediction
	}{{"layer-major", p.PredictedLayerMajor, q.PredictedLayerMajor}, {"micro-batch-major", p.PredictedMicroBatchMajor, q.PredictedMicroBatchMajor}} {
		if d := c.with.OptimizerIO - c.was.OptimizerIO; d < 50*time.Millisecond-time.Microsecond || d > 50*time.Millisecond+time.Microsecond {
			t.Errorf("%s: optimizer arithmetic of 50 ms added %v to the optimizer step", c.name, d)
		}
		if c.with.Total < c.was.Total || c.with.ExposedOptimizer > c.with.OptimizerIO {
			t.Errorf("%s: with the arithmetic the step is %v (was %v), exposed optimizer %v of %v", c.name, c.with.Total, c.was.Total, c.with.ExposedOptimizer, c.with.OptimizerIO)
		}
	}

	// Hand-offs: layer-major hands each layer's gradient k times in one
	// backward pass; micro-batch-major once in each of its k passes: the
	// same k x 8 hand-offs, in the gradient work.
	var grad int64
	for _, x := range inv {
		if x.Kind == policy.Grad {
			grad += x.Bytes
		}
	}
	const handRate = 1e9
	h := p.WithCosts(policy.Costs{HandOffBytesPerSec: handRate})
	want := time.Duration(float64(k*grad) / handRate * float64(time.Second))
	for _, c := range []struct {
		name      string
		was, with policy.StepPrediction
	}{{"layer-major", p.PredictedLayerMajor, h.PredictedLayerMajor}, {"micro-batch-major", p.PredictedMicroBatchMajor, h.PredictedMicroBatchMajor}} {
		if d := c.with.GradIO - c.was.GradIO; math.Abs(float64(d-want)) > float64(time.Millisecond) {
			t.Errorf("%s: hand-offs of %d bytes at %g B/s added %v of gradient work, want %v", c.name, k*grad, handRate, d, want)
		}
		// On the loop's path, they lengthen the step, by no more than
		// they take (the disk works on meanwhile).
		if d := c.with.Total - c.was.Total; d <= 0 || d > want+time.Millisecond {
			t.Errorf("%s: hand-offs of %v lengthened the step by %v", c.name, want, d)
		}
	}

	// Checksums: every NVMe byte pays for its CRC; the slower the rate,
	// the longer the step, in both orders.
	slow, fast := p.WithCosts(policy.Costs{ChecksumBytesPerSec: 1e9}), p.WithCosts(policy.Costs{ChecksumBytesPerSec: 10e9})
	for _, c := range []struct {
		name                string
		was, fast, slow     policy.StepPrediction
		minExtraSlowSeconds float64
	}{
		{"layer-major", p.PredictedLayerMajor, fast.PredictedLayerMajor, slow.PredictedLayerMajor, 0},
		{"micro-batch-major", p.PredictedMicroBatchMajor, fast.PredictedMicroBatchMajor, slow.PredictedMicroBatchMajor, 0},
	} {
		if !(c.was.Total < c.fast.Total && c.fast.Total < c.slow.Total) {
			t.Errorf("%s: checksums at 10 and 1 GB/s predict %v and %v, without %v", c.name, c.fast.Total, c.slow.Total, c.was.Total)
		}
		// The optimizer step checksums what it reads and writes.
		bytes := float64(c.was.NVMeReadBytes + c.was.NVMeWriteBytes)
		if d := c.slow.OptimizerIO - c.was.OptimizerIO; d <= 0 || float64(d) > bytes/1e9*float64(time.Second) {
			t.Errorf("%s: checksums at 1 GB/s added %v to the optimizer step (all %0.f NVMe bytes of the step: %v)", c.name, d, bytes, time.Duration(bytes/1e9*float64(time.Second)))
		}
	}
	for _, x := range []*policy.Placement{q, h, slow, fast} {
		if x.Schedule != p.Schedule || x.PrefetchDepth != p.PrefetchDepth || x.PinnedBytes != p.PinnedBytes || x.OverlapStep != p.OverlapStep {
			t.Errorf("WithCosts changed the plan: schedule %s depth %d pinned %d overlap %v, was %s %d %d %v",
				x.Schedule, x.PrefetchDepth, x.PinnedBytes, x.OverlapStep, p.Schedule, p.PrefetchDepth, p.PinnedBytes, p.OverlapStep)
		}
	}
}

// TestOverlappedOptimizerShareTheDisk: with the optimizer step overlapping
// the backward pass (Placement.OverlapStep), the prediction waits only
// for the part of it the pass could not hide, and never less than the
// disk needs for the whole step's traffic: reads and writes share one
// disk, one after another.
func TestOverlappedOptimizerSharesTheDisk(t *testing.T) {
	tiers, inv := scheduleSetup(t)
	for _, compute := range []float64{0.0005, 0.002, 0.05} {
		p, err := policy.Plan(tiers, inv, policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme", ComputeSecondsPerLayer: compute})
		if err != nil {
			t.Fatal(err)
		}
		pr := p.Predicted
		if !p.OverlapStep || !pr.Overlapped {
			t.Fatalf("compute %g: the optimizer step does not overlap (plan %v, prediction %v)", compute, p.OverlapStep, pr.Overlapped)
		}
		if pr.ExposedOptimizer > pr.OptimizerIO {
			t.Errorf("compute %g: exposed optimizer %v of %v", compute, pr.ExposedOptimizer, pr.OptimizerIO)
		}
		disk := time.Duration((float64(pr.NVMeReadBytes)/tiers.NVMeReadBps + float64(pr.NVMeWriteBytes)/tiers.NVMeWriteBps) * float64(time.Second))
		if pr.Total < disk-time.Millisecond {
			t.Errorf("compute %g: step %v is shorter than the disk's time for its traffic, %v", compute, pr.Total, disk)
		}
		if compute == 0.05 && pr.ExposedOptimizer > pr.OptimizerIO/4 {
			t.Errorf("compute %g: a compute-bound backward pass hides little of the optimizer step: %v of %v exposed", compute, pr.ExposedOptimizer, pr.OptimizerIO)
		}
		if compute == 0.0005 && pr.ExposedOptimizer < pr.OptimizerIO/2 {
			t.Errorf("compute %g: a disk-bound backward pass hides most of the optimizer step: %v of %v exposed", compute, pr.ExposedOptimizer, pr.OptimizerIO)
		}
	}
}
