package zgomlx

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
)

// TestSwapInReusesBuffers: once warm, swapping a layer in (zinf's
// barrier, the copy of every variable into its GoMLX buffer, the end of
// the layer) reuses the same buffers — the pool does not grow — and
// allocates no buffer of the layer's size on the Go heap: what is
// allocated is zinf's per-operation bookkeeping, a small fraction of the
// bytes moved. The adapter's own part (binding buffers to variables)
// allocates nothing.
func TestSwapInReusesBuffers(t *testing.T) {
	ctx := context.Background()
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	net := Net{Loss: func(y, labels *graph.Node) *graph.Node {
		return graph.ReduceAllMean(graph.Square(graph.Sub(y, labels)))
	}}
	for i := range 4 {
		net.Layers = append(net.Layers, Layer{Scope: fmt.Sprintf("/l%d", i), Fn: func(scope *model.Scope, x *graph.Node) *graph.Node {
			return graph.Tanh(layers.Dense(scope, x, true, 256))
		}})
	}
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(1))
	xs := shapes.Make(dtypes.Float32, 4, 256)
	if _, err := Initialize(backend, store, net, xs); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	tr, err := Open(ctx, backend, cfg, store, net, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	x := tensors.FromShape(xs)
	y := tensors.FromShape(xs)
	for range 2 {
		if _, err := tr.Step(ctx, x, y); err != nil {
			t.Fatal(err)
		}
	}
	src := (*zinfSource)(tr)
	var layerBytes int64
	for _, v := range tr.off.layerVars[1] {
		layerBytes += v.Bytes()
	}
	poolBytes := tr.pool.bytes
	swapIn := func() {
		tr.off.version++ // every buffer is stale: each variable is read from zinf
		tr.off.rt.Pass([]int{1})
		if err := src.bind(ctx, 1); err != nil {
			t.Fatal(err)
		}
		src.unbind(1)
	}
	swapIn()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	const runs = 50
	allocs := testing.AllocsPerRun(runs, swapIn)
	runtime.ReadMemStats(&ms1)
	perBytes := float64(ms1.TotalAlloc-ms0.TotalAlloc) / (runs + 1)
	t.Logf("a swap-in of %d variables (%d bytes): %.0f allocations, %.0f bytes allocated", len(tr.off.layerVars[1]), layerBytes, allocs, perBytes)
	if tr.pool.bytes != poolBytes {
		t.Errorf("the swap-in buffers grew from %d to %d bytes", poolBytes, tr.pool.bytes)
	}
	if perBytes > float64(layerBytes)/20 {
		t.Errorf("%.0f bytes allocated per swap-in of a %d-byte layer", perBytes, layerBytes)
	}
	// The adapter's part: binding buffers that hold current values.
	bindOnly := func() {
		if err := src.bind(ctx, 1); err != nil {
			t.Fatal(err)
		}
		src.unbind(1)
	}
	bindOnly()
	if a := testing.AllocsPerRun(runs, bindOnly); a != 0 {
		t.Errorf("binding a layer whose buffers are current allocated %.1f times", a)
	}
}
