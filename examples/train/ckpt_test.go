package train

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/swapper"
)

// ckptConfig is testConfig with a world size and a dtype.
func ckptConfig(t *testing.T, world int, dt swapper.DType) *config.Config {
	return testConfig(t, func(c *config.Config) {
		c.Zinf.WorldSize = world
		c.BF16 = dt == swapper.BFloat16
		c.FP16 = dt == swapper.Float16
		// A dynamic loss scale that moves every step: a resume must restore
		// it (the checkpoint's training state).
		c.LossScaling.LossScaleWindow, c.LossScaling.InitialScalePower = 1, 10
	})
}

// TestResumeBitForBit trains N steps, checkpoints, trains M more; and,
// from fresh runtimes with their own swap directories (of another world
// size in some cases), loads the checkpoint and trains the same M steps.
// Both must equal, bit for bit, in-memory training of N+M steps without
// interruption: compute weights, fp32 master, exp_avg and exp_avg_sq.
//
// The data-parallel degree of the loop (how many ranks' micro-batches make
// a step's gradient) stays the checkpointed run's: a job resumed on fewer
// or more ranks keeps its global batch, so only the partitioning of every
// tensor changes, which must not change a bit.
func TestResumeBitForBit(t *testing.T) {
	const n, m, micro = 2, 2, 2
	cases := []struct {
		name     string
		from, to int
		dt       swapper.DType
		async    bool
		opt      config.OptimizerType // default Adam
	}{
		{"world1", 1, 1, swapper.Float32, false, ""},
		{"world2-bf16-async", 2, 2, swapper.BFloat16, true, ""},
		{"world4-to-2", 4, 2, swapper.Float32, false, ""},
		{"world4-to-2-bf16-async", 4, 2, swapper.BFloat16, true, ""},
		{"world1-to-4-fp16", 1, 4, swapper.Float16, false, ""},
		{"world2-to-3", 2, 3, swapper.Float32, false, ""},
		// Other optimizers' states (one per element) save and load too.
		{"world2-to-1-sgd-momentum", 2, 1, swapper.Float32, false, config.OptimizerSGD},
		{"world1-to-2-adagrad-async", 1, 2, swapper.BFloat16, true, config.OptimizerAdagrad},
		{"world4-to-3-lion", 4, 3, swapper.Float32, false, config.OptimizerLion},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			spec := smallSpec
			spec.DType = c.dt
			withOpt := func(cfg *config.Config) *config.Config {
				if c.opt != "" {
					cfg.Optimizer.Type, cfg.Optimizer.LR = c.opt, 0.01
					cfg.Optimizer.Momentum = map[bool]float64{true: 0.9}[c.opt == config.OptimizerSGD]
					cfg.Optimizer.Betas = [2]float64{0.9, 0.99}
					cfg.Optimizer.Eps = 1e-10
				}
				return cfg
			}
			_, beA := setup(t, withOpt(ckptConfig(t, c.from, c.dt)), spec)
			if err := runLoop(ctx, spec, beA, loopOptions{Steps: n, Micro: micro, World: c.from}); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "step-000002")
			if c.async {
				s := checkpoint.NewSaver(checkpoint.SaverOptions{Logger: quiet})
				defer s.Close()
				h, err := beA.saveCheckpointAsync(ctx, s, dir, n, checkpoint.SaveOptions{Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				// Training goes on while the snapshot drains; the
				// checkpoint must still hold the state after step n.
				if err := runLoop(ctx, spec, beA, loopOptions{Start: n, Steps: m, Micro: micro, World: c.from}); err != nil {
					t.Fatal(err)
				}
				if _, err := h.Wait(); err != nil {
					t.Fatal(err)
				}
			} else {
				if _, err := beA.saveCheckpoint(ctx, dir, n, checkpoint.SaveOptions{Logger: quiet}); err != nil {
					t.Fatal(err)
				}
				if err := runLoop(ctx, spec, beA, loopOptions{Start: n, Steps: m, Micro: micro, World: c.from}); err != nil {
					t.Fatal(err)
				}
			}

			rtsB, beB := setup(t, withOpt(ckptConfig(t, c.to, c.dt)), spec)
			start, err := beB.loadCheckpoint(ctx, dir)
			if err != nil {
				t.Fatal(err)
			}
			if start != n {
				t.Fatalf("checkpoint step %d, want %d", start, n)
			}
			for _, rt := range rtsB {
				if got := rt.Optimizer.StepCount(); got != n {
					t.Fatalf("rank %d optimizer step count %d after loading, want %d", rt.Rank, got, n)
				}
			}
			if err := runLoop(ctx, spec, beB, loopOptions{Start: start, Steps: m, Micro: micro, World: c.from}); err != nil {
				t.Fatal(err)
			}

			ref := mustMem(t, spec, rtsB[0].Config)
			if err := runLoop(ctx, spec, ref, loopOptions{Steps: n + m, Micro: micro, World: c.from}); err != nil {
				t.Fatal(err)
			}
			for _, run := range []struct {
				what string
				be   *zinfBackend
			}{{"uninterrupted", beA}, {"resumed", beB}} {
				eq, why, err := compare(ctx, spec, run.be, ref)
				if err != nil {
					t.Fatal(err)
				}
				if !eq {
					t.Fatalf("%s run (world %d) differs from in-memory training of %d steps: %s", run.what, len(run.be.rts), n+m, why)
				}
			}
		})
	}
}

// TestResumeDiffersWithoutCheckpoint makes sure the resume comparison can
// fail: fresh runtimes that skip the load do not match.
func TestResumeDiffersWithoutCheckpoint(t *testing.T) {
	ctx := context.Background()
	spec := smallSpec
	_, be := setup(t, ckptConfig(t, 2, swapper.Float32), spec)
	if err := runLoop(ctx, spec, be, loopOptions{Start: 2, Steps: 2, Micro: 2, World: 2}); err != nil {
		t.Fatal(err)
	}
	ref := mustMem(t, spec, be.rts[0].Config)
	if err := runLoop(ctx, spec, ref, loopOptions{Steps: 4, Micro: 2, World: 2}); err != nil {
		t.Fatal(err)
	}
	if eq, _, err := compare(ctx, spec, be, ref); err != nil || eq {
		t.Fatalf("training without the checkpoint compared equal (err %v)", err)
	}
}

// savedCheckpoint trains smallSpec 2 steps on world ranks and saves it.
func savedCheckpoint(t *testing.T, world int) string {
	t.Helper()
	ctx := context.Background()
	_, be := setup(t, ckptConfig(t, world, swapper.Float32), smallSpec)
	if err := runLoop(ctx, smallSpec, be, loopOptions{Steps: 2, Micro: 1, World: world}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "step-000002")
	if _, err := be.saveCheckpoint(ctx, dir, 2, checkpoint.SaveOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLoadRefusesOtherModel: a checkpoint of another model (shapes,
// layers, dtype) is refused with an error naming the tensor, and the
// runtimes keep their values.
func TestLoadRefusesOtherModel(t *testing.T) {
	dir := savedCheckpoint(t, 2)
	cases := []struct {
		name   string
		spec   Spec
		dt     swapper.DType
		direct bool // zinf.LoadCheckpoint alone, without the example's exact shape check
		tensor string
		want   error
	}{
		{"wider", Spec{Layers: 3, Width: 40, Batch: 4, Seed: 7}, swapper.Float32, false, BiasName(0), checkpoint.ErrShape},
		{"wider-numel-check", Spec{Layers: 3, Width: 40, Batch: 4, Seed: 7}, swapper.Float32, true, WeightName(0), checkpoint.ErrShape},
		{"deeper", Spec{Layers: 4, Width: 48, Batch: 4, Seed: 7}, swapper.Float32, true, WeightName(3), checkpoint.ErrShape},
		{"shallower", Spec{Layers: 2, Width: 48, Batch: 4, Seed: 7}, swapper.Float32, true, BiasName(2), checkpoint.ErrShape},
		{"bf16-params", smallSpec, swapper.BFloat16, true, WeightName(0), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			spec := c.spec
			spec.DType = c.dt
			_, be := setup(t, ckptConfig(t, 2, c.dt), spec)
			before := snapshot(t, spec, be)
			var err error
			if c.direct {
				_, err = zinf.LoadCheckpoint(context.Background(), dir, be.rts)
			} else {
				_, err = be.loadCheckpoint(context.Background(), dir)
			}
			if err == nil {
				t.Fatal("a checkpoint of another model was loaded")
			}
			t.Log(err)
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("error does not wrap %v: %v", c.want, err)
			}
			if !strings.Contains(err.Error(), `"`+c.tensor+`"`) {
				t.Errorf("error does not name tensor %q: %v", c.tensor, err)
			}
			if d := sameSnapshot(before, snapshot(t, spec, be)); d != "" {
				t.Fatalf("a refused load changed %s", d)
			}
		})
	}
}

// TestLoadCorruptParamChangesNothing flips a byte of a saved parameter
// partition: the load fails naming it, and nothing was changed (the
// parameters are staged, and committed only once all were read).
func TestLoadCorruptParamChangesNothing(t *testing.T) {
	dir := savedCheckpoint(t, 2)
	r, err := checkpoint.OpenRank(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	ti, err := r.Tensor(WeightName(2))
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, filepath.Join(dir, "rank-00001", ti.File), ti.Offset+ti.Bytes/2)
	_, be := setup(t, ckptConfig(t, 3, swapper.Float32), smallSpec)
	before := snapshot(t, smallSpec, be)
	_, err = be.loadCheckpoint(context.Background(), dir)
	if !errors.Is(err, checkpoint.ErrCorrupt) || !strings.Contains(err.Error(), `"`+WeightName(2)+`"`) {
		t.Fatalf("want a checksum error naming %s, got %v", WeightName(2), err)
	}
	if d := sameSnapshot(before, snapshot(t, smallSpec, be)); d != "" {
		t.Fatalf("a failed load changed %s", d)
	}
}
