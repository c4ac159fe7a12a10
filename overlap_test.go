package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// overlapModel is four layers of one tensor each, sizes odd, on NVMe.
func overlapModel() (zinf.Model, []string, map[string]int) {
	sizes := []int{40_009, 1021, 65_537, 7}
	var ls [][]tensor.Desc
	var names []string
	numel := map[string]int{}
	for l, n := range sizes {
		name := fmt.Sprintf("layer%d.w", l)
		ls = append(ls, []tensor.Desc{{Name: name, Shape: []int{n}}})
		names = append(names, name)
		numel[name] = n
	}
	return zinf.LayeredModel(ls...), names, numel
}

// overlapConfig: the update runs after the norm is known (clipping with a
// threshold that never triggers, speculation off), one sub-group at a
// time, every swap-in from NVMe; Step returns before the update commits.
func overlapConfig(t *testing.T) *config.Config {
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.GradientClipping = 1e9
	cfg.Zinf.Speculate = config.SpeculateNever
	cfg.Zinf.PipelineDepth = 0
	cfg.Zinf.OverlapUpdate = true
	cfg.Optimizer.LR = 0.01
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func overlapInit(name string, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(math.Sin(float64(i)*0.37+float64(len(name)))) * 0.1
	}
	return w
}

func overlapGrad(name string, step, n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(math.Cos(float64(i*7+step*13+len(name)))) * 0.01
	}
	return g
}

// overlapStep runs one step's forward and backward the README's way
// (BeginLayer, ReadParam, EndLayer; AccumulateGrad, StepLayer) and then
// Step, returning the first error; reads are checked against want.
func overlapStep(ctx context.Context, rt *zinf.Runtime, names []string, numel map[string]int, step int, want map[string][]float32) error {
	if err := overlapForward(ctx, rt, names, numel, step, want); err != nil {
		return err
	}
	rt.Backward()
	for l := len(names) - 1; l >= 0; l-- {
		if err := rt.BeginLayer(ctx, l); err != nil {
			return err
		}
		n := names[l]
		if err := rt.AccumulateGrad(ctx, n, overlapGrad(n, step, numel[n])); err != nil {
			return err
		}
		if err := rt.StepLayer(ctx, l); err != nil {
			return err
		}
		rt.EndLayer(l)
	}
	return rt.Step(ctx)
}

// overlapForward is a forward pass reading every layer, each checked
// against want (nil: not checked).
func overlapForward(ctx context.Context, rt *zinf.Runtime, names []string, numel map[string]int, step int, want map[string][]float32) error {
	rt.Forward()
	for l, n := range names {
		if err := rt.BeginLayer(ctx, l); err != nil {
			return err
		}
		got := make([]float32, numel[n])
		if err := rt.ReadParam(ctx, n, got); err != nil {
			return err
		}
		rt.EndLayer(l)
		if want != nil {
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[n][i]) {
					return fmt.Errorf("step %d: %s[%d] = %v, in memory %v", step, n, i, got[i], want[n][i])
				}
			}
		}
	}
	return nil
}

// forwardEquals runs a forward pass reading every layer and fails the
// test unless each equals want bit for bit.
func forwardEquals(ctx context.Context, t *testing.T, rt *zinf.Runtime, names []string, numel map[string]int, want map[string][]float32) {
	t.Helper()
	if err := overlapForward(ctx, rt, names, numel, -1, want); err != nil {
		t.Fatal(err)
	}
}

// overlapReference is in-memory Adam over the same gradients: the
// parameters, rounded to the param dtype as stored, before step 0 and
// after each step.
func overlapReference(cfg *config.Config, names []string, numel map[string]int, steps int) []map[string][]float32 {
	h := plan.Hyper(cfg)
	master, m, v := map[string][]float32{}, map[string][]float32{}, map[string][]float32{}
	for _, n := range names {
		master[n] = overlapInit(n, numel[n])
		m[n], v[n] = make([]float32, numel[n]), make([]float32, numel[n])
	}
	snap := func() map[string][]float32 {
		out := map[string][]float32{}
		for n, w := range master {
			out[n] = quantize(plan.ParamDType(cfg), w)
		}
		return out
	}
	out := []map[string][]float32{snap()}
	for s := range steps {
		for _, n := range names {
			optimizer.AdamStep(master[n], overlapGrad(n, s, numel[n]), m[n], v[n], s+1, h, optimizer.StepParams{LR: h.LR})
		}
		out = append(out, snap())
	}
	return out
}

// openOverlap opens overlapModel with overlapConfig and a fault
// injector, under a watchdog, with the initial values; ref is in-memory
// training's parameters before step 0 and after each of steps steps.
func openOverlap(t *testing.T, steps int) (ctx context.Context, rt *zinf.Runtime, inj *faults.Injector, names []string, numel map[string]int, ref []map[string][]float32) {
	t.Helper()
	model, names, numel := overlapModel()
	cfg := overlapConfig(t)
	ref = overlapReference(cfg, names, numel, steps)
	ctx, watch := watchdog(t, 2*time.Minute)
	inj = faults.New(1)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quiet, Faults: inj, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	watch(rt)
	if !rt.Placement().OverlapStep || !rt.OverlapUpdate() {
		t.Fatalf("the plan has no room to overlap the update: %+v", rt.Reservations())
	}
	for _, n := range names {
		if err := rt.Init(ctx, n, overlapInit(n, numel[n])); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, rt, inj, names, numel, ref
}

// TestOverlapUpdateNextForward: with zinf.overlap_update, Step returns
// before its update is committed, the next forward's first layer is
// readable while the last ones are still updating, every read equals
// in-memory training bit for bit, and the optimizer states at the end too.
func TestOverlapUpdateNextForward(t *testing.T) {
	const steps = 3
	ctx, rt, inj, names, numel, ref := openOverlap(t, steps)
	// Every optimizer record write takes 150 ms: the update of four
	// tensors, one after the other, takes at least 600 ms.
	const delay = 150 * time.Millisecond
	inj.Add(faults.Rule{Kind: faults.Writes, PathContains: "/zinf-optim-", Delay: delay})
	for s := range steps {
		start := time.Now()
		if err := overlapStep(ctx, rt, names, numel, s, ref[s]); err != nil {
			t.Fatal(err)
		}
		stepped := time.Since(start)
		info := rt.LastStep()
		if !info.Overlapped || info.Step != s+1 || !info.Applied {
			t.Fatalf("step %d: %+v, want an applied step %d that overlapped", s, info, s+1)
		}
		if got := rt.Metrics().Optimizer.Steps; got != int64(s) {
			t.Fatalf("step %d: Step returned after the commit (%d steps committed): nothing overlapped", s, got)
		}
		// The next forward's first layer: readable with the new values
		// while the last layers are still updating.
		t0 := time.Now()
		if err := rt.BeginLayer(ctx, 0); err != nil {
			t.Fatal(err)
		}
		waited := time.Since(t0)
		if got := rt.Metrics().Optimizer.Steps; got != int64(s) {
			t.Errorf("step %d: layer 0 was readable only after the whole step committed (waited %v)", s, waited)
		}
		got := make([]float32, numel[names[0]])
		if err := rt.ReadParam(ctx, names[0], got); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(ref[s+1][names[0]][i]) {
				t.Fatalf("step %d: layer 0 read %v at %d before the commit, in memory %v", s, got[i], i, ref[s+1][names[0]][i])
			}
		}
		rt.EndLayer(0)
		t.Logf("step %d: Step took %v; layer 0 of the next forward waited %v for its update; %d tensors published so far",
			s, stepped, waited, rt.Metrics().Params.Published)
	}
	if err := rt.WaitStep(ctx); err != nil {
		t.Fatal(err)
	}
	m := rt.Metrics()
	if m.Optimizer.Steps != steps || m.Params.Published < int64(steps*len(names)) || m.Params.Reverted != 0 {
		t.Fatalf("after %d steps: optimizer %d steps, %d published, %d reverted", steps, m.Optimizer.Steps, m.Params.Published, m.Params.Reverted)
	}
	if m.UpdateWait <= 0 {
		t.Errorf("UpdateWait %v: the next forward never waited for an update", m.UpdateWait)
	}
	// A final forward: every layer holds the last step's values.
	forwardEquals(ctx, t, rt, names, numel, ref[steps])
}

// TestOverlapUpdateFailure: the update fails (ENOSPC on the last
// tensor's parameter write) after Step returned and after the first
// layers were published. The next forward learns it from BeginLayer
// (ErrUpdateFailed, naming the step and the cause); every published
// tensor is put back, the step count, learning rate and states are as
// before; Step retries the step and the run then equals in-memory
// training bit for bit.
func TestOverlapUpdateFailure(t *testing.T) {
	const steps = 3
	ctx, rt, inj, names, numel, ref := openOverlap(t, steps)
	if err := overlapStep(ctx, rt, names, numel, 0, ref[0]); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitStep(ctx); err != nil {
		t.Fatal(err)
	}
	before := rt.Metrics()
	lr := rt.LR()
	// Step 1: the optimizer writes are slow, so Step returns first; the
	// fourth parameter write of the step (the last layer's) fails.
	inj.Add(faults.Rule{Kind: faults.Writes, PathContains: "/zinf-optim-", Delay: 50 * time.Millisecond})
	inj.Add(faults.Rule{Kind: faults.Writes, PathContains: "/zinf-param-", Nth: len(names), Times: 1, Err: syscall.ENOSPC})
	if err := overlapStep(ctx, rt, names, numel, 1, ref[1]); err != nil {
		t.Fatalf("step 1 returned %v: the failure should come after Step", err)
	}
	if !rt.LastStep().Overlapped {
		t.Fatalf("step 1 did not overlap: %+v", rt.LastStep())
	}
	// The next forward runs into the failure.
	rt.Forward()
	var failed error
	for l := range names {
		if err := rt.BeginLayer(ctx, l); err != nil {
			failed = err
			break
		}
		rt.EndLayer(l)
	}
	if failed == nil {
		failed = rt.WaitStep(ctx)
	}
	if !errors.Is(failed, zinf.ErrUpdateFailed) || !errors.Is(failed, aio.ErrNoSpace) {
		t.Fatalf("after the failed update: %v, want ErrUpdateFailed wrapping ENOSPC", failed)
	}
	if msg := failed.Error(); !strings.Contains(msg, "(step 2)") || !strings.Contains(msg, "call Step") {
		t.Errorf("the error does not name the step and what to do: %v", msg)
	}
	// It stays until Step: the gradient calls and reads say so too.
	if err := rt.AccumulateGrad(ctx, names[0], overlapGrad(names[0], 9, numel[names[0]])); !errors.Is(err, zinf.ErrUpdateFailed) {
		t.Fatalf("AccumulateGrad after the failed update: %v", err)
	}
	m := rt.Metrics()
	if m.Params.Published == before.Params.Published || m.Params.Reverted != m.Params.Published-before.Params.Published {
		t.Fatalf("published %d -> %d, reverted %d: want the first layers published, then all put back",
			before.Params.Published, m.Params.Published, m.Params.Reverted)
	}
	if m.Optimizer.Steps != 1 || m.Steps != 1 || rt.LR() != lr || rt.LastStep().Step != 1 {
		t.Fatalf("after the failure: %d optimizer steps, %d runtime steps, LR %v (was %v), last %+v: want step 1's", m.Optimizer.Steps, m.Steps, rt.LR(), lr, rt.LastStep())
	}
	for _, n := range names {
		ms, _, _, err := rt.ReadOptimizerState(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ms {
			if w := ref[1][n][i]; math.Float32bits(ms[i]) != math.Float32bits(w) {
				t.Fatalf("%s master[%d] = %v after the failed step, want step 1's %v", n, i, ms[i], w)
			}
		}
	}
	// Space returns; Step retries step 2; the interrupted step runs again.
	inj.Clear()
	if err := rt.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if info := rt.LastStep(); info.Step != 2 {
		t.Fatalf("the retry: %+v", info)
	}
	if err := overlapStep(ctx, rt, names, numel, 2, ref[2]); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitStep(ctx); err != nil {
		t.Fatal(err)
	}
	forwardEquals(ctx, t, rt, names, numel, ref[3])
}

// TestOverlapUpdateCheckpoint: a checkpoint saved right after Step
// returned, while the step's update still runs, holds that step (the
// save waits for it), and a runtime that loads it reads the step's
// parameters and states; Close with an update running lands it too.
func TestOverlapUpdateCheckpoint(t *testing.T) {
	const steps = 2
	ctx, rt, inj, names, numel, ref := openOverlap(t, steps)
	inj.Add(faults.Rule{Kind: faults.Writes, PathContains: "/zinf-optim-", Delay: 40 * time.Millisecond})
	if err := overlapStep(ctx, rt, names, numel, 0, ref[0]); err != nil {
		t.Fatal(err)
	}
	if !rt.LastStep().Overlapped || rt.Metrics().Optimizer.Steps != 0 {
		t.Fatalf("step 1 did not overlap: %+v", rt.LastStep())
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := zinf.SaveCheckpoint(ctx, dir, []*zinf.Runtime{rt}, zinf.CheckpointMeta{Step: 1}, checkpoint.SaveOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	model, _, _ := overlapModel()
	rt2, err := zinf.Open(overlapConfig(t), model, zinf.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt2.Close() })
	for _, n := range names {
		if err := rt2.Init(ctx, n, make([]float32, numel[n])); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := zinf.LoadCheckpoint(ctx, dir, []*zinf.Runtime{rt2}); err != nil {
		t.Fatal(err)
	}
	forwardEquals(ctx, t, rt2, names, numel, ref[1])
	for _, n := range names {
		a, _, _, err := rt.ReadOptimizerState(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		b, _, _, err := rt2.ReadOptimizerState(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%s master[%d]: %v saved, %v loaded", n, i, a[i], b[i])
			}
		}
	}
	// Close right after Step returned: the update lands, no error.
	if err := overlapStep(ctx, rt, names, numel, 1, ref[1]); err != nil {
		t.Fatal(err)
	}
	if !rt.LastStep().Overlapped {
		t.Fatalf("step 2 did not overlap: %+v", rt.LastStep())
	}
	if err := rt.Close(); err != nil {
		t.Fatalf("Close with an update running: %v", err)
	}
	if got := rt.Metrics().Optimizer.Steps; got != steps {
		t.Fatalf("after Close: %d optimizer steps committed, want %d", got, steps)
	}
}
