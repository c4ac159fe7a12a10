package policy_test

import (
	"errors"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/policy"
)

// TestPinnedMinimumUsesThePoolsBlockRule: the pinned minimum Plan refuses
// below is the sum of the pool's own blocks (buffers.SpanBytes) at the
// pool's granule, for odd sizes and for granules other than the default,
// so the planner and the pool cannot disagree about what a buffer takes.
func TestPinnedMinimumUsesThePoolsBlockRule(t *testing.T) {
	for _, granule := range []int64{0, 4096, 64 << 10, 1 << 20} {
		for _, n := range []int64{1, 4095, 4097, 12289, 100_003, 3 << 20} {
			inv := []policy.Tensor{
				{Name: "w", Bytes: n, Kind: policy.Param},
				{Name: "w.grad", Bytes: n, Kind: policy.Grad, Order: 1},
				{Name: "w.master", Bytes: n, Kind: policy.OptimState, Order: 2},
			}
			h := policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme"}
			_, err := policy.Plan(policy.Tiers{GPUBytes: 1 << 40, CPUBytes: 1, PoolGranuleBytes: granule}, inv, h)
			var ce *policy.CapacityError
			if !errors.As(err, &ce) {
				t.Fatalf("granule %d, %d bytes: want a capacity error, got %v", granule, n, err)
			}
			g := int(granule)
			if g == 0 {
				g = buffers.DefaultMinBufferBytes
			}
			// One parameter buffer, one optimizer buffer per tensor of the
			// parameter's optimizer group (gradient and master), two
			// gradient write-behind buffers.
			want := 5 * buffers.SpanBytes(n, g)
			if ce.NeedBytes != want {
				t.Errorf("granule %d, %d-byte tensors: minimum %d, want 5 x buffers.SpanBytes = %d", granule, n, ce.NeedBytes, want)
			}
			if _, err := policy.Plan(policy.Tiers{GPUBytes: 1 << 40, CPUBytes: want, PoolGranuleBytes: granule}, inv, h); err != nil {
				t.Errorf("granule %d, %d bytes: the minimum %d itself is refused: %v", granule, n, want, err)
			}
		}
	}
	if _, err := policy.Plan(policy.Tiers{PoolGranuleBytes: 12288}, nil, policy.Hints{}); !errors.Is(err, policy.ErrInvalid) {
		t.Errorf("a granule that is not a power of two: %v", err)
	}
}

// TestPredictionFollowsBandwidth: the predicted step time is computed from
// the NVMe bandwidth the tiers carry: halving it makes the NVMe phases
// slower, doubling it faster.
func TestPredictionFollowsBandwidth(t *testing.T) {
	m := policy.ModelSpec{Layers: 6, Width: 512, World: 1}
	inv := m.Inventory(0, 1)
	h := policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme", PrefetchDepth: 1, ComputeSecondsPerLayer: 1e-3}
	plan := func(bps float64) *policy.Placement {
		p, err := policy.Plan(policy.Tiers{GPUBytes: 1 << 40, CPUBytes: 1 << 40, NVMeReadBps: bps, NVMeWriteBps: bps}, inv, h)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	slow, mid, fast := plan(0.5e9), plan(1e9), plan(2e9)
	if !(slow.Predicted.OptimizerIO > mid.Predicted.OptimizerIO && mid.Predicted.OptimizerIO > fast.Predicted.OptimizerIO) {
		t.Errorf("optimizer I/O at 0.5, 1, 2 GB/s: %v, %v, %v; want it to fall as bandwidth rises",
			slow.Predicted.OptimizerIO, mid.Predicted.OptimizerIO, fast.Predicted.OptimizerIO)
	}
	if !(slow.Predicted.Total > fast.Predicted.Total) {
		t.Errorf("step at 0.5 GB/s %v, at 2 GB/s %v", slow.Predicted.Total, fast.Predicted.Total)
	}
}
