package train

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
)

func TestSampleIndices(t *testing.T) {
	if got := sampleIndices(10); len(got) != 10 || got[9] != 9 {
		t.Fatalf("10 elements: %v", got)
	}
	for _, n := range []int{maxSampled, maxSampled + 1, 1 << 20, 2048*2048 + 7} {
		got := sampleIndices(n)
		if len(got) > maxSampled || got[0] != 0 || got[len(got)-1] != n-1 {
			t.Fatalf("%d elements: %d picked, first %d, last %d", n, len(got), got[0], got[len(got)-1])
		}
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				t.Fatalf("%d elements: indices not increasing at %d", n, i)
			}
		}
	}
}

// TestSampleCheck runs the sampled check (Options.Sample on every tensor)
// beside the full in-memory comparison (Verify) over settings that change
// the update — world size 2 and two micro-steps, clipping that triggers,
// bf16 params, Lion — and checks it compared every sampled element of
// every update and every read: the whole tensor here, each small enough.
func TestSampleCheck(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(c *config.Config)
	}{
		{"adam-world2", func(c *config.Config) { c.Zinf.WorldSize = 2 }},
		{"clipping", func(c *config.Config) { c.GradientClipping = 1e-3 }},
		{"bf16", func(c *config.Config) { c.BF16 = true }},
		{"lion", func(c *config.Config) { c.Optimizer.Type, c.Optimizer.LR = config.OptimizerLion, 1e-4 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, c.mutate)
			spec := smallSpec
			const steps = 3
			res, err := Run(context.Background(), Options{Config: cfg, Spec: spec, Steps: steps, Verify: true, Sample: spec.ParamNames(), Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			if res.BitwiseEqual == nil || !*res.BitwiseEqual {
				t.Fatalf("not bit for bit: %s", res.Mismatch)
			}
			micro := int64(cfg.GradientAccumulationSteps)
			w, b := int64(spec.Width*spec.Width), int64(spec.Width)
			L := int64(spec.Layers)
			// Per step: every element updated once; weights read in
			// forward and backward, biases in forward, per micro-step
			// micro-batch-major, once per step layer-major.
			passes := micro
			if res.Schedule == string(zinf.LayerMajor) {
				passes = 1
			}
			want := steps * (L*(w+b) + passes*L*(2*w+b))
			if res.SampleChecked != want {
				t.Fatalf("%d element checks, want %d", res.SampleChecked, want)
			}
		})
	}
}

// TestSampleCheckCatches: the sampled check fails a step the runtimes took
// with other parameters than it is told, and a read that is not the
// committed weight.
func TestSampleCheckCatches(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t, func(c *config.Config) { c.GradientAccumulationSteps = 1 })
	spec := smallSpec
	rts, be := setup(t, cfg, spec)
	s, err := newSampler(ctx, spec, rts, plan.Hyper(cfg), 0, []string{WeightName(1), BiasName(2), "nope"})
	if err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("an unknown tensor: %v", err)
	}
	s, err = newSampler(ctx, spec, rts, plan.Hyper(cfg), 0, []string{WeightName(1), BiasName(2)})
	if err != nil {
		t.Fatal(err)
	}
	be.sample = s
	err = runLoop(ctx, spec, be, loopOptions{Steps: 1, Micro: 1, World: 1, OnStep: func(int, float32, time.Duration) error {
		info := be.infos[len(be.infos)-1]
		info.LR *= 2
		return s.stepped(ctx, info)
	}})
	if err == nil || !strings.Contains(err.Error(), "sampled check: step 1") {
		t.Fatalf("a step checked with twice its learning rate: %v", err)
	}
	s.tensors[WeightName(1)].master[3] += 1
	v := make([]float32, spec.Numel(WeightName(1)))
	if err := be.beginLayer(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	defer be.endLayer(1)
	if err := be.gather(ctx, WeightName(1), v); err == nil || !strings.Contains(err.Error(), "element 3 reads") {
		t.Fatalf("a read that is not the committed weight: %v", err)
	}
}
