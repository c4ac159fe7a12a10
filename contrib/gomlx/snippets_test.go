package zgomlx_test

import (
	"context"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// The functions in this file are the Go code README.md and docs/gomlx.md
// show, line for line: docs/snippets_test.go in zinf's module compares
// each fenced block with the function its marker names, and the tests
// below run them.

// trainLM is README.md's "Train a language model".
func trainLM(ctx context.Context, configFile string, vocab int, batches iter.Seq2[*tensors.Tensor, *tensors.Tensor]) error {
	backend, err := compute.NewWithConfig(zgomlx.DefaultBackend) // GoMLX's pure-Go backend
	if err != nil {
		return err
	}
	defer backend.Finalize()
	store := model.NewStore()
	m := transformer.New(store.RootScope()).WithVocabSize(vocab).WithEmbedDim(32).WithNumLayers(4).
		WithNumHeads(4).WithHeadDim(8).WithRoPE(10000).WithFinalNormalization("rms")
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{}) // one zinf layer per block
	if err != nil {
		return err
	}
	cfg, err := config.Load(configFile) // DeepSpeed's ds_config.json: offload_param, offload_optimizer on nvme
	if err != nil {
		return err
	}
	tr, err := zgomlx.Create(ctx, backend, cfg, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, 2, 32))
	if err != nil { // Create initializes the model layer by layer, straight into zinf
		return err
	}
	defer tr.Close()
	for tokens, next := range batches { // [2, 32] int32 each: tokens, and the token after each
		if _, err := tr.Step(ctx, tokens, next); err != nil { // forward, backward, Adam on NVMe
			return err
		}
	}
	return nil
}

// trainBlocks is docs/gomlx.md's model as a chain of layers.
func trainBlocks(ctx context.Context, cfg *config.Config, block zgomlx.LayerFn, loss zgomlx.LossFn, x, labels *tensors.Tensor, steps int, dir string) error {
	backend, err := compute.NewWithConfig(zgomlx.DefaultBackend) // "go:ops_sequential"
	if err != nil {
		return err
	}
	defer backend.Finalize()
	net := zgomlx.Net{Loss: loss} // func(y, labels *graph.Node) *graph.Node
	for i := range 4 {            // one zinf layer per block
		net.Layers = append(net.Layers, zgomlx.Layer{Scope: fmt.Sprintf("/block_%d", i), Fn: block})
	}
	tr, err := zgomlx.Create(ctx, backend, cfg, model.NewStore(), net, zgomlx.Options{}, x.Shape())
	if err != nil {
		return err
	}
	defer tr.Close()
	for range steps {
		if _, err := tr.Step(ctx, x, labels); err != nil { // forward, backward, Adam on NVMe
			return err
		}
	}
	_, err = tr.Offload().SaveCheckpoint(ctx, dir, int64(steps), checkpoint.SaveOptions{})
	return err
}

// stepMicroBatches is docs/gomlx.md's step of several micro-batches.
func stepMicroBatches(ctx context.Context, tr *zgomlx.Trainer, xs, ys []*tensors.Tensor) ([]float32, error) {
	// ds_config.json: "gradient_accumulation_steps": len(xs), "zinf": {"schedule": "layer-major"}
	mbs := make([]zgomlx.MicroBatch, len(xs))
	for i := range xs {
		mbs[i] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{xs[i]}, Labels: []*tensors.Tensor{ys[i]}}
	}
	return tr.StepMicroBatches(ctx, mbs) // or zgomlx.NewLoop(tr).RunSteps(ctx, ds, steps)
}

// TestDocsSnippets runs the documents' GoMLX code: README's language model
// for two steps from a config file, the chain of blocks for two steps and a
// checkpoint, and a step of two micro-batches layer-major.
func TestDocsSnippets(t *testing.T) {
	ctx := watchdog(t, 5*time.Minute)
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "ds_config.json")
	js := fmt.Sprintf(`{"zero_optimization": {"stage": 3, "sub_group_size": 65536,
  "offload_param": {"device": "nvme", "nvme_path": %q, "max_in_cpu": 0},
  "offload_optimizer": {"device": "nvme", "nvme_path": %q}},
 "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
 "zinf": {"tiers": {"cpu_pinned_bytes": "32MiB"}}}`, dir, dir)
	if err := os.WriteFile(cfgFile, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	tok := make([]int32, 2*33)
	for i := range tok {
		tok[i] = int32(i*7) % 97
	}
	x := tensors.FromFlatDataAndDimensions(append([]int32(nil), tok[:64]...), 2, 32)
	y := tensors.FromFlatDataAndDimensions(append([]int32(nil), tok[1:65]...), 2, 32)
	steps := 0
	batches := func(yield func(*tensors.Tensor, *tensors.Tensor) bool) {
		for range 2 {
			steps++
			if !yield(x, y) {
				return
			}
		}
	}
	if err := trainLM(ctx, cfgFile, 97, batches); err != nil {
		t.Fatalf("trainLM: %v", err)
	}
	if steps != 2 {
		t.Fatalf("trainLM took %d batches, want 2", steps)
	}

	net := mlpNet(8)
	in := tensors.FromFlatDataAndDimensions(make([]float32, 4*8), 4, 8)
	out := tensors.FromFlatDataAndDimensions(make([]float32, 4*8), 4, 8)
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	if err := trainBlocks(ctx, testConfig(t, 16<<20), net.Layers[0].Fn, net.Loss, in, out, 2, ckpt); err != nil {
		t.Fatalf("trainBlocks: %v", err)
	}
	if _, err := os.Stat(ckpt); err != nil {
		t.Fatalf("trainBlocks saved no checkpoint: %v", err)
	}

	// Fresh tensors: trainBlocks's backend, which held the others, is gone.
	in = tensors.FromFlatDataAndDimensions(make([]float32, 4*8), 4, 8)
	out = tensors.FromFlatDataAndDimensions(make([]float32, 4*8), 4, 8)
	cfg := testConfig(t, 16<<20)
	cfg.GradientAccumulationSteps = 2
	cfg.Zinf.Schedule = config.ScheduleLayerMajor
	b := backend(t)
	defer b.Finalize()
	tr, err := zgomlx.Create(ctx, b, cfg, model.NewStore(), mlpNet(8, 8), zgomlx.Options{}, in.Shape())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	losses, err := stepMicroBatches(ctx, tr, []*tensors.Tensor{in, in}, []*tensors.Tensor{out, out})
	if err != nil || len(losses) != 2 {
		t.Fatalf("stepMicroBatches: %v losses, %v", losses, err)
	}
}
