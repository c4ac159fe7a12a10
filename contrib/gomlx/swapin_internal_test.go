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
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf"
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
	tr, err := Create(ctx, backend, cfg, store, net, Options{})
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

// TestCreateMakesRowTableBuffersFirst: Create makes the swap-in buffer of
// a table read by rows (a streamed Layer.Lookups variable) before it
// initializes the layers, and the first swap-in of the table binds that
// buffer instead of allocating one (spareRowTables: a buffer allocated
// after the initial values passed through the heap is zeroed page by
// page, all of it resident for a moment).
func TestCreateMakesRowTableBuffersFirst(t *testing.T) {
	ctx := context.Background()
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(3))
	const vocab = 20000
	m := transformer.New(store.RootScope()).WithVocabSize(vocab).WithEmbedDim(16).WithNumLayers(1).
		WithNumHeads(2).WithHeadDim(8).WithFFNDim(24).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := TransformerNet(m, TransformerOptions{TieEmbeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.ZeroOptimization.SubGroupSize = 65_536
	xs := shapes.Make(dtypes.Int32, 2, 8)
	tr, err := Create(ctx, backend, cfg, store, net, Options{Runtime: zinf.Options{PieceBytes: 1 << 20}}, xs)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	const table = "/token_embed/embeddings"
	if !tr.off.rt.Streamed(table) {
		t.Fatalf("%s is not streamed", table)
	}
	if len(tr.pool.spare) != 1 || !tr.pool.spare[0].t.Shape().Equal(shapes.Make(dtypes.Float32, vocab, 16)) {
		t.Fatalf("spare buffers after Create: %d, want the table's", len(tr.pool.spare))
	}
	spare := tr.pool.spare[0]
	if runtime.GOOS == "linux" && !spare.mem.Mapped() {
		t.Fatal("the table's swap-in buffer is in the Go heap, not mapped outside it")
	}
	ids := make([]int32, 16)
	for i := range ids {
		ids[i] = int32(i * 997 % vocab)
	}
	x := tensors.FromFlatDataAndDimensions(ids, 2, 8)
	if _, err := tr.Step(ctx, x, x); err != nil {
		t.Fatal(err)
	}
	if len(tr.pool.spare) != 0 || tr.off.byName[table].slot != spare {
		t.Fatalf("after a step: %d spare buffers, the table's slot is the spare one: %v", len(tr.pool.spare), tr.off.byName[table].slot == spare)
	}
}
