package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testConfig is the embedded default with swap files under t's temp dirs,
// params always swapped from NVMe (no max_in_cpu cache), small pools.
func testConfig(t *testing.T, mutate func(c *config.Config)) *config.Config {
	t.Helper()
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	c.GradientAccumulationSteps = 2
	if mutate != nil {
		mutate(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	return c
}

var smallSpec = Spec{Layers: 3, Width: 48, Batch: 4, Seed: 7}

// TestBitForBit trains with everything offloaded and checks the final
// weights and optimizer states equal in-memory training bit for bit,
// across the settings that change how bytes move.
func TestBitForBit(t *testing.T) {
	type tc struct {
		name   string
		mutate func(c *config.Config)
	}
	cases := []tc{
		{"depth0", func(c *config.Config) { c.Zinf.PipelineDepth = 0 }},
		{"depth1", func(c *config.Config) { c.Zinf.PipelineDepth = 1 }},
		{"depth3", func(c *config.Config) { c.Zinf.PipelineDepth = 3 }},
		{"min-buffers", func(c *config.Config) {
			// One layer's params (weight + bias) must be resident together:
			// 2 is the smallest param buffer count that can work; 1 for the
			// optimizer. Exhaustion waits.
			c.ZeroOptimization.OffloadParam.BufferCount = 2
			c.ZeroOptimization.OffloadOptimizer.BufferCount = 1
			c.Zinf.PipelineDepth = 3
		}},
		{"two-paths-striped", func(c *config.Config) { c.Zinf.NVMePaths = []string{t.TempDir(), t.TempDir()} }},
		{"checksums-off", func(c *config.Config) { c.Zinf.Checksums = false }},
		{"checksums-on", func(c *config.Config) { c.Zinf.Checksums = true }},
		{"bf16", func(c *config.Config) { c.BF16 = true }},
		{"fp16", func(c *config.Config) { c.FP16 = true }},
		{"world4", func(c *config.Config) { c.Zinf.WorldSize = 4 }},
		{"world4-bf16-striped", func(c *config.Config) {
			c.Zinf.WorldSize = 4
			c.BF16 = true
			c.Zinf.NVMePaths = []string{t.TempDir(), t.TempDir()}
		}},
		{"params-cpu-optimizer-nvme", func(c *config.Config) { c.ZeroOptimization.OffloadParam.Device = config.OffloadCPU }},
		// The training step: clipping that triggers, speculation forced on
		// and off, fp16 overflows skipped, schedules, at world 1 and 4.
		{"clip-speculate-always", func(c *config.Config) { c.GradientClipping = 0.01; c.Zinf.Speculate = config.SpeculateAlways }},
		{"clip-speculate-never-warmup", func(c *config.Config) {
			c.GradientClipping = 0.01
			c.Zinf.Speculate = config.SpeculateNever
			c.Scheduler.Type, c.Scheduler.WarmupNumSteps, c.Scheduler.WarmupMaxLR = config.SchedulerWarmupLR, 3, 0.01
		}},
		{"fp16-overflow-world4-onecycle", func(c *config.Config) {
			c.Zinf.WorldSize = 4
			c.FP16 = true
			c.LossScaling.InitialScalePower, c.LossScaling.Hysteresis = 22, 1 // overflows until the scale comes down
			c.GradientClipping = 0.05
			c.Scheduler.Type, c.Scheduler.CycleMinLR, c.Scheduler.CycleMaxLR = config.SchedulerOneCycle, 1e-4, 1e-2
			c.Scheduler.CycleFirstStepSize, c.Scheduler.CycleSecondStepSize = 2, 2
		}},
		// More optimizers, their states swapped like Adam's.
		{"sgd-nesterov-clip", func(c *config.Config) {
			c.Optimizer.Type, c.Optimizer.LR, c.Optimizer.Momentum, c.Optimizer.Nesterov, c.Optimizer.WeightDecay = config.OptimizerSGD, 0.05, 0.9, true, 0.01
			c.GradientClipping = 0.01
		}},
		{"sgd-plain-world4", func(c *config.Config) {
			c.Zinf.WorldSize = 4
			c.Optimizer.Type, c.Optimizer.LR = config.OptimizerSGD, 0.05
		}},
		{"adagrad-world4-fp16", func(c *config.Config) {
			c.Zinf.WorldSize = 4
			c.FP16 = true
			c.Optimizer.Type, c.Optimizer.LR, c.Optimizer.LRDecay, c.Optimizer.InitialAccumulatorValue = config.OptimizerAdagrad, 0.01, 0.1, 0.1
		}},
		{"lion-onecycle-optimizer-cpu", func(c *config.Config) {
			c.Optimizer.Type, c.Optimizer.LR, c.Optimizer.Betas, c.Optimizer.WeightDecay = config.OptimizerLion, 1e-3, [2]float64{0.9, 0.99}, 0.1
			c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
			c.Scheduler.Type, c.Scheduler.CycleMinLR, c.Scheduler.CycleMaxLR = config.SchedulerOneCycle, 1e-4, 1e-3
			c.Scheduler.CycleFirstStepSize, c.Scheduler.CycleSecondStepSize, c.Scheduler.CycleMomentum = 2, 2, true
			c.Scheduler.CycleMinMom, c.Scheduler.CycleMaxMom = 0.85, 0.95
		}},
		{"bf16-clip-world4-cosine", func(c *config.Config) {
			c.Zinf.WorldSize = 4
			c.BF16 = true
			c.GradientClipping = 0.02
			c.Scheduler.Type, c.Scheduler.TotalNumSteps, c.Scheduler.WarmupNumSteps = config.SchedulerWarmupCosineLR, 4, 2
		}},
		{"max-in-cpu-cache", func(c *config.Config) { c.ZeroOptimization.OffloadParam.MaxInCPU = 2 * 48 * 48 }},
		{"optimizer-cpu", func(c *config.Config) { c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU }},
		// aio.use_gds: params swapped into (simulated) device memory through
		// the bounce path, since there is no cuFile here.
		{"use-gds-device-swap", func(c *config.Config) { c.AIO.UseGDS = true; c.Zinf.GDS = config.GDSAuto }},
	}
	for _, b := range aio.Backends {
		b := b
		cases = append(cases, tc{"backend-" + b, func(c *config.Config) { c.Zinf.Backend = config.Backend(b) }})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t, c.mutate)
			steps := 3
			if cfg.FP16 || cfg.GradientClipping > 0 {
				steps = 6
			}
			res, err := Run(context.Background(), Options{Config: cfg, Spec: smallSpec, Steps: steps, Verify: true, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			if res.BitwiseEqual == nil || !*res.BitwiseEqual {
				t.Fatalf("offloaded training differs from in-memory training: %s", res.Mismatch)
			}
			if strings.HasPrefix(c.name, "clip") && res.ClippedSteps == 0 {
				t.Fatalf("clipping never triggered: %+v", res.PerStep)
			}
			if strings.HasPrefix(c.name, "fp16-overflow") && (res.SkippedSteps == 0 || res.AppliedSteps == 0) {
				t.Fatalf("want skipped and applied steps: %+v", res.PerStep)
			}
			if cfg.ZeroOptimization.OffloadOptimizer.Device == config.OffloadNVMe && (res.BytesRead == 0 || res.BytesWritten == 0) {
				t.Fatalf("nothing moved through NVMe: read %d, written %d", res.BytesRead, res.BytesWritten)
			}
		})
	}
}

// TestReferenceDetectsDifference makes sure the comparison can fail: a
// run with different hyperparameters must not compare equal.
func TestReferenceDetectsDifference(t *testing.T) {
	cfg := testConfig(t, nil)
	spec := smallSpec
	spec.DType = 0
	rts, be := setup(t, cfg, spec)
	_ = rts
	if err := runLoop(context.Background(), spec, be, loopOptions{Steps: 2, Micro: 1, World: 1}); err != nil {
		t.Fatal(err)
	}
	other := *cfg
	other.Optimizer.LR *= 1.0001
	ref := mustMem(t, spec, &other)
	if err := runLoop(context.Background(), spec, ref, loopOptions{Steps: 2, Micro: 1, World: 1}); err != nil {
		t.Fatal(err)
	}
	eq, why, err := compare(context.Background(), spec, be, ref)
	if err != nil || eq || why == "" {
		t.Fatalf("a different learning rate compared equal (err %v)", err)
	}
}

// mustMem is newMemBackend for a test (or benchmark).
func mustMem(t testing.TB, spec Spec, cfg *config.Config) *memBackend {
	t.Helper()
	ref, err := newMemBackend(spec, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// setup opens one runtime per rank and the offloaded backend.
func setup(t *testing.T, cfg *config.Config, spec Spec, opts ...zinf.Options) ([]*zinf.Runtime, *zinfBackend) {
	t.Helper()
	_, world := cfg.RankWorld()
	var rts []*zinf.Runtime
	comms, err := comm.NewLocal(world, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < world; r++ {
		o := zinf.Options{Logger: quiet, Rank: r, WorldSize: world, Comm: comms[r]}
		if len(opts) > 0 {
			o.Faults = opts[0].Faults
		}
		rt, err := zinf.Open(cfg, spec.Model(), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		rts = append(rts, rt)
	}
	be, err := newZinfBackend(context.Background(), spec, rts)
	if err != nil {
		t.Fatal(err)
	}
	return rts, be
}

// statesSnapshot is snapshot's optimizer states only.
func statesSnapshot(t *testing.T, spec Spec, be *zinfBackend) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for _, n := range spec.ParamNames() {
		for r, rt := range be.rts {
			m, a, s, err := rt.ReadOptimizerState(context.Background(), n)
			if err != nil {
				t.Fatal(err)
			}
			out[fmt.Sprintf("%d/%s.master", r, n)] = m
			out[fmt.Sprintf("%d/%s.exp_avg", r, n)] = a
			out[fmt.Sprintf("%d/%s.exp_avg_sq", r, n)] = s
		}
	}
	return out
}

// snapshot reads every parameter's compute values and every rank's
// optimizer state.
func snapshot(t *testing.T, spec Spec, be *zinfBackend) map[string][]float32 {
	t.Helper()
	ctx := context.Background()
	out := statesSnapshot(t, spec, be)
	if err := be.readAll(ctx, func(n string, v []float32) error { out[n] = append([]float32(nil), v...); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(a, b map[string][]float32) string {
	for k, v := range a {
		w := b[k]
		if len(v) != len(w) {
			return k
		}
		for i := range v {
			if math.Float32bits(v[i]) != math.Float32bits(w[i]) {
				return fmt.Sprintf("%s[%d]", k, i)
			}
		}
	}
	return ""
}

// TestENOSPCDuringStep injects ENOSPC into the optimizer's and the params'
// swap-outs during a step: the step returns the error, weights and states
// are unchanged, and after space returns the run goes on and still equals
// in-memory training bit for bit.
func TestENOSPCDuringStep(t *testing.T) {
	for _, tc := range []struct {
		target  string
		overlap bool
		clip    bool
		// update: zinf.overlap_update, the update of the step that fails
		// running on under the next step's forward.
		update bool
	}{{"/zinf-optim-", false, false, false}, {"/zinf-param-", false, false, false}, {"/zinf-grad-", false, false, false}, {"/zinf-optim-", true, false, false},
		{"/zinf-param-", true, false, false}, {"/zinf-grad-", true, false, false}, {"/zinf-optim-", true, true, false}, {"/zinf-grad-", true, true, false},
		{"/zinf-optim-", true, false, true}, {"/zinf-param-", true, true, true}, {"/zinf-grad-", true, false, true}} {
		target := tc.target
		t.Run(fmt.Sprintf("%s/overlap=%v/clip=%v/update=%v", strings.Trim(target, "/-"), tc.overlap, tc.clip, tc.update), func(t *testing.T) {
			cfg := testConfig(t, func(c *config.Config) {
				c.Zinf.WorldSize = 2
				c.Zinf.PipelineDepth = 2
				c.Zinf.OverlapUpdate = tc.update
				if target == "/zinf-grad-" {
					c.Zinf.PinnedGrads = config.PinnedGradsOff // a fault in the gradients' NVMe round trip
				}
				if tc.clip {
					// Speculative steps during the fault, some rolled back.
					c.GradientClipping = 0.02
					c.Zinf.Speculate = config.SpeculateAlways
				}
			})
			spec := smallSpec
			inj := faults.New(3)
			_, be := setup(t, cfg, spec, zinf.Options{Faults: inj})
			const steps, faultAt = 4, 2
			var before map[string][]float32
			failures, updateFailures := 0, 0
			err := runLoop(context.Background(), spec, be, loopOptions{Steps: steps, Micro: 2, World: 2, OverlapStep: tc.overlap,
				OnStep: func(step int, _ float32, _ time.Duration) error {
					if step == faultAt-1 {
						before = snapshot(t, spec, be)
						inj.Add(faults.Rule{Kind: faults.Writes, PathContains: target, Err: syscall.ENOSPC})
					}
					return nil
				},
				OnStepError: func(step int, err error) bool {
					failures++
					t.Logf("step %d: %v", step, err)
					if step != faultAt || !errors.Is(err, aio.ErrNoSpace) {
						t.Errorf("step %d failed with %v; want ENOSPC at step %d", step, err, faultAt)
						return false
					}
					if !strings.Contains(err.Error(), "layer") {
						t.Errorf("error does not name the tensor: %v", err)
					}
					// At the first failure no rank has stepped yet. (A later
					// failure may come from a rank whose step was already
					// running when space returned, after other ranks
					// committed on the retry.)
					if failures == 1 {
						now := map[string][]float32(nil)
						if errors.Is(err, zinf.ErrUpdateFailed) {
							// The step failed after Step returned: the
							// parameters are readable again once it is
							// retried; its states are the last commit's now.
							now = statesSnapshot(t, spec, be)
							updateFailures++
						} else {
							now = snapshot(t, spec, be)
						}
						if d := sameSnapshot(now, before); d != "" {
							t.Errorf("state changed by the failed step at %s", d)
						}
					}
					inj.Clear() // space returns
					return failures < 100
				}})
			if err != nil {
				t.Fatal(err)
			}
			// Every failed swap-out is reported once (a gradient write-behind
			// per tensor and rank), so there is at least one failure.
			if failures == 0 || inj.Hits() == 0 {
				t.Fatalf("no failure surfaced (fault hits %d)", inj.Hits())
			}
			if tc.update && target != "/zinf-grad-" && updateFailures == 0 {
				t.Fatalf("overlap_update: no step failed after Step returned (%d failures)", failures)
			}
			if !tc.update && updateFailures != 0 {
				t.Fatalf("ErrUpdateFailed without zinf.overlap_update")
			}
			ref := mustMem(t, spec, cfg)
			if err := runLoop(context.Background(), spec, ref, loopOptions{Steps: steps, Micro: 2, World: 2}); err != nil {
				t.Fatal(err)
			}
			if eq, why, err := compare(context.Background(), spec, be, ref); err != nil || !eq {
				t.Fatalf("after recovery: equal=%v %s %v", eq, why, err)
			}
		})
	}
}

// TestEIOOnSwapInNamesTensor: a read error on a parameter's swap-in
// surfaces from the layer barrier with the tensor's name.
func TestEIOOnSwapInNamesTensor(t *testing.T) {
	cfg := testConfig(t, nil)
	inj := faults.New(5)
	_, be := setup(t, cfg, smallSpec, zinf.Options{Faults: inj})
	err := runLoop(context.Background(), smallSpec, be, loopOptions{Steps: 3, Micro: 1, World: 1,
		OnStep: func(step int, _ float32, _ time.Duration) error {
			inj.Add(faults.Rule{Kind: faults.Reads, PathContains: "/zinf-param-", Err: syscall.EIO})
			return nil
		}})
	if !errors.Is(err, aio.ErrIO) || !strings.Contains(err.Error(), `tensor "layer0`) {
		t.Fatalf("want EIO naming a layer tensor, got %v", err)
	}
}

// TestCorruptExtentCaught flips one byte of a parameter's swap extent on
// disk: the next swap-in fails its checksum and names the tensor.
func TestCorruptExtentCaught(t *testing.T) {
	cfg := testConfig(t, func(c *config.Config) { c.Zinf.Checksums = true })
	rts, be := setup(t, cfg, smallSpec)
	err := runLoop(context.Background(), smallSpec, be, loopOptions{Steps: 2, Micro: 1, World: 1,
		OnStep: func(step int, _ float32, _ time.Duration) error {
			if step == 0 {
				st := rts[0].ParamStore
				path, off, err := st.Locate(rts[0].Params.StoreKey(WeightName(1)), 100)
				if err != nil {
					return err
				}
				flipByte(t, path, off)
			}
			return nil
		}})
	if !errors.Is(err, swapper.ErrChecksum) || !strings.Contains(err.Error(), WeightName(1)) {
		t.Fatalf("want a checksum error naming %s, got %v", WeightName(1), err)
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestStatesLargerThanPinnedBudget trains a model whose states are more
// than 4x the pinned pool, to completion and bit-exact.
func TestStatesLargerThanPinnedBudget(t *testing.T) {
	spec := Spec{Layers: 8, Width: 768, Batch: 2, Seed: 3}
	cfg := testConfig(t, func(c *config.Config) {
		c.Zinf.Tiers.CPUPinnedBytes = 20 << 20
		c.ZeroOptimization.SubGroupSize = 64 << 10
		c.ZeroOptimization.OffloadParam.BufferSize = 768 * 768
		c.GradientAccumulationSteps = 1
	})
	if st := spec.StateBytes(); st < 4*int64(cfg.Zinf.Tiers.CPUPinnedBytes) {
		t.Fatalf("test model too small: %d bytes of state for a %d-byte pool", st, cfg.Zinf.Tiers.CPUPinnedBytes)
	}
	res, err := Run(context.Background(), Options{Config: cfg, Spec: spec, Steps: 2, Verify: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if !*res.BitwiseEqual {
		t.Fatal(res.Mismatch)
	}
	t.Logf("state %d bytes, pinned %d bytes, peak RSS %d bytes", res.StateBytes, res.PinnedBytes, res.PeakRSSBytes)
}

// TestStepNumbersAgree: an error line names one step number, the one the
// progress lines count (from 1): the loop's own prefix and the
// optimizer's error used to disagree ("step 19: ... optimizer: step 20").
func TestStepNumbersAgree(t *testing.T) {
	stepRE := regexp.MustCompile(`(?:^|[^-\w])step (\d+)`)
	for _, target := range []string{"/zinf-optim-", "/zinf-grad-", "/zinf-param-"} {
		t.Run(strings.Trim(target, "/-"), func(t *testing.T) {
			cfg := testConfig(t, nil)
			if target == "/zinf-grad-" {
				cfg.Zinf.PinnedGrads = config.PinnedGradsOff // a fault in the gradients' NVMe round trip
			}
			inj := faults.New(7)
			_, be := setup(t, cfg, smallSpec, zinf.Options{Faults: inj})
			const faultAt = 3 // counted from 1
			err := runLoop(context.Background(), smallSpec, be, loopOptions{Steps: 5, Micro: 2, World: 1,
				OnStep: func(step int, _ float32, _ time.Duration) error {
					if step+1 == faultAt-1 {
						inj.Add(faults.Rule{Kind: faults.Writes, PathContains: target, Err: syscall.ENOSPC})
					}
					return nil
				}})
			if !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("want ENOSPC, got %v", err)
			}
			ms := stepRE.FindAllStringSubmatch(err.Error(), -1)
			if len(ms) == 0 {
				t.Fatalf("the error names no step: %v", err)
			}
			for _, m := range ms {
				if m[1] != strconv.Itoa(faultAt) {
					t.Fatalf("the error names step %s, want %d throughout: %v", m[1], faultAt, err)
				}
			}
		})
	}
}

// TestSchedulesSameState trains the example model layer-major — with its
// activations in memory, in pinned memory and on NVMe (zinf.activations)
// — and micro-batch-major (k = 3 micro-batches, two ranks, fp16 with
// clipping, the step overlapping backward) with Verify: every run equals
// in-memory micro-batch-major training bit for bit and gives one
// StateSHA256, and layer-major moves fewer NVMe bytes per step.
func TestSchedulesSameState(t *testing.T) {
	type run struct {
		sched config.ScheduleMode
		acts  config.ActivationsDevice
	}
	var res []*Result
	for _, c := range []run{{config.ScheduleMicroBatchMajor, ""}, {config.ScheduleLayerMajor, config.ActivationsMemory},
		{config.ScheduleLayerMajor, config.ActivationsCPU}, {config.ScheduleLayerMajor, config.ActivationsNVMe}} {
		cfg := testConfig(t, func(cf *config.Config) {
			cf.GradientAccumulationSteps, cf.Zinf.WorldSize, cf.Zinf.Schedule = 3, 2, c.sched
			cf.FP16, cf.GradientClipping = true, 0.5
			if c.acts != "" {
				cf.Zinf.Activations.Device = c.acts
			}
		})
		r, err := Run(context.Background(), Options{Config: cfg, Spec: smallSpec, Steps: 3, Verify: true, Logger: quiet})
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if r.Schedule != string(c.sched) || r.BitwiseEqual == nil || !*r.BitwiseEqual {
			t.Fatalf("%+v: schedule %s, bit for bit %v (%s)", c, r.Schedule, r.BitwiseEqual, r.Mismatch)
		}
		if c.acts != "" {
			a := r.Activations
			ok := a != nil && a.Device == string(c.acts)
			switch c.acts {
			case config.ActivationsMemory:
				ok = ok && a.PeakMemoryBytes > 0 && a.PeakPinnedBytes == 0
			case config.ActivationsCPU:
				ok = ok && a.PeakPinnedBytes > 0 && a.PeakMemoryBytes == 0
			case config.ActivationsNVMe:
				ok = ok && a.PeakNVMeBytes > 0 && a.BytesWritten > 0
			}
			if !ok {
				t.Errorf("%+v: activations %+v", c, a)
			}
		}
		res = append(res, r)
	}
	for _, r := range res[1:] {
		if r.StateSHA256 != res[0].StateSHA256 {
			t.Errorf("state sha256: %s, micro-batch-major %s", r.StateSHA256, res[0].StateSHA256)
		}
		if lm, mb := r.StepReadBytes[2], res[0].StepReadBytes[2]; lm >= mb {
			t.Errorf("NVMe bytes read in step 3: layer-major %d, micro-batch-major %d", lm, mb)
		}
	}
}

// TestDeviceBytesAndDigest: a run counts what its stores moved on the
// devices (padded, at least the logical bytes) and, apart, what the state
// digest read back after the last step — every parameter, master weight
// and Adam moment, 16 bytes per fp32 parameter; NoStateDigest skips that
// read and the digest.
func TestDeviceBytesAndDigest(t *testing.T) {
	var params int64
	for _, d := range smallSpec.Model().Tensors {
		n := int64(1)
		for _, s := range d.Shape {
			n *= int64(s)
		}
		params += n
	}
	for _, skip := range []bool{false, true} {
		cfg := testConfig(t, nil)
		r, err := Run(context.Background(), Options{Config: cfg, Spec: smallSpec, Steps: 2, NoStateDigest: skip, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if r.DeviceReadBytes < r.BytesRead || r.DeviceWrittenBytes < r.BytesWritten || r.DeviceReadBytes == 0 {
			t.Errorf("device bytes read %d, written %d; logical %d, %d", r.DeviceReadBytes, r.DeviceWrittenBytes, r.BytesRead, r.BytesWritten)
		}
		if skip {
			if r.StateSHA256 != "" || r.DigestReadBytes != 0 {
				t.Errorf("NoStateDigest: digest %q, %d bytes read for it", r.StateSHA256, r.DigestReadBytes)
			}
			continue
		}
		if r.StateSHA256 == "" || r.DigestReadBytes < 16*params {
			t.Errorf("digest %q read %d bytes; the state holds %d fp32 parameters (16 bytes each to read)", r.StateSHA256, r.DigestReadBytes, params)
		}
	}
}
