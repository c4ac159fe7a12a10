package zgomlx_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

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

// trainZoo is docs/gomlx.md's "GoMLX's zoo transformer, trained with
// every weight on NVMe" code, line for line (docs/snippets_test.go in
// zinf's module checks the two are the same): the example below compiles
// and runs it.
func trainZoo(ctx context.Context, backend compute.Backend, steps, batch, seq int, next func() (tokens, nextTokens *tensors.Tensor), evalTokens, evalNext *tensors.Tensor, dir string) (before, after float32, err error) {
	store := model.NewStore()
	m := transformer.New(store.RootScope()).WithVocabSize(100277).WithEmbedDim(32).WithNumLayers(4).
		WithNumHeads(4).WithHeadDim(8).WithRoPE(10000).WithFinalNormalization("rms")
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{}) // TieEmbeddings: true for a tied head
	if err != nil {
		return 0, 0, err
	}
	cfg, err := config.Load(filepath.Join(dir, "ds_config.json")) // offload_param / offload_optimizer: nvme
	if err != nil {
		return 0, 0, err
	}
	tr, err := zgomlx.Create(ctx, backend, cfg, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, batch, seq))
	if err != nil {
		return 0, 0, err
	}
	defer tr.Close()
	if before, err = tr.EvalLoss(ctx, evalTokens, evalNext); err != nil { // weights streamed, no Restore
		return 0, 0, err
	}
	for range steps {
		tokens, nextTokens := next() // [batch, seq] int32 each
		if _, err := tr.Step(ctx, tokens, nextTokens); err != nil {
			return 0, 0, err
		}
	}
	if after, err = tr.EvalLoss(ctx, evalTokens, evalNext); err != nil {
		return 0, 0, err
	}
	_, err = tr.Offload().SaveCheckpoint(ctx, filepath.Join(dir, "checkpoint"), int64(steps), checkpoint.SaveOptions{})
	return before, after, err
}

// docs/gomlx.md's zoo transformer code, run for 3 steps on a repeated
// sentence: the held-out loss (the same sentence) falls, and the
// checkpoint is written.
func ExampleTransformerNet() {
	dir, err := os.MkdirTemp("", "zgomlx-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	cfg := fmt.Sprintf(`{"zero_optimization": {"stage": 3, "sub_group_size": 65536,
  "offload_param": {"device": "nvme", "nvme_path": %q, "max_in_cpu": 0},
  "offload_optimizer": {"device": "nvme", "nvme_path": %q}},
 "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
 "zinf": {"tiers": {"cpu_pinned_bytes": "64MiB"}}}`, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "ds_config.json"), []byte(cfg), 0o644); err != nil {
		fmt.Println(err)
		return
	}
	backend, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer backend.Finalize()
	sentence := []int32{791, 4320, 374, 220, 2983, 13, 100, 50000, 100276, 7}
	x := tensors.FromFlatDataAndDimensions(sentence[:8], 1, 8)
	y := tensors.FromFlatDataAndDimensions(sentence[1:9], 1, 8)
	next := func() (*tensors.Tensor, *tensors.Tensor) { return x, y }
	before, after, err := trainZoo(context.Background(), backend, 3, 1, 8, next, x, y, dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, serr := os.Stat(filepath.Join(dir, "checkpoint"))
	fmt.Printf("held-out loss fell: %v; checkpoint saved: %v\n", after < before, serr == nil)
	// Output: held-out loss fell: true; checkpoint saved: true
}
