package zinf_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
)

// autoConfig is testConfig with gradient_accumulation_steps as given in
// the file (steps: "auto" or a number) and a fixed NVMe bandwidth, so
// that no probe runs.
func autoConfig(t *testing.T, steps string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	c, err := config.Parse([]byte(`{"gradient_accumulation_steps": ` + steps + `,
		"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "` + dir + `"}, "offload_optimizer": {"device": "nvme", "nvme_path": "` + dir + `"}},
		"zinf": {"bandwidth": {"read_bytes_per_sec": 2e9, "write_bytes_per_sec": 1e9}}}`))
	if err != nil {
		t.Fatal(err)
	}
	c.Zinf.Tiers.CPUPinnedBytes = 8 << 20
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	return c
}

// TestMicroBatchesToHideIORuntime: under gradient_accumulation_steps
// "auto" a runtime's micro-batches are the planner's k, ceil(I/O per step
// / compute per micro-batch) at Options.ComputePerLayer, or two while the
// compute is not known; Runtime.MicroBatchesToHideIO tells k at any
// compute, the measured one once a step ran. A number in the config stays
// the user's k.
func TestMicroBatchesToHideIORuntime(t *testing.T) {
	const layers = 2
	perPass := 10 * time.Microsecond
	// A micro-batch is a forward and a backward pass over each layer.
	perMicro := 2 * layers * perPass.Seconds()
	kOf := func(c policy.IOCover) int {
		return max(int(math.Ceil((c.IOPerStep-c.AfterBackward).Seconds()/perMicro-1e-6)), 1)
	}
	ctx, rt, m := openTwoLayers(t, autoConfig(t, `"auto"`), zinf.Options{ComputePerLayer: perPass})
	p := rt.Placement().MicroBatchesToHideIO()
	if p.IOPerStep <= 0 {
		rt.Close()
		t.Fatalf("no NVMe I/O to hide: %+v", p)
	}
	if want := kOf(p); want < 2 || p.MicroBatches != want || rt.MicroBatches() != want || rt.Placement().MicroBatches != want {
		t.Errorf("plan: %+v; runtime %d, plan %d micro-batches; want ceil(%v / %v) = %d (2 or more)", p, rt.MicroBatches(), rt.Placement().MicroBatches, p.IOPerStep-p.AfterBackward, perMicro, want)
	}
	if !strings.Contains(strings.Join(rt.Placement().Notes, "\n"), `gradient_accumulation_steps "auto": k = `) {
		t.Errorf("notes %q", rt.Placement().Notes)
	}
	// The runtime's figure adds the CPU costs it measured (the checksums
	// of Init's writes): as much I/O or more, and k from it.
	if c := rt.MicroBatchesToHideIO(perPass); c.MicroBatches != kOf(c) || c.IOPerStep < p.IOPerStep {
		t.Errorf("runtime at %v per pass: %+v, want k %d and I/O of %v or more", perPass, c, kOf(c), p.IOPerStep)
	}
	// A step whose layer visits take 2 ms each: the measured compute
	// gives k from then on.
	k := rt.MicroBatches()
	rt.Forward()
	for l := 0; l < rt.Layers(); l++ {
		if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		rt.EndLayer(l)
	}
	g := gradsFor(m, 1, 1)
	rt.Backward()
	for l := rt.Layers() - 1; l >= 0; l-- {
		if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil {
			t.Fatal(err)
		}
		for range k {
			for _, n := range rt.LayerTensors(l) {
				if err := rt.AccumulateGrad(ctx, n, g[n]); err != nil {
					t.Fatal(err)
				}
			}
		}
		rt.EndLayer(l)
	}
	if err := rt.Step(ctx); err != nil {
		t.Fatal(err)
	}
	measured := rt.MeasuredComputePerLayer()
	if mc := rt.MicroBatchesToHideIO(0); measured <= 0 || mc != rt.MicroBatchesToHideIO(measured) || !mc.Known() {
		t.Errorf("measured %v: %+v", measured, mc)
	}
	rt.Close()

	// Without the compute: not known, and the plan counts two.
	_, rt, _ = openTwoLayers(t, autoConfig(t, `"auto"`), zinf.Options{})
	if c := rt.MicroBatchesToHideIO(0); c.Known() || rt.MicroBatches() != plan.AutoMicroBatchesUnmeasured || !strings.Contains(c.String(), "not known") {
		t.Errorf("unknown compute: %+v, %d micro-batches", c, rt.MicroBatches())
	}
	rt.Close()

	// A number is the user's.
	_, rt, _ = openTwoLayers(t, autoConfig(t, "3"), zinf.Options{ComputePerLayer: perPass})
	defer rt.Close()
	if rt.MicroBatches() != 3 || rt.Placement().MicroBatches != 3 {
		t.Errorf("gradient_accumulation_steps 3: runtime %d, plan %d", rt.MicroBatches(), rt.Placement().MicroBatches)
	}
}
