package zinf_test

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestPinnedGradsDifferential: the random training cases of
// TestTrainStepDifferential (ranks, micro-batches in both orders, fp16
// with overflow skipping, clipping with and without speculation,
// overlap_update, faults on every store, every rule), with the optimizer
// on NVMe and the parameters on each tier in turn, run once with
// zinf.pinned_grads "off" (every gradient written to NVMe and read back)
// and once with "auto" (the 32 MiB pool keeps every gradient in pinned
// memory): both must give the in-memory reference's bits at every read
// and in the final masters and states, so each other's. With "auto" the
// gradient store moves nothing; with "off" it moves every gradient.
func TestPinnedGradsDifferential(t *testing.T) {
	paramDevices := []config.OffloadDevice{config.OffloadNVMe, config.OffloadCPU, config.OffloadNone}
	forSeeds(t, 6, 3, 40, func(t *testing.T, i int, seed uint64) {
		var written [2]int64
		for j, mode := range []config.PinnedGradsMode{config.PinnedGradsOff, config.PinnedGradsAuto} {
			rng := rand.New(rand.NewPCG(seed, 0x9121))
			c := randomStepCase(t, rng)
			c.cfg.ZeroOptimization.OffloadOptimizer.Device = config.OffloadNVMe
			c.cfg.ZeroOptimization.OffloadParam.Device = paramDevices[i%len(paramDevices)]
			c.cfg.Zinf.PinnedGrads = mode
			t.Logf("zinf.pinned_grads %s, params on %s", mode, c.cfg.ZeroOptimization.OffloadParam.Device)
			rts := c.run(t, seed, rng)
			if t.Failed() {
				return
			}
			for r, rt := range rts {
				g := rt.Metrics().Grads
				st := rt.GradStore.Stats()
				res := rt.Reservations()
				written[j] += st.BytesWritten
				if mode == config.PinnedGradsAuto {
					if res.GradKeptElems != res.GradElems || g.KeptNamedBytes != 4*res.GradElems {
						t.Fatalf("rank %d: %d of %d gradient elements planned pinned, %d bytes kept by the swapper; the 32 MiB pool holds them all",
							r, res.GradKeptElems, res.GradElems, g.KeptNamedBytes)
					}
					if st.BytesWritten != 0 || st.BytesRead != 0 || g.Writes != 0 || g.Reads != 0 {
						t.Errorf("rank %d: pinned gradients moved %d bytes to and %d from the gradient store (%d writes, %d reads)",
							r, st.BytesWritten, st.BytesRead, g.Writes, g.Reads)
					}
				} else if res.GradKeptElems != 0 || g.KeptNamed != 0 {
					t.Errorf("rank %d: zinf.pinned_grads off kept %d elements (%d tensors)", r, res.GradKeptElems, g.KeptNamed)
				}
			}
		}
		if written[0] == 0 {
			t.Errorf("zinf.pinned_grads off wrote no gradient to the store")
		}
	})
}

// pinnedModel is two layers of 4096 elements each.
func pinnedModel() zinf.Model {
	return twoEqualLayers()
}

// fourEqualLayers is four layers of one 4096-element tensor each.
func fourEqualLayers() zinf.Model {
	var ls [][]tensor.Desc
	for _, n := range []string{"a", "b", "c", "d"} {
		ls = append(ls, []tensor.Desc{{Name: n, Shape: []int{4096}}})
	}
	return zinf.LayeredModel(ls...)
}

// trainPinned opens m with c, initializes it, and runs steps of one
// micro-batch (clipping as c says) from step first on, handing each
// layer's gradients to the optimizer as they are final (StepLayer). It
// returns the runtime, open.
func trainPinned(t *testing.T, ctx context.Context, c *config.Config, m zinf.Model, init bool, first, steps int) *zinf.Runtime {
	t.Helper()
	rt, err := zinf.Open(c, m, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if init {
		for _, d := range m.Tensors {
			n, _ := d.Numel()
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(math.Sin(float64(i))) * 0.1
			}
			if err := rt.Init(ctx, d.Name, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	runPinnedSteps(t, ctx, rt, m, first, steps)
	return rt
}

func runPinnedSteps(t *testing.T, ctx context.Context, rt *zinf.Runtime, m zinf.Model, first, steps int) {
	t.Helper()
	for s := first; s < first+steps; s++ {
		stepOnce(t, ctx, rt, gradsFor(m, s, float32(1+s%3)), true)
	}
}

// paramBits reads every tensor's fp32 master and optimizer states (the
// parameters are the masters in this fp32 model).
func paramBits(t *testing.T, ctx context.Context, rt *zinf.Runtime, m zinf.Model) map[string][]uint32 {
	t.Helper()
	out := map[string][]uint32{}
	for _, d := range m.Tensors {
		master, states, err := rt.ReadOptimizerStates(ctx, d.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range append([][]float32{master}, states...) {
			for _, f := range x {
				out[d.Name] = append(out[d.Name], math.Float32bits(f))
			}
		}
	}
	return out
}

func samePinnedBits(t *testing.T, what string, a, b map[string][]uint32) {
	t.Helper()
	for name, x := range a {
		y := b[name]
		if len(x) != len(y) {
			t.Fatalf("%s: %s has %d values, the other run %d", what, name, len(x), len(y))
		}
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("%s: %s value %d differs: %08x vs %08x", what, name, i, x[i], y[i])
			}
		}
	}
}

// TestPinnedGradsCheckpointResume: training with the gradients pinned,
// clipping on and triggering (each update starts during the backward
// pass, speculating that no clipping is needed, and is rolled back and
// redone from the gradients still in pinned memory once the norm says
// otherwise), checkpointed after two steps and resumed in a new runtime
// for two more, ends with the bits of the same four steps trained through
// the NVMe round trip without a break. Without speculation (each update
// waits for the norm), the pinned run's parameter and optimizer traffic
// is the round trip's and its gradient store moves nothing, so the disk
// moves less by at least the round trip's gradient bytes.
func TestPinnedGradsCheckpointResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m := pinnedModel()
	cfgOf := func(mode config.PinnedGradsMode) *config.Config {
		c, _ := testConfig(t)
		c.Zinf.Tiers.CPUPinnedBytes = 32 << 20
		c.GradientClipping = 0.05
		c.Zinf.PinnedGrads = mode
		return c
	}
	off := cfgOf(config.PinnedGradsOff)
	ref := trainPinned(t, ctx, off, m, true, 0, 4)
	want := paramBits(t, ctx, ref, m)
	if ref.Metrics().Train.Clipped == 0 {
		t.Fatalf("no step clipped (%+v): the test wants clipping to trigger", ref.Metrics().Train)
	}

	on := cfgOf(config.PinnedGradsAuto)
	a := trainPinned(t, ctx, on, m, true, 0, 2)
	dir := filepath.Join(t.TempDir(), "ckpt")
	if _, err := zinf.SaveCheckpoint(ctx, dir, []*zinf.Runtime{a}, zinf.CheckpointMeta{Step: 2}, checkpoint.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	on2 := cfgOf(config.PinnedGradsAuto)
	b := trainPinned(t, ctx, on2, m, false, 0, 0)
	for _, d := range m.Tensors {
		n, _ := d.Numel()
		if err := b.Init(ctx, d.Name, make([]float32, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := zinf.LoadCheckpoint(ctx, dir, []*zinf.Runtime{b}); err != nil {
		t.Fatal(err)
	}
	runPinnedSteps(t, ctx, b, m, 2, 2)
	samePinnedBits(t, "resumed pinned run vs round trip", paramBits(t, ctx, b, m), want)

	// The traffic, without speculation (how much of a speculative update
	// is written before its rollback depends on timing): the round trip
	// and the pinned run take the same steps to the same bits, with the
	// same parameter and optimizer traffic and no gradient traffic.
	noSpec := func(mode config.PinnedGradsMode) *config.Config {
		c := cfgOf(mode)
		c.Zinf.Speculate = config.SpeculateNever
		return c
	}
	ref = trainPinned(t, ctx, noSpec(config.PinnedGradsOff), m, true, 0, 4)
	samePinnedBits(t, "round trip without speculation", paramBits(t, ctx, ref, m), want)
	c := trainPinned(t, ctx, noSpec(config.PinnedGradsAuto), m, true, 0, 4)
	samePinnedBits(t, "pinned run without speculation vs round trip", paramBits(t, ctx, c, m), want)
	gs, gr := ref.GradStore.Stats(), c.GradStore.Stats()
	if gs.BytesWritten == 0 || gs.BytesRead+ref.Metrics().Grads.ServedBytes == 0 {
		t.Fatalf("the round trip moved no gradient: %+v", gs)
	}
	if gr.BytesWritten != 0 || gr.BytesRead != 0 {
		t.Errorf("pinned gradients moved %d bytes to the store and %d back", gr.BytesWritten, gr.BytesRead)
	}
	for _, s := range []struct {
		what     string
		ref, got int64
	}{
		{"parameter store written", ref.ParamStore.Stats().BytesWritten, c.ParamStore.Stats().BytesWritten},
		{"parameter store read", ref.ParamStore.Stats().BytesRead, c.ParamStore.Stats().BytesRead},
		{"optimizer store written", ref.OptimStore.Stats().BytesWritten, c.OptimStore.Stats().BytesWritten},
		{"optimizer store read", ref.OptimStore.Stats().BytesRead, c.OptimStore.Stats().BytesRead},
	} {
		if s.ref != s.got {
			t.Errorf("%s: %d bytes with the round trip, %d pinned: only the gradients' traffic should differ", s.what, s.ref, s.got)
		}
	}
	// At the disk: the engine moved less by exactly the gradients' bytes
	// (16 KiB tensors: no padding to the stores' alignment).
	re, ce := ref.Metrics().Engine, c.Metrics().Engine
	if dw := re.WriteBytes - ce.WriteBytes; dw != gs.BytesWritten {
		t.Errorf("the disk wrote %d bytes less with pinned gradients; the round trip wrote %d of gradients", dw, gs.BytesWritten)
	}
	if dr := re.ReadBytes - ce.ReadBytes; dr != gs.BytesRead {
		t.Errorf("the disk read %d bytes less with pinned gradients; the round trip read %d of gradients", dr, gs.BytesRead)
	}
	t.Logf("train: round trip %+v, pinned %+v", ref.Metrics().Train, c.Metrics().Train)
	t.Logf("round trip: engine wrote %d, read %d (gradient store %d / %d, served %d); pinned: engine wrote %d, read %d",
		re.WriteBytes, re.ReadBytes, gs.BytesWritten, gs.BytesRead, ref.Metrics().Grads.ServedBytes, ce.WriteBytes, ce.ReadBytes)
}

// TestPinnedGradsPartialPool: a pool with room for one gradient beyond
// every minimum and the prefetch window (the minimum's write-behind and
// held layer included, which keeping every gradient would free) keeps the
// first layer's in pinned memory and sends the three others through NVMe,
// says so in the reservations and the placement table, and trains
// (layer-major, three micro-batches) to the bits of the round trip.
func TestPinnedGradsPartialPool(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m := fourEqualLayers()
	cfgOf := func(mode config.PinnedGradsMode, pool int64) *config.Config {
		c, _ := testConfig(t)
		c.Zinf.PinnedGrads = mode
		c.Zinf.Schedule = config.ScheduleLayerMajor
		c.GradientAccumulationSteps = 3
		c.Zinf.PrefetchDepth = 1
		if pool > 0 {
			c.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
		}
		return c
	}
	// The pool that keeps nothing: the minimum plus the prefetch window.
	probe, err := zinf.PlanModel(ctx, cfgOf(config.PinnedGradsAuto, 1<<30), m, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	res := probe.Reservations
	if len(res.GradKept) != len(m.Tensors) {
		t.Fatalf("a 1 GiB pool keeps %v of %d gradients", res.GradKept, len(m.Tensors))
	}
	one := res.GradKeptBytes / int64(len(m.Tensors)) // equal layers
	pool := res.MinPoolBytes + res.ParamDemandBytes + one
	p, err := zinf.PlanModel(ctx, cfgOf(config.PinnedGradsAuto, pool), m, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Reservations
	if len(r.GradKept) != 1 || r.GradKept[0] != m.Tensors[0].Name || r.GradKeptElems*4 != r.GradElems {
		t.Fatalf("pool %d: kept %v (%d of %d elements); want %s alone", pool, r.GradKept, r.GradKeptElems, r.GradElems, m.Tensors[0].Name)
	}
	if !strings.Contains(r.GradKeptNote, "25% of the gradients stay in pinned memory") || !strings.Contains(r.String(), r.GradKeptNote) {
		t.Errorf("the reservations do not say what stays pinned: note %q\n%s", r.GradKeptNote, r)
	}
	var b strings.Builder
	if err := p.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "gradients: kept + write-behind") {
		t.Errorf("the placement table does not show the kept gradients:\n%s", b.String())
	}

	layerMajorRun := func(c *config.Config) (*zinf.Runtime, map[string][]uint32) {
		rt, err := zinf.Open(c, m, zinf.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		for _, d := range m.Tensors {
			n, _ := d.Numel()
			if err := rt.Init(ctx, d.Name, make([]float32, n)); err != nil {
				t.Fatal(err)
			}
		}
		for s := range 3 {
			rt.Backward()
			for l := rt.Layers() - 1; l >= 0; l-- {
				if err := rt.BeginLayer(ctx, l); err != nil {
					t.Fatal(err)
				}
				for k := range 3 {
					g := gradsFor(m, 10*s+k, 1)
					for _, n := range rt.LayerTensors(l) {
						if err := rt.AccumulateGrad(ctx, n, g[n]); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := rt.StepLayer(ctx, l); err != nil {
					t.Fatal(err)
				}
				rt.EndLayer(l)
			}
			if err := rt.Step(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return rt, paramBits(t, ctx, rt, m)
	}
	refRT, want := layerMajorRun(cfgOf(config.PinnedGradsOff, pool))
	gotRT, got := layerMajorRun(cfgOf(config.PinnedGradsAuto, pool))
	samePinnedBits(t, "partly pinned vs round trip", got, want)
	if kept := gotRT.Metrics().Grads.KeptNamed; kept != 1 {
		t.Errorf("the runtime kept %d gradients by name, want 1", kept)
	}
	rw, gw := refRT.GradStore.Stats().BytesWritten, gotRT.GradStore.Stats().BytesWritten
	if rw == 0 || gw == 0 || gw*4 != rw*3 {
		t.Errorf("gradient store writes: %d with the round trip, %d partly pinned; want three quarters", rw, gw)
	}
}

// TestPinnedGradsConfig: zinf.pinned_grads takes "auto" (the default) or
// "off"; another value is refused naming the key, the value and what is
// allowed; "off" survives a marshal round trip, and the default is not
// written.
func TestPinnedGradsConfig(t *testing.T) {
	c := config.Default()
	if c.Zinf.PinnedGrads != config.PinnedGradsAuto {
		t.Fatalf("default zinf.pinned_grads %q, want auto", c.Zinf.PinnedGrads)
	}
	_, err := config.Parse([]byte(`{"zinf": {"pinned_grads": "always"}}`))
	if err == nil || !strings.Contains(err.Error(), "zinf.pinned_grads") || !strings.Contains(err.Error(), `"always"`) || !strings.Contains(err.Error(), "auto, off") {
		t.Fatalf("zinf.pinned_grads \"always\": %v; want a refusal naming the key, the value and auto, off", err)
	}
	off, err := config.Parse([]byte(`{"zinf": {"pinned_grads": "off"}}`))
	if err != nil || off.Zinf.PinnedGrads != config.PinnedGradsOff {
		t.Fatalf("zinf.pinned_grads \"off\": %v, %q", err, off.Zinf.PinnedGrads)
	}
	dir := t.TempDir()
	off.SetScratchDir(dir)
	c.SetScratchDir(dir)
	for _, x := range []struct {
		c    *config.Config
		want bool
	}{{off, true}, {c, false}} {
		b, err := x.c.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), "pinned_grads"); got != x.want {
			t.Errorf("marshalled %q: pinned_grads written %v, want %v:\n%s", x.c.Zinf.PinnedGrads, got, x.want, b)
		}
		back, err := config.Parse(b)
		if err != nil {
			t.Fatalf("round trip of %q: %v", x.c.Zinf.PinnedGrads, err)
		}
		if back.Zinf.PinnedGrads != x.c.Zinf.PinnedGrads {
			t.Errorf("round trip of %q: %q", x.c.Zinf.PinnedGrads, back.Zinf.PinnedGrads)
		}
	}
}
