package zinf_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/schedule"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// TestOpenNeedsCommForGlobalChecks: at world size > 1, clipping and fp16
// need every rank's gradients; without a Comm Open refuses, naming what to
// set. Without them (or at world 1) none is needed.
func TestOpenNeedsCommForGlobalChecks(t *testing.T) {
	m := oneTensor("w", 100)
	for _, tc := range []struct {
		name   string
		mutate func(c *config.Config)
		want   string
	}{
		{"clipping", func(c *config.Config) { c.GradientClipping = 1 }, "gradient_clipping 1 needs the global gradient norm at world size 2: set zinf.Options.Comm"},
		{"fp16", func(c *config.Config) { c.FP16 = true }, "fp16 loss scaling needs the overflow check of every rank at world size 2: set zinf.Options.Comm"},
		{"both", func(c *config.Config) { c.FP16 = true; c.GradientClipping = 0.5 }, "gradient_clipping 0.5 needs the global gradient norm and fp16 loss scaling"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := testConfig(t)
			tc.mutate(c)
			_, err := zinf.Open(c, m, zinf.Options{Rank: 1, WorldSize: 2})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want %q", err, tc.want)
			}
			// World 1 needs no Comm.
			rt, err := zinf.Open(c, m, zinf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rt.Close()
		})
	}
	c, _ := testConfig(t)
	rt, err := zinf.Open(c, m, zinf.Options{Rank: 1, WorldSize: 2})
	if err != nil {
		t.Fatalf("world 2 without clipping or fp16: %v", err)
	}
	rt.Close()
	comms, _ := comm.NewLocal(3, comm.LocalOptions{})
	c.GradientClipping = 1
	if _, err := zinf.Open(c, m, zinf.Options{Rank: 1, WorldSize: 2, Comm: comms[1]}); err == nil || !strings.Contains(err.Error(), "Options.Comm is rank 1 of 3 ranks; this runtime is rank 1 of 2") {
		t.Fatalf("a Comm of another world: %v", err)
	}
}

// stepOnce accumulates g (full tensor) for every tensor and steps.
func stepOnce(t *testing.T, ctx context.Context, rt *zinf.Runtime, g map[string][]float32, handOver bool) {
	t.Helper()
	backwardOnce(t, ctx, rt, g, handOver, nil)
	if err := rt.Step(ctx); err != nil {
		t.Fatal(err)
	}
}

// backwardOnce is stepOnce's backward pass, without the Step; a
// StepLayer error that wraps tolerate (when not nil) is not a failure.
func backwardOnce(t *testing.T, ctx context.Context, rt *zinf.Runtime, g map[string][]float32, handOver bool, tolerate error) {
	t.Helper()
	rt.Backward()
	for l := rt.Layers() - 1; l >= 0; l-- {
		if err := rt.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		for _, n := range rt.LayerTensors(l) {
			if err := rt.AccumulateGrad(ctx, n, g[n]); err != nil {
				t.Fatal(err)
			}
		}
		if handOver {
			if err := rt.StepLayer(ctx, l); err != nil && (tolerate == nil || !errors.Is(err, tolerate)) {
				t.Fatal(err)
			}
		}
		rt.EndLayer(l)
	}
}

func twoLayers() zinf.Model {
	return zinf.LayeredModel([]tensor.Desc{{Name: "a", Shape: []int{3000}}}, []tensor.Desc{{Name: "b", Shape: []int{2000}}})
}

// openTwoLayers opens twoLayers with c and opts under a one-minute
// watchdog, its tensors initialized to zero. The caller closes it.
func openTwoLayers(t *testing.T, c *config.Config, opts zinf.Options) (context.Context, *zinf.Runtime, zinf.Model) {
	t.Helper()
	m := twoLayers()
	rt, err := zinf.Open(c, m, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, watch := watchdog(t, time.Minute)
	watch(rt)
	for _, d := range m.Tensors {
		n, _ := d.Numel()
		if err := rt.Init(ctx, d.Name, make([]float32, n)); err != nil {
			rt.Close()
			t.Fatal(err)
		}
	}
	return ctx, rt, m
}

func gradsFor(m zinf.Model, step int, scale float32) map[string][]float32 {
	out := map[string][]float32{}
	for _, d := range m.Tensors {
		n, _ := d.Numel()
		g := make([]float32, n)
		for i := range g {
			g[i] = float32(math.Cos(float64(i*3+step*7))) * 0.01 * scale
		}
		out[d.Name] = g
	}
	return out
}

// TestClippingNotTriggeringKeepsOverlapAndReads: clipping on but never
// triggering takes each step as a speculative overlapped update that
// commits, and reads from NVMe exactly what the same training without
// clipping reads: the norm comes from the gradients as they are written
// behind, not from a pass over the store.
func TestClippingNotTriggeringKeepsOverlapAndReads(t *testing.T) {
	run := func(clip float64) (zinf.Metrics, []float32) {
		c, _ := testConfig(t)
		c.Zinf.Tiers.CPUPinnedBytes = 32 << 20
		c.GradientClipping = clip
		c.Zinf.Speculate = config.SpeculateAlways
		ctx, rt, m := openTwoLayers(t, c, zinf.Options{})
		defer rt.Close()
		if !rt.Placement().OverlapStep {
			t.Skip("the plan has no room to overlap the step here")
		}
		for step := range 4 {
			stepOnce(t, ctx, rt, gradsFor(m, step, 1), true)
		}
		w, _, _, err := rt.ReadOptimizerState(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		return rt.Metrics(), w
	}
	off, wOff := run(0)
	on, wOn := run(1e9)
	if on.Train.Speculated != 4 || on.Train.Commits != 4 || on.Train.Rollbacks != 0 || on.Train.Clipped != 0 {
		t.Fatalf("clipping on, not triggering: %+v", on.Train)
	}
	// Prefetched parameters given back before use (a loaded CPU can
	// reorder the swap-ins' goroutines) are read again: not the step's.
	// A gradient the optimizer reads while its write-behind is in flight
	// comes from its pinned copy (Grads.ServedBytes) instead of NVMe,
	// however the writes' timing falls: the bytes consumed are the same.
	onGrad, offGrad := on.Grads.BytesRead+on.Grads.ServedBytes, off.Grads.BytesRead+off.Grads.ServedBytes
	if onGrad != offGrad || on.BytesRead-on.Params.PreemptedBytes+on.Grads.ServedBytes != off.BytesRead-off.Params.PreemptedBytes+off.Grads.ServedBytes {
		t.Fatalf("NVMe reads with clipping %d (gradients %d + %d served, preempted parameters %d), without %d (gradients %d + %d served, preempted %d)",
			on.BytesRead, on.Grads.BytesRead, on.Grads.ServedBytes, on.Params.PreemptedBytes, off.BytesRead, off.Grads.BytesRead, off.Grads.ServedBytes, off.Params.PreemptedBytes)
	}
	for i := range wOn {
		if math.Float32bits(wOn[i]) != math.Float32bits(wOff[i]) {
			t.Fatalf("a clip that never triggers changed the result at %d", i)
		}
	}
}

// TestSetLR: a loop that sets the rate itself; a rate changed after the
// step's update started (StepTensor) is applied by redoing the step.
func TestSetLR(t *testing.T) {
	c, _ := testConfig(t)
	c.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	c.Scheduler.Type, c.Scheduler.WarmupNumSteps, c.Scheduler.WarmupMaxLR = config.SchedulerWarmupLR, 10, 0.01
	m := twoLayers()
	rt, err := zinf.Open(c, m, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx, watch := watchdog(t, time.Minute)
	watch(rt)
	init := map[string][]float32{}
	for _, d := range m.Tensors {
		n, _ := d.Numel()
		init[d.Name] = make([]float32, n)
		for i := range init[d.Name] {
			init[d.Name][i] = float32(i%7) * 0.1
		}
		if err := rt.Init(ctx, d.Name, init[d.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if rt.LR() != 0 {
		t.Fatalf("WarmupLR's first rate is warmup_min_lr 0, got %v", rt.LR())
	}
	if err := rt.SetLR(-1); err == nil {
		t.Fatal("SetLR(-1) accepted")
	}
	if err := rt.SetLR(math.Inf(1)); err == nil {
		t.Fatal("SetLR(+Inf) accepted")
	}
	if err := rt.SetLR(0.05); err != nil || rt.LR() != 0.05 {
		t.Fatalf("SetLR: %v, LR %v", err, rt.LR())
	}
	h := plan.Hyper(c)
	ref := map[string][3][]float32{}
	for n, w := range init {
		ref[n] = [3][]float32{append([]float32(nil), w...), make([]float32, len(w)), make([]float32, len(w))}
	}
	refStep := func(step int, lr float32, g map[string][]float32) {
		for n, r := range ref {
			optimizer.AdamStep(r[0], append([]float32(nil), g[n]...), r[1], r[2], step, h, optimizer.StepParams{LR: lr})
		}
	}
	g := gradsFor(m, 0, 1)
	stepOnce(t, ctx, rt, g, true)
	refStep(1, 0.05, g)
	if in := rt.LastStep(); in.LR != 0.05 || in.RolledBack {
		t.Fatalf("step 1: %+v", in)
	}
	// Change the rate after the update began: the step is redone at 0.02.
	g = gradsFor(m, 1, 1)
	rt.Backward()
	for l := rt.Layers() - 1; l >= 0; l-- {
		if err := rt.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		for _, n := range rt.LayerTensors(l) {
			if err := rt.AccumulateGrad(ctx, n, g[n]); err != nil {
				t.Fatal(err)
			}
		}
		if err := rt.StepLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		rt.EndLayer(l)
	}
	if err := rt.SetLR(0.02); err != nil {
		t.Fatal(err)
	}
	if err := rt.Step(ctx); err != nil {
		t.Fatal(err)
	}
	refStep(2, 0.02, g)
	in := rt.LastStep()
	if in.LR != 0.02 || (rt.Placement().OverlapStep && !in.RolledBack) {
		t.Fatalf("step 2: %+v", in)
	}
	for n, r := range ref {
		w, _, _, err := rt.ReadOptimizerState(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range w {
			if math.Float32bits(w[i]) != math.Float32bits(r[0][i]) {
				t.Fatalf("%s[%d] = %v, reference %v", n, i, w[i], r[0][i])
			}
		}
	}
}

// TestLossScaleAtMinimumFails: an overflow with the loss scale already at
// fp16.min_loss_scale fails the step (DeepSpeed raises: training
// diverged) and changes nothing; clean gradients then step normally.
func TestLossScaleAtMinimumFails(t *testing.T) {
	c, _ := testConfig(t)
	c.FP16 = true
	c.LossScaling.InitialScalePower, c.LossScaling.MinLossScale, c.LossScaling.Hysteresis = 2, 2, 1
	m := oneTensor("w", 500)
	rt, err := zinf.Open(c, m, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx, watch := watchdog(t, time.Minute)
	watch(rt)
	if err := rt.Init(ctx, "w", make([]float32, 500)); err != nil {
		t.Fatal(err)
	}
	bad := make([]float32, 500)
	bad[7] = float32(math.NaN())
	// Scale 4: overflow halves it to 2 (the minimum), the step is skipped.
	stepOnce(t, ctx, rt, map[string][]float32{"w": bad}, false)
	if in := rt.LastStep(); in.Applied || in.LossScale != 4 || in.NextLossScale != 2 || rt.LossScale() != 2 {
		t.Fatalf("first overflow: %+v", in)
	}
	rt.Backward()
	if err := rt.BeginLayer(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := rt.AccumulateGrad(ctx, "w", bad); err != nil {
		t.Fatal(err)
	}
	rt.EndLayer(0)
	err = rt.Step(ctx)
	if !errors.Is(err, schedule.ErrLossScaleAtMinimum) {
		t.Fatalf("overflow at the minimum: %v", err)
	}
	if rt.LossScale() != 2 || rt.Optimizer.StepCount() != 0 || rt.Metrics().Train.Skipped != 1 {
		t.Fatalf("a failed step changed the state: scale %v, steps %d, %+v", rt.LossScale(), rt.Optimizer.StepCount(), rt.Metrics().Train)
	}
}

// TestGradientServedWhileWriting: the optimizer, updating a layer as soon
// as its gradient is handed over (the overlapped step), reads a gradient
// whose write-behind is still in flight from its pinned copy instead of
// waiting for the write and reading it back from NVMe: with every
// gradient write slowed, the gradients come from pinned memory
// (Metrics().Grads.ServedBytes, zinf_grad_served_bytes_total) and the
// gradient store is read less, and the weights equal those of the same
// training with no slowed write, bit for bit. A write-behind that fails
// is still reported to the step (Step flushes before it commits), and the
// result is the fault-free one.
func TestGradientServedWhileWriting(t *testing.T) {
	run := func(rule *faults.Rule, failOnce bool) (zinf.Metrics, []float32) {
		c, _ := testConfig(t)
		c.Zinf.Tiers.CPUPinnedBytes = 32 << 20
		c.Zinf.PinnedGrads = config.PinnedGradsOff // the write-behind is what is served
		inj := faults.New(1)
		ctx, rt, m := openTwoLayers(t, c, zinf.Options{Faults: inj})
		defer rt.Close()
		if !rt.Placement().OverlapStep {
			t.Fatal("the plan does not overlap the step with 32 MiB pinned")
		}
		if rule != nil {
			inj.Add(*rule)
		}
		for step := range 3 {
			g := gradsFor(m, step, 1)
			if failOnce && step == 1 {
				inj.Add(faults.Rule{Kind: faults.Writes, PathContains: filepath.Join("/", "zinf-grad-"), Delay: 50 * time.Millisecond, Err: syscall.EIO, Times: 1})
				backwardOnce(t, ctx, rt, g, true, syscall.EIO)
				// The failure is reported to the step (by the optimizer's
				// read, or by Step's flush when the read was served): the
				// step redoes the layer from the kept gradient, or returns
				// the failure and is called again.
				if err := rt.Step(ctx); err != nil {
					if !errors.Is(err, syscall.EIO) {
						t.Fatalf("step with a failed gradient write: %v, want EIO or nil", err)
					}
					if err := rt.Step(ctx); err != nil {
						t.Fatalf("retried step: %v", err)
					}
				}
				if g := rt.Metrics().Grads; g.WriteErrors != 1 {
					t.Fatalf("%d gradient write errors counted, want 1", g.WriteErrors)
				}
				continue
			}
			stepOnce(t, ctx, rt, g, true)
		}
		w, _, _, err := rt.ReadOptimizerState(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		return rt.Metrics(), w
	}
	slow := &faults.Rule{Kind: faults.Writes, PathContains: filepath.Join("/", "zinf-grad-"), Delay: 300 * time.Millisecond}
	plain, want := run(nil, false)
	slowed, got := run(slow, false)
	if slowed.Grads.ServedBytes == 0 || slowed.Grads.BytesRead >= plain.Grads.BytesRead+plain.Grads.ServedBytes {
		t.Fatalf("gradient writes slowed by 300 ms: %d bytes served from pinned memory, %d read from NVMe (%d + %d served unslowed)",
			slowed.Grads.ServedBytes, slowed.Grads.BytesRead, plain.Grads.BytesRead, plain.Grads.ServedBytes)
	}
	if slowed.Grads.BytesRead+slowed.Grads.ServedBytes != plain.Grads.BytesRead+plain.Grads.ServedBytes {
		t.Fatalf("gradient bytes consumed: %d + %d served slowed, %d + %d unslowed",
			slowed.Grads.BytesRead, slowed.Grads.ServedBytes, plain.Grads.BytesRead, plain.Grads.ServedBytes)
	}
	same := func(what string, got []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: weight %d = %v, want %v", what, i, got[i], want[i])
			}
		}
	}
	same("gradients served from pinned memory", got)
	_, failed := run(slow, true)
	same("a failed gradient write, the step retried", failed)
}

// TestGradientWriteBehindsInFlight: with room in the pool beyond its
// minimum, the gradient reservation holds more than one write-behind, so a
// gradient handed over does not wait for the write of the one before it;
// at the minimum pool it does (one buffer), and both end in the same
// state. The gradient writes are slowed by a second each.
func TestGradientWriteBehindsInFlight(t *testing.T) {
	const delay = time.Second
	run := func(pool int64) (zinf.Reservations, time.Duration, []float32) {
		t.Helper()
		c, _ := testConfig(t)
		c.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
		c.Zinf.PinnedGrads = config.PinnedGradsOff // the write-behinds are what is measured
		inj := faults.New(1)
		m := twoEqualLayers()
		rt, err := zinf.Open(c, m, zinf.Options{Faults: inj})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		ctx, watch := watchdog(t, time.Minute)
		watch(rt)
		for _, d := range m.Tensors {
			n, _ := d.Numel()
			if err := rt.Init(ctx, d.Name, make([]float32, n)); err != nil {
				t.Fatal(err)
			}
		}
		res := rt.Reservations()
		inj.Add(faults.Rule{Kind: faults.Writes, PathContains: filepath.Join("/", "zinf-grad-"), Delay: delay})
		// The second gradient is handed over while the first one's write
		// (slowed) is in flight.
		g := gradsFor(m, 0, 1)
		if err := rt.AccumulateGrad(ctx, "b", g["b"]); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := rt.AccumulateGrad(ctx, "a", g["a"]); err != nil {
			t.Fatal(err)
		}
		second := time.Since(start)
		if err := rt.Step(ctx); err != nil {
			t.Fatal(err)
		}
		w, _, _, err := rt.ReadOptimizerState(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		return res, second, w
	}
	c, _ := testConfig(t)
	c.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	probe, err := zinf.PlanModel(context.Background(), c, twoEqualLayers(), zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	minPool := probe.Reservations.MinPoolBytes

	roomy, fast, want := run(64 << 20)
	if roomy.GradInFlight != 1+plan.GradExtraWriteBehinds || roomy.GradExtraBytes == 0 || roomy.GradBytes <= roomy.GradExtraBytes {
		t.Fatalf("64 MiB pool: gradient reservation %d bytes, %d extra, %d in flight; want %d in flight",
			roomy.GradBytes, roomy.GradExtraBytes, roomy.GradInFlight, 1+plan.GradExtraWriteBehinds)
	}
	if fast >= delay/2 {
		t.Errorf("64 MiB pool (%d write-behinds in flight): the second layer's gradient waited %v for the first's write (slowed by %v)", roomy.GradInFlight, fast, delay)
	}
	tight, slow, got := run(minPool)
	if tight.GradInFlight != 1 || tight.GradExtraBytes != 0 || tight.PrefetchBytes != 0 {
		t.Fatalf("minimum pool %d: %d write-behinds in flight, %d extra bytes, prefetch window %d; want 1, 0, 0", minPool, tight.GradInFlight, tight.GradExtraBytes, tight.PrefetchBytes)
	}
	if slow < delay*9/10 {
		t.Errorf("minimum pool: the second layer's gradient took %v, want it to wait for the first's write (%v): the reservation holds one", slow, delay)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("weight %d = %v at the minimum pool, %v with room", i, got[i], want[i])
		}
	}
}

// twoEqualLayers is two layers of one 16 KiB tensor each.
func twoEqualLayers() zinf.Model {
	return zinf.LayeredModel([]tensor.Desc{{Name: "a", Shape: []int{4096}}}, []tensor.Desc{{Name: "b", Shape: []int{4096}}})
}
