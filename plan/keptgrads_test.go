package plan_test

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
)

// TestPredictionCountsKeptGrads: the step a plan predicts counts the
// gradients its reservations keep in pinned memory (zinf.pinned_grads
// auto, Reservations.GradKept) as taking no NVMe round trip: with every
// gradient kept, a step's predicted NVMe bytes are one write and one read
// of the gradients fewer than the same placement with none kept, and its
// step no longer. zinf.pinned_grads off keeps none, and its prediction is
// the placement's own, every gradient written behind and read back. The
// disk reservation is the same either way (a kept gradient can still fall
// back to the round trip when it is registered).
func TestPredictionCountsKeptGrads(t *testing.T) {
	make1 := func(pinned config.PinnedGradsMode) *plan.Plan {
		t.Helper()
		cfg := nvmeConfig(filepath.Join(t.TempDir(), "nvme"))
		cfg.Zinf.PinnedGrads = pinned
		in, err := plan.Check(cfg, model, plan.Given{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := plan.Make(in, measured(t, in, plan.StaticBandwidth(cfg)), plan.Options{ComputePerLayer: 2 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	auto, off := make1(config.PinnedGradsAuto), make1(config.PinnedGradsOff)
	r := auto.Reservations
	if r.GradElems == 0 || r.GradKeptElems != r.GradElems {
		t.Fatalf("pinned_grads auto keeps %d of %d gradient elements; the test wants all", r.GradKeptElems, r.GradElems)
	}
	if got := auto.Placement.Hints.KeptGrads; !reflect.DeepEqual(got, r.GradKept) {
		t.Errorf("the prediction counts %v kept, the reservations keep %v", got, r.GradKept)
	}
	if auto.Placement.MicroBatches != 1 {
		t.Fatalf("micro-batches %d: the test counts one write and one read of each gradient", auto.Placement.MicroBatches)
	}
	grads := 4 * r.GradElems
	none := auto.Placement.WithKeptGrads(nil).Predicted
	kept := auto.Placement.Predicted
	if none.NVMeWriteBytes-kept.NVMeWriteBytes != grads || none.NVMeReadBytes-kept.NVMeReadBytes != grads {
		t.Errorf("kept gradients: nvme read %d -> %d, written %d -> %d bytes a step; want each %d fewer",
			none.NVMeReadBytes, kept.NVMeReadBytes, none.NVMeWriteBytes, kept.NVMeWriteBytes, grads)
	}
	if kept.GradIO != 0 || kept.Total > none.Total {
		t.Errorf("kept gradients predict gradient I/O %v and a step of %v (%v with none kept)", kept.GradIO, kept.Total, none.Total)
	}

	if len(off.Reservations.GradKept) != 0 || len(off.Placement.Hints.KeptGrads) != 0 {
		t.Fatalf("pinned_grads off keeps %v, predicts %v kept", off.Reservations.GradKept, off.Placement.Hints.KeptGrads)
	}
	// Off: the prediction of the same placement with off's write-behinds
	// and nothing kept, as before pinned gradients.
	want := auto.Placement.WithKeptGrads(nil).WithGradWriteBehinds(off.Reservations.GradInFlight).Predicted
	if got := off.Placement.Predicted; !reflect.DeepEqual(got, want) {
		t.Errorf("pinned_grads off predicts %+v\nwant %+v", got, want)
	}
	if off.Placement.Predicted.NVMeWriteBytes != none.NVMeWriteBytes || off.Placement.Predicted.GradIO == 0 {
		t.Errorf("pinned_grads off: %d bytes written a step, gradient I/O %v; want %d and some", off.Placement.Predicted.NVMeWriteBytes, off.Placement.Predicted.GradIO, none.NVMeWriteBytes)
	}
	if auto.DiskBytes() != off.DiskBytes() {
		t.Errorf("disk needs differ with gradients kept: %d bytes, off %d", auto.DiskBytes(), off.DiskBytes())
	}
}
