package policy_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/tensor"
)

// hideIOPlan plans a small model with parameters and optimizer on NVMe
// (read 2 GB/s, write 1 GB/s, PCIe unlimited, pinned memory plenty) and
// returns it with the I/O of a layer-major step derived from its tensors'
// homes and the bandwidths: the passes' (every NVMe parameter read twice,
// every NVMe gradient written once) and the optimizer step's (NVMe
// gradients and states read, states and parameters written).
func hideIOPlan(t *testing.T, computePerLayer float64) (p *policy.Placement, passes, optimizer float64) {
	t.Helper()
	const read, write = 2e9, 1e9
	spec, err := policy.ParseModelSpec("layers=4,width=256,dtype=bf16")
	if err != nil {
		t.Fatal(err)
	}
	tiers := policy.Tiers{GPUBytes: 1 << 30, CPUBytes: policy.MaxBytes, NVMeReadBps: read, NVMeWriteBps: write, NVMePaths: 1}
	p, err = policy.Plan(tiers, spec.Inventory(0, 1), policy.Hints{ParamDevice: "nvme", OptimizerDevice: "nvme", ComputeSecondsPerLayer: computePerLayer})
	if err != nil {
		t.Fatal(err)
	}
	var nvme [3]float64 // param, grad, state bytes on NVMe
	for _, x := range spec.Inventory(0, 1) {
		if p.Tier[x.Name] != tensor.TierNVMe {
			continue
		}
		switch x.Kind {
		case policy.Param:
			nvme[0] += float64(x.Bytes)
		case policy.Grad:
			nvme[1] += float64(x.Bytes)
		case policy.OptimState:
			nvme[2] += float64(x.Bytes)
		}
	}
	if nvme[0] == 0 || nvme[1] == 0 || nvme[2] == 0 {
		t.Fatalf("want parameters, gradients and states on NVMe: %v", nvme)
	}
	passes = 2*nvme[0]/read + nvme[1]/write
	optimizer = (nvme[1]+nvme[2])/read + (nvme[0]+nvme[2])/write
	return p, passes, optimizer
}

func closeTo(d time.Duration, s float64) bool {
	return math.Abs(d.Seconds()-s) <= 1e-9+1e-9*s
}

// TestMicroBatchesToHideIO: with the optimizer step overlapping the
// backward pass, k is the step's I/O over one micro-batch's compute,
// rounded up: exactly at the boundary, just past it, hidden at k=1, and
// not known without the compute.
func TestMicroBatchesToHideIO(t *testing.T) {
	_, passes, opt := hideIOPlan(t, 0)
	io := passes + opt
	const layers = 4
	for _, tc := range []struct {
		name     string
		perLayer float64 // forward and backward compute of a layer, seconds
		k        int
		line     string
	}{
		{"the boundary", io / 3 / layers, 3, "k >= 3 ("},
		{"past the boundary", io / 3 / layers * (1 - 1e-6), 4, "k >= 4 ("},
		{"hidden at k=1", io / layers, 1, "already hidden at k=1"},
		{"compute larger than the I/O", 5 * io / layers, 1, "already hidden at k=1"},
		{"compute unknown", 0, 0, "not known without the compute per layer"},
	} {
		p, _, _ := hideIOPlan(t, tc.perLayer)
		if !p.OverlapStep {
			t.Fatalf("%s: the optimizer step does not overlap the backward pass", tc.name)
		}
		c := p.MicroBatchesToHideIO()
		if c.MicroBatches != tc.k || c.Known() != (tc.k > 0) || c.Dominated() || c.AfterBackward != 0 || !closeTo(c.IOPerStep, io) {
			t.Errorf("%s: %+v, want k %d and I/O %.9f s per step", tc.name, c, tc.k, io)
		}
		if tc.k > 0 && !closeTo(c.ComputePerMicroBatch, tc.perLayer*layers) {
			t.Errorf("%s: compute %v per micro-batch, want %.9f s", tc.name, c.ComputePerMicroBatch, tc.perLayer*layers)
		}
		if s := c.String(); !strings.HasPrefix(s, "micro-batches to hide the I/O: ") || !strings.Contains(s, tc.line) {
			t.Errorf("%s: %q, want %q", tc.name, s, tc.line)
		}
		// At another compute (a runtime's measured one) the same I/O.
		if at := p.MicroBatchesToHideIOAt(io / 3 / layers); at.MicroBatches != 3 || at.IOPerStep != c.IOPerStep {
			t.Errorf("%s: at a third of the I/O: %+v", tc.name, at)
		}
	}
	if p, _, _ := hideIOPlan(t, io/3/layers); !strings.Contains(p.MicroBatchesToHideIO().String(),
		fmt.Sprintf("(compute %s per micro-batch, I/O %s per step)", policy.FormatDuration(time.Duration(io/3*1e9)), policy.FormatDuration(time.Duration(io*1e9)))) {
		t.Errorf("line: %q", p.MicroBatchesToHideIO())
	}
}

// TestMicroBatchesToHideIOAfterBackward: an optimizer step that runs after
// the backward pass has no compute under it whatever k is; its states
// (read and written) outweigh the passes' traffic here, so no k hides
// the step's I/O, and the line says so.
func TestMicroBatchesToHideIOAfterBackward(t *testing.T) {
	p, passes, opt := hideIOPlan(t, 0)
	const layers = 4
	perLayer := passes / 2 / layers // the passes need two micro-batches
	p, _, _ = hideIOPlan(t, perLayer)
	serial := p.Adjusted(p.PrefetchDepth, "", false, "a serial step in the test")
	if serial.OverlapStep {
		t.Fatal("still overlapped")
	}
	c := serial.MicroBatchesToHideIO()
	if opt < passes {
		t.Fatalf("the test wants the optimizer's %.6f s to outweigh the passes' %.6f s", opt, passes)
	}
	if !closeTo(c.AfterBackward, opt) || !closeTo(c.IOPerStep, passes+opt) || c.MicroBatches != 2 || !c.Dominated() {
		t.Errorf("%+v, want %.9f s after the backward pass of %.9f s, k 2 for the passes, dominated", c, opt, passes+opt)
	}
	if s := c.String(); !strings.Contains(s, "no k hides it: the optimizer step's "+policy.FormatDuration(c.AfterBackward)) || !strings.Contains(s, "k >= 2 covers the rest") {
		t.Errorf("line %q", s)
	}
	// The placement that overlaps it hides all at k = ceil(I/O / compute).
	if c := p.MicroBatchesToHideIO(); c.Dominated() || c.MicroBatches != int(math.Ceil((passes+opt)/(perLayer*layers)-1e-9)) {
		t.Errorf("overlapped: %+v", c)
	}
}

// TestMicroBatchesToHideIONoNVMe: a placement with nothing on NVMe has
// no I/O to hide.
func TestMicroBatchesToHideIONoNVMe(t *testing.T) {
	spec, _ := policy.ParseModelSpec("layers=2,width=64,dtype=fp32")
	p, err := policy.Plan(policy.Tiers{GPUBytes: 1 << 30, CPUBytes: 1 << 30}, spec.Inventory(0, 1), policy.Hints{ComputeSecondsPerLayer: 1e-3})
	if err != nil {
		t.Fatal(err)
	}
	if c := p.MicroBatchesToHideIO(); c.IOPerStep != 0 || c.MicroBatches != 1 || !strings.Contains(c.String(), "none needed") {
		t.Errorf("%+v %q", c, c)
	}
}

// TestMicroBatchesToHideIOPasses: each pass's compute covers its own
// I/O: the forward pass reads the NVMe parameters once; the backward pass
// reads them again, writes the NVMe gradients and carries the overlapped
// optimizer step. A backward pass twice the forward's compute needs a
// larger k than the total compute against the total I/O says, and k is
// the larger pass's; a serial optimizer step stays after the backward.
func TestMicroBatchesToHideIOPasses(t *testing.T) {
	const read, write = 2e9, 1e9
	p, passes, opt := hideIOPlan(t, 0)
	var params float64
	for _, x := range func() []policy.Tensor {
		spec, _ := policy.ParseModelSpec("layers=4,width=256,dtype=bf16")
		return spec.Inventory(0, 1)
	}() {
		if x.Kind == policy.Param && p.Tier[x.Name] == tensor.TierNVMe {
			params += float64(x.Bytes)
		}
	}
	const layers = 4
	fwdIO := params / read
	bwdIO := passes - fwdIO + opt
	for _, tc := range []struct {
		name     string
		fwd, bwd float64 // per layer and micro-batch, seconds
		k        int
	}{
		{"the backward binds", fwdIO / 2 / layers, bwdIO / 5 / layers, 5},
		{"just past the backward's boundary", fwdIO / 2 / layers, bwdIO / 5 / layers * (1 - 1e-6), 6},
		{"the forward binds", fwdIO / 7 / layers, bwdIO / 3 / layers, 7},
		{"hidden at k=1", fwdIO / layers, bwdIO / layers, 1},
		{"forward unknown", 0, bwdIO / layers, 0},
		{"backward unknown", fwdIO / layers, math.Inf(1), 0},
	} {
		c := p.MicroBatchesToHideIOPasses(tc.fwd, tc.bwd)
		if c.MicroBatches != tc.k || !c.ByPass || c.AfterBackward != 0 {
			t.Errorf("%s: %+v, want k %d", tc.name, c, tc.k)
		}
		if !closeTo(c.ForwardIO, fwdIO) || !closeTo(c.BackwardIO, bwdIO) || !closeTo(c.IOPerStep, passes+opt) {
			t.Errorf("%s: I/O forward %v backward %v step %v, want %.9f, %.9f, %.9f s", tc.name, c.ForwardIO, c.BackwardIO, c.IOPerStep, fwdIO, bwdIO, passes+opt)
		}
		if tc.k > 0 {
			at := p.MicroBatchesToHideIOAt(tc.fwd + tc.bwd)
			if at.MicroBatches > c.MicroBatches {
				t.Errorf("%s: k %d by pass below the total's %d", tc.name, c.MicroBatches, at.MicroBatches)
			}
			if s := c.String(); !strings.Contains(s, "each pass's compute covering its own I/O: forward "+policy.FormatDuration(c.ForwardCompute)) {
				t.Errorf("%s: line %q", tc.name, s)
			}
		}
	}
	// Where the backward pass binds, the total compute against the total
	// I/O asks fewer micro-batches: the forward's idle disk cannot take
	// the backward's traffic.
	if at, c := p.MicroBatchesToHideIOAt((3*fwdIO+bwdIO/5)/layers), p.MicroBatchesToHideIOPasses(3*fwdIO/layers, bwdIO/5/layers); at.MicroBatches >= c.MicroBatches || c.MicroBatches != 5 {
		t.Errorf("total %d, by pass %d: want fewer by the total", at.MicroBatches, c.MicroBatches)
	}
	// A serial optimizer step runs after the backward pass, in no pass.
	serial := p.Adjusted(p.PrefetchDepth, "", false, "a serial step in the test")
	c := serial.MicroBatchesToHideIOPasses(fwdIO/2/layers, (bwdIO-opt)/5/layers)
	if c.MicroBatches != 5 || !closeTo(c.AfterBackward, opt) || !closeTo(c.BackwardIO, bwdIO-opt) || !strings.Contains(c.String(), "after the backward pass") {
		t.Errorf("serial: %+v %q", c, c)
	}
}
