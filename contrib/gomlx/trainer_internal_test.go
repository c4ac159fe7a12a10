package zgomlx

import (
	"context"
	"strings"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
)

// TestTrainerRefusesOffloadOfOtherLayers: an Offload registered with the
// Net's layers in another order gets no Trainer (Create registers
// them in the Net's order; the check guards the executors' binding of
// each layer's variables).
func TestTrainerRefusesOffloadOfOtherLayers(t *testing.T) {
	ctx := context.Background()
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	dense := func(scope *model.Scope, x *graph.Node) *graph.Node { return layers.Dense(scope, x, true, 8) }
	net := Net{
		Layers: []Layer{{Scope: "/dense_0", Fn: dense}, {Scope: "/dense_1", Fn: dense}},
		Loss: func(y, labels *graph.Node) *graph.Node {
			return graph.ReduceAllMean(graph.Square(graph.Sub(y, labels)))
		},
	}
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(1))
	if _, err := Initialize(backend, store, net, shapes.Make(dtypes.Float32, 2, 8)); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 8 << 20
	off, err := Register(ctx, cfg, store, Options{Layers: []string{"/dense_1", "/dense_0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	if tr, err := newTrainer(backend, off, net); err == nil || !strings.Contains(err.Error(), "Options.Layers = net.Scopes()") {
		if tr != nil {
			tr.Close()
		}
		t.Fatalf("layers in another order: %v", err)
	}
}
