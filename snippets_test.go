package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/metrics"
	"github.com/zinfio/zinf/tensor"
)

// The functions in this file are the Go code README.md and docs/*.md show,
// line for line: docs/snippets_test.go compares each fenced block with the
// function its marker names, and the tests below run them.

// ownLoop is README.md's "Your own loop" and docs/loop.md's first loop.
func ownLoop(ctx context.Context, configFile string, steps int) error {
	cfg, err := config.Load(configFile) // DeepSpeed's ds_config.json, plus a zinf section
	if err != nil {
		return err
	}
	model := zinf.LayeredModel( // the tensors of each layer, in forward order
		[]tensor.Desc{{Name: "l0.w", Shape: []int{256, 256}}},
		[]tensor.Desc{{Name: "l1.w", Shape: []int{256, 256}}},
	)
	rt, err := zinf.Open(cfg, model, zinf.Options{}) // plans where each tensor lives, sizes the pinned pool
	if err != nil {
		return err // a *zinf.PoolTooSmallError names the minimum pool
	}
	defer rt.Close()
	w, g := make([]float32, 256*256), make([]float32, 256*256)
	for _, d := range model.Tensors {
		if err := rt.Init(ctx, d.Name, w); err != nil { // the initial values, fp32
			return err
		}
	}
	for range steps {
		rt.Forward()
		for l := range rt.Layers() {
			if err := rt.BeginLayer(ctx, l); err != nil { // waits for layer l, prefetches the next ones
				return err
			}
			if err := rt.ReadParam(ctx, rt.LayerTensors(l)[0], w); err != nil { // into your buffer
				return err
			}
			// ... layer l's forward with w ...
			rt.EndLayer(l) // released, no write-back
		}
		rt.Backward()
		for l := rt.Layers() - 1; l >= 0; l-- {
			if err := rt.BeginLayer(ctx, l); err != nil {
				return err
			}
			// ... layer l's backward (ReadParam as above): its gradient into g ...
			if err := rt.AccumulateGrad(ctx, rt.LayerTensors(l)[0], g); err != nil { // written behind
				return err
			}
			if err := rt.StepLayer(ctx, l); err != nil { // the layer's update starts during backward
				return err
			}
			rt.EndLayer(l)
		}
		if err := rt.Step(ctx); err != nil { // all or nothing: on a full disk nothing changed
			return err
		}
	}
	return nil
}

// layerMajorStep is docs/loop.md's step in the layer-major order.
func layerMajorStep(ctx context.Context, rt *zinf.Runtime, g []float32) error {
	k := rt.MicroBatches() // gradient_accumulation_steps
	rt.Forward()
	for l := range rt.Layers() {
		if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil { // layer l serves k micro-batches
			return err
		}
		// ... read the parameters; forward micro-batches 0..k-1 through layer l, keep their activations ...
		rt.EndLayer(l)
	}
	rt.Backward()
	for l := rt.Layers() - 1; l >= 0; l-- {
		if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil {
			return err
		}
		for range k {
			// ... the next micro-batch's backward through layer l: its gradient into g ...
			if err := rt.AccumulateGrad(ctx, rt.LayerTensors(l)[0], g); err != nil { // summed in pinned memory
				return err
			}
		}
		if err := rt.StepLayer(ctx, l); err != nil {
			return err
		}
		rt.EndLayer(l)
	}
	return rt.Step(ctx)
}

// trainWithCheckpoints is docs/loop.md's checkpointed loop.
func trainWithCheckpoints(ctx context.Context, root string, rts []*zinf.Runtime, total int64, step func(context.Context) error) error {
	ck, err := zinf.OpenCheckpointer(root, zinf.CheckpointerOptions{Every: 100, KeepLast: 3})
	if err != nil {
		return err
	}
	// After a crash, before training: load the newest committed checkpoint (any world size).
	_, meta, err := zinf.ResumeLatest(ctx, root, rts)
	if err != nil && !errors.Is(err, checkpoint.ErrNoCheckpoint) { // none yet: start fresh
		ck.Close()
		return err
	}
	for s := meta.Step; s < total; s++ {
		if err := step(ctx); err != nil { // one step on every rank
			ck.Close()
			return err
		}
		if ck.Due(s + 1) {
			if err := ck.Save(ctx, rts, zinf.CheckpointMeta{Step: s + 1}); err != nil { // root/step-000100, ...
				ck.Close()
				return err
			}
		}
	}
	return ck.Close() // waits for an asynchronous save; before closing the runtimes
}

// registerMetrics is docs/tools.md's Prometheus collector.
func registerMetrics(reg *prometheus.Registry, rts []*zinf.Runtime) *metrics.Collector {
	c := metrics.New(rts...) // github.com/zinfio/zinf/metrics
	reg.MustRegister(c)      // or prometheus.MustRegister(c); c.Set() before closing the runtimes
	return c
}

// rankStep is docs/ranks.md's rank as a process: run under mpirun, built
// with -tags mpi (without it comm.NewMPI returns comm.ErrNoMPI).
func rankStep(ctx context.Context, cfg *config.Config, model zinf.Model, w, myGradW []float32) error {
	c, err := comm.NewMPI(comm.MPIOptions{}) // under mpirun
	if err != nil {
		return err
	}
	defer c.Close() // collective; after a failure it lingers for the others
	rt, err := zinf.Open(cfg, model, zinf.Options{Rank: c.Rank(), WorldSize: c.Size(), Comm: c, GatherLayers: true})
	if err != nil {
		return err
	}
	defer rt.Close()
	rt.Forward()
	if err := rt.BeginLayer(ctx, 0); err != nil { // every rank, the same layers in the same order
		return err
	}
	if err := rt.ReadParam(ctx, "l0.w", w); err != nil { // the FULL tensor, gathered
		return err
	}
	rt.EndLayer(0)
	rt.Backward()
	if err := rt.ReduceGrad(ctx, "l0.w", myGradW, 1/float32(c.Size())); err != nil { // summed over ranks in rank order
		return err
	}
	if err := rt.Step(ctx); err != nil {
		return err
	}
	_, err = zinf.SaveCheckpointShared(ctx, "/shared/ckpt/step-000001", rt, zinf.CheckpointMeta{Step: 1}, checkpoint.SaveOptions{})
	return err
}

// snippetConfig is a small config with every tensor on NVMe under dir.
func snippetConfig(dir string) *config.Config {
	cfg := config.Default()
	cfg.SetScratchDir(dir)
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	return cfg
}

// TestDocsSnippets runs the documents' loops: README's own loop for two
// steps, the layer-major step at k = 2 and the checkpointed loop, which
// saves at its third step and resumes there.
func TestDocsSnippets(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "ds_config.json")
	js := fmt.Sprintf(`{"zero_optimization": {"stage": 3,
  "offload_param": {"device": "nvme", "nvme_path": %q, "max_in_cpu": 0},
  "offload_optimizer": {"device": "nvme", "nvme_path": %q}},
 "zinf": {"tiers": {"cpu_pinned_bytes": "32MiB"}, "bandwidth": {"probe": false}}}`, dir, dir)
	if err := os.WriteFile(cfgFile, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ownLoop(ctx, cfgFile, 2); err != nil {
		t.Fatalf("ownLoop: %v", err)
	}

	cfg := snippetConfig(t.TempDir())
	cfg.GradientAccumulationSteps = 2
	cfg.Zinf.Schedule = config.ScheduleLayerMajor
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "a", Shape: []int{64}}},
		[]tensor.Desc{{Name: "b", Shape: []int{64}}},
	)
	rt, err := zinf.Open(cfg, model, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	g := make([]float32, 64)
	for _, d := range model.Tensors {
		if err := rt.Init(ctx, d.Name, g); err != nil {
			t.Fatal(err)
		}
	}
	for i := range g {
		g[i] = 0.5
	}
	if err := layerMajorStep(ctx, rt, g); err != nil {
		t.Fatalf("layerMajorStep: %v", err)
	}
	if got := rt.Metrics().Steps; got != 1 {
		t.Fatalf("layer-major: %d steps done, want 1", got)
	}

	// The checkpointed loop: 3 steps with Every 100 save nothing; the
	// checkpointer is then driven to save one, and a second run resumes
	// from it without stepping again.
	root := filepath.Join(t.TempDir(), "ckpt")
	rts := []*zinf.Runtime{rt}
	steps := 0
	step := func(ctx context.Context) error { steps++; return layerMajorStep(ctx, rt, g) }
	if err := trainWithCheckpoints(ctx, root, rts, 100, step); err != nil {
		t.Fatalf("trainWithCheckpoints: %v", err)
	}
	if steps != 100 {
		t.Fatalf("%d steps, want 100", steps)
	}
	if _, err := os.Stat(filepath.Join(root, zinf.CheckpointName(100))); err != nil {
		t.Fatalf("no checkpoint after 100 steps: %v", err)
	}
	steps = 0
	if err := trainWithCheckpoints(ctx, root, rts, 100, step); err != nil || steps != 0 {
		t.Fatalf("resumed at the end: %d steps, %v", steps, err)
	}

	c := registerMetrics(prometheus.NewRegistry(), rts)
	c.Set()
}
