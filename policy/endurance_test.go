package policy

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/tensor"
)

// TestPredictedNVMeBytes: a step's predicted NVMe bytes are, summed here
// from the inventory and the placement, the offloaded parameters read for
// both passes, gradients written and read back, optimizer states read and
// written, and the updated parameters written back.
func TestPredictedNVMeBytes(t *testing.T) {
	spec, err := ParseModelSpec("layers=6,width=512,dtype=bf16,batch=4,world=2")
	if err != nil {
		t.Fatal(err)
	}
	inv := spec.Inventory(1, 2)
	tiers := Tiers{GPUBytes: 8 << 20, CPUBytes: 1 << 40, NVMeReadBps: 2e9, NVMeWriteBps: 1e9, NVMePaths: 1}
	for _, h := range []Hints{
		{ParamDevice: "nvme", OptimizerDevice: "nvme", ComputeSecondsPerLayer: 0.01},
		{ParamDevice: "cpu", OptimizerDevice: "nvme"},
		{ParamDevice: "nvme", OptimizerDevice: "cpu"},
	} {
		p, err := Plan(tiers, inv, h)
		if err != nil {
			t.Fatal(err)
		}
		var read, written int64
		for _, x := range inv {
			if p.Tier[x.Name] != tensor.TierNVMe {
				continue
			}
			switch x.Kind {
			case Param:
				read += 2 * x.Bytes
				written += x.Bytes
			case Grad, OptimState:
				read += x.Bytes
				written += x.Bytes
			}
		}
		if read == 0 {
			t.Fatalf("%+v: nothing on NVMe", h)
		}
		if p.Predicted.NVMeReadBytes != read || p.Predicted.NVMeWriteBytes != written {
			t.Errorf("%+v: predicted %d read, %d written; the placement gives %d and %d", h, p.Predicted.NVMeReadBytes, p.Predicted.NVMeWriteBytes, read, written)
		}
	}
}

func TestEndurance(t *testing.T) {
	// 1 GB per 10 s step: 8.64 TB a day; a 600 TB rating lasts 69.4 days.
	e := EnduranceOf(1e9, 10*time.Second, 600e12)
	if e.WrittenPerDay != 8.64e12 || math.Abs(e.RatingDays-600/8.64) > 1e-9 || math.Abs(e.RatingPerDay-8.64/600) > 1e-12 {
		t.Fatalf("%+v", e)
	}
	s := e.String()
	for _, w := range []string{"953.7 MiB (1000000000 bytes) written per step", "10.00 s per step", "8.64 TB per day", "1.44% of a 600 TB endurance rating per day", "69 days"} {
		if !strings.Contains(s, w) {
			t.Errorf("%q lacks %q", s, w)
		}
	}
	if e := EnduranceOf(0, time.Second, 1e12); !math.IsInf(e.RatingDays, 1) || !strings.Contains(e.String(), "never reached") {
		t.Errorf("no writes: %+v %s", e, e)
	}
	if e := EnduranceOf(1e9, 0, 1e12); e.WrittenPerDay != 0 || !strings.Contains(e.String(), "step time unknown") {
		t.Errorf("unknown step time: %+v %s", e, e)
	}
	if e := EnduranceOf(1e9, time.Second, 0); e.RatingPerDay != 0 || strings.Contains(e.String(), "rating") {
		t.Errorf("no rating: %+v %s", e, e)
	}
}
