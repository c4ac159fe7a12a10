package zinf_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/tensor"
)

// actRun is the outcome of actTrain: every tensor's final master and
// optimizer states, the tier's counters, the faults that fired and the
// steps given up.
type actRun struct {
	state   map[string][]float32
	stats   zinf.ActivationStats
	hits    int
	retries int
}

// actTrain trains a 3-layer model layer-major for 3 steps of k = 3
// micro-batches, handing each layer's "activations" of each micro-batch
// (its input: here the layer's parameters as read, shifted by the
// micro-batch and the step) to the activation tier in the forward pass,
// and computing each gradient in the backward pass from what the tier
// gives back: activations that came back wrong change the result. fault,
// when set, is armed on the runtime's engine before step 1; a step that
// fails is given up (AbortStep, Reset) and run again.
func actTrain(t *testing.T, tune func(*config.Config), fault *faults.Rule) actRun {
	t.Helper()
	const layers, k, steps, n = 3, 3, 3, 3001
	var ls [][]tensor.Desc
	for l := range layers {
		ls = append(ls, []tensor.Desc{{Name: fmt.Sprintf("l%d.w", l), Shape: []int{n}}})
	}
	model := zinf.LayeredModel(ls...)
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	cfg.GradientAccumulationSteps = k
	cfg.Zinf.Schedule = config.ScheduleLayerMajor
	tune(cfg)
	inj := faults.New(11)
	ctx, watch := watchdog(t, 2*time.Minute)
	rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, Faults: inj})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	watch(rt)
	acts, err := rt.OpenActivations(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer acts.Close()
	for _, d := range model.Tensors {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(math.Sin(float64(i)*0.1+float64(len(d.Name)))) * 0.1
		}
		if err := rt.Init(ctx, d.Name, w); err != nil {
			t.Fatal(err)
		}
	}
	w, x, g := make([]float32, n), make([]float32, n), make([]float32, n)
	var out actRun
	step := func(s int) error {
		rt.Forward()
		for l := range layers {
			if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil {
				return err
			}
			name := fmt.Sprintf("l%d.w", l)
			if err := rt.ReadParam(ctx, name, w); err != nil {
				return err
			}
			for m := range k {
				for i := range x {
					x[i] = w[i]*float32(m+1) + float32(s)*0.01
				}
				if err := acts.Save(ctx, l, m, buffers.AsBytes(x)); err != nil {
					return err
				}
			}
			rt.EndLayer(l)
		}
		rt.Backward()
		for l := layers - 1; l >= 0; l-- {
			if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil {
				return err
			}
			name := fmt.Sprintf("l%d.w", l)
			for m := range k {
				got, err := acts.Load(ctx, l, m, buffers.AsBytes(x))
				if err != nil {
					return err
				}
				if got != 4*n {
					return fmt.Errorf("layer %d micro-batch %d: %d bytes back, saved %d", l, m, got, 4*n)
				}
				for i := range g {
					g[i] = x[i]*0.5 + float32(math.Cos(float64(i+m)))*0.01
				}
				if err := rt.AccumulateGrad(ctx, name, g); err != nil {
					return err
				}
			}
			_ = rt.StepLayer(ctx, l)
			rt.EndLayer(l)
		}
		if err := acts.Flush(ctx); err != nil {
			return err
		}
		return rt.Step(ctx)
	}
	for s := range steps {
		if s == 1 && fault != nil {
			inj.Add(*fault)
		}
		for attempt := 0; ; attempt++ {
			err := step(s)
			if err == nil {
				break
			}
			if fault == nil || attempt > 5 || !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("step %d: %v", s, err)
			}
			// Give the step up: nothing of it stays; space returns.
			rt.AbortStep()
			acts.Reset()
			inj.Clear()
			out.retries++
		}
	}
	out.stats, out.hits = acts.Stats(), inj.Hits()
	out.state = map[string][]float32{}
	for _, d := range model.Tensors {
		ms, st, err := rt.ReadOptimizerStates(ctx, d.Name)
		if err != nil {
			t.Fatal(err)
		}
		out.state[d.Name] = ms
		for j, v := range st {
			out.state[fmt.Sprintf("%s/%d", d.Name, j)] = v
		}
	}
	return out
}

func sameState(t *testing.T, what string, got, want map[string][]float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d arrays, want %d", what, len(got), len(want))
	}
	for k, w := range want {
		g := got[k]
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("%s: %s[%d] = %v, want %v", what, k, i, g[i], w[i])
			}
		}
	}
}

// TestActivationTiers: activations through each tier of the activation
// tier — memory, pinned memory, NVMe (written behind, read back ahead of
// the backward pass), and auto over budgets that spill across all three —
// give the same bits as in memory, each entry where zinf.activations (or
// DeepSpeed's activation_checkpointing.cpu_checkpointing) puts it.
func TestActivationTiers(t *testing.T) {
	ref := actTrain(t, func(c *config.Config) { c.Zinf.Activations.Device = config.ActivationsMemory }, nil)
	if ref.stats.PeakMemoryBytes == 0 || ref.stats.PeakPinnedBytes != 0 || ref.stats.PeakNVMeBytes != 0 {
		t.Fatalf("memory tier: %+v", ref.stats)
	}
	const entry = 4 * 3001
	for _, c := range []struct {
		name  string
		tune  func(*config.Config)
		check func(s zinf.ActivationStats) bool
	}{
		{"cpu", func(c *config.Config) { c.Zinf.Activations.Device = config.ActivationsCPU }, func(s zinf.ActivationStats) bool {
			return s.PeakPinnedBytes == 9*entry && s.PeakMemoryBytes == 0 && s.PeakNVMeBytes == 0
		}},
		{"cpu_checkpointing", func(c *config.Config) { c.CPUCheckpointing = true }, func(s zinf.ActivationStats) bool {
			return s.PeakPinnedBytes == 9*entry && s.PeakMemoryBytes == 0 // DeepSpeed's key: pinned memory under auto
		}},
		{"nvme", func(c *config.Config) { c.Zinf.Activations.Device = config.ActivationsNVMe }, func(s zinf.ActivationStats) bool {
			return s.PeakNVMeBytes == 9*entry && s.BytesWritten == 3*9*entry && s.BytesRead <= s.BytesWritten && s.Prefetched > 0 && s.PeakMemoryBytes == 0
		}},
		{"auto-spill", func(c *config.Config) {
			c.Zinf.Activations.MemoryBytes = 2 * entry // two entries in memory, the pinned pool holds a few, the rest on NVMe
			c.Zinf.Activations.CPUBytes = 8 * 16 << 10
		}, func(s zinf.ActivationStats) bool {
			return s.PeakMemoryBytes == 2*entry && s.PeakPinnedBytes > 0 && s.PeakNVMeBytes > 0
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := actTrain(t, c.tune, nil)
			sameState(t, c.name, got.state, ref.state)
			if !c.check(got.stats) || got.stats.Saved != 27 || got.stats.Loaded != 27 {
				t.Errorf("%s tier: %+v", c.name, got.stats)
			}
		})
	}
}

// TestActivationTierENOSPC: a full disk under the activation tier's
// write-behind mid-step fails the step (Save, Load or Flush returns
// ENOSPC naming the entry); the loop gives the step up (AbortStep,
// Reset) — nothing of it changed — and runs it again: the result is the
// fault-free one, bit for bit.
func TestActivationTierENOSPC(t *testing.T) {
	ref := actTrain(t, func(c *config.Config) { c.Zinf.Activations.Device = config.ActivationsMemory }, nil)
	for _, nth := range []int{1, 4, 8} {
		t.Run(fmt.Sprint("write", nth), func(t *testing.T) {
			got := actTrain(t, func(c *config.Config) { c.Zinf.Activations.Device = config.ActivationsNVMe },
				&faults.Rule{Kind: faults.Writes, PathContains: "/zinf-act-", Err: syscall.ENOSPC, Nth: nth, Times: 1})
			if got.hits == 0 || got.retries == 0 || got.stats.WriteFailures == 0 {
				t.Fatalf("the fault did not fail a step: %d hits, %d retries, %+v", got.hits, got.retries, got.stats)
			}
			sameState(t, "after the retry", got.state, ref.state)
		})
	}
}

// TestActivationsRefusalLeavesNothing: activations auto with a cpu_bytes
// below the nvme tier's staging are refused, naming the key and the bytes,
// and the refused OpenActivations leaves no directory behind (its swap
// store's run directory is removed at once, not left to the next run).
func TestActivationsRefusalLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	c := config.Default()
	c.SetScratchDir(dir)
	c.Zinf.Tiers.CPUPinnedBytes = 8 << 20
	c.Zinf.Bandwidth.Probe = false
	c.Zinf.Activations = config.Activations{Device: config.ActivationsAuto, MemoryBytes: 4096, CPUBytes: 4096}
	rt, err := zinf.Open(c, zinf.LayeredModel([]tensor.Desc{{Name: "w", Shape: []int{64}}}), zinf.Options{NoBandwidthProbe: true, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	before, _ := os.ReadDir(dir)
	a, err := rt.OpenActivations(1 << 20)
	if err == nil {
		a.Close()
		t.Fatal("activations auto with 4 KiB of cpu_bytes for entries of 1 MiB were accepted")
	}
	if !strings.Contains(err.Error(), "zinf.activations.cpu_bytes = 4KiB") || !strings.Contains(err.Error(), "staging") {
		t.Errorf("the refusal does not name the key, the value and the need: %v", err)
	}
	after, _ := os.ReadDir(dir)
	if len(after) != len(before) {
		var names []string
		for _, e := range after {
			names = append(names, e.Name())
		}
		t.Errorf("the refused OpenActivations left entries in %s: %d before, now %v", dir, len(before), names)
	}
}
