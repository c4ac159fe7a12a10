package policy_test

import (
	"testing"
	"time"

	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/tensor"
)

// TestWithKeptGrads: gradients kept in pinned memory (zinf.pinned_grads,
// Hints.KeptGrads) take no NVMe round trip in the prediction. With every
// NVMe gradient kept and no compute to hide behind (the step is the
// disk's time), the predicted step drops by exactly the gradients' bytes
// over the write bandwidth (the write-behind) plus over the read bandwidth
// (the update's read-back), and a step's NVMe bytes by one write and one
// read of them; keeping none predicts what the plan did before.
func TestWithKeptGrads(t *testing.T) {
	spec, err := policy.ParseModelSpec("layers=4,width=512,dtype=fp32")
	if err != nil {
		t.Fatal(err)
	}
	inv := spec.Inventory(0, 1)
	tiers := policy.Tiers{GPUBytes: 1 << 30, CPUBytes: policy.MaxBytes, NVMeReadBps: 2e9, NVMeWriteBps: 1e9, NVMePaths: 1}
	for _, overlap := range []bool{false, true} {
		p, err := policy.Plan(tiers, inv, policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme"})
		if err != nil {
			t.Fatal(err)
		}
		if !p.OverlapStep {
			t.Fatal("the optimizer step does not overlap the backward pass")
		}
		p = p.Adjusted(p.PrefetchDepth, "", overlap, "the test's case")
		var keep []string
		var gradBytes int64
		for _, x := range inv {
			if x.Kind == policy.Grad && p.Tier[x.Name] == tensor.TierNVMe {
				gradBytes += x.Bytes
			}
			if x.Kind == policy.Param {
				keep = append(keep, x.Name)
			}
		}
		if gradBytes == 0 {
			t.Fatalf("overlap %v: no gradient on NVMe: %v", overlap, p.Tier)
		}
		if q := p.WithKeptGrads(nil); q != p {
			t.Errorf("overlap %v: WithKeptGrads(nil) changed a plan that keeps none", overlap)
		}
		q := p.WithKeptGrads(keep)
		if q == p || len(p.Hints.KeptGrads) != 0 {
			t.Fatalf("overlap %v: WithKeptGrads did not copy the placement", overlap)
		}
		before, after := p.Predicted, q.Predicted
		want := time.Duration(float64(gradBytes)/tiers.NVMeWriteBps*1e9 + float64(gradBytes)/tiers.NVMeReadBps*1e9)
		if d := before.Total - after.Total - want; d < -10 || d > 10 {
			t.Errorf("overlap %v: step %v -> %v, a drop of %v; want %v (%d gradient bytes written and read back)",
				overlap, before.Total, after.Total, before.Total-after.Total, want, gradBytes)
		}
		if after.GradIO != 0 || after.ExposedGradIO != 0 {
			t.Errorf("overlap %v: kept gradients still predict gradient I/O %v (exposed %v)", overlap, after.GradIO, after.ExposedGradIO)
		}
		if before.NVMeWriteBytes-after.NVMeWriteBytes != gradBytes || before.NVMeReadBytes-after.NVMeReadBytes != gradBytes {
			t.Errorf("overlap %v: nvme bytes read %d -> %d, written %d -> %d; want each %d fewer",
				overlap, before.NVMeReadBytes, after.NVMeReadBytes, before.NVMeWriteBytes, after.NVMeWriteBytes, gradBytes)
		}
		if back := q.WithKeptGrads(nil).Predicted; back.Total != before.Total || back.NVMeWriteBytes != before.NVMeWriteBytes {
			t.Errorf("overlap %v: keeping none again predicts %v, the plan %v", overlap, back.Total, before.Total)
		}
	}
}
