package zgomlx

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
)

// TestSwapInBuffersOutsideGoHeap: after a layer-major step of a tied
// transformer whose head runs in blocks, every swap-in buffer of
// mappedSlotBytes or more (a block's FFN weights, the head's block of the
// table) and the head's gradient sum are mapped outside the Go heap: in
// the heap they would count as live and let as much garbage again build
// up before a collection (bench-llm-big at 4 blocks: 1095-1191 MiB peak RSS against
// a bound of 1010-1030 MiB before, 953 MiB after).
func TestSwapInBuffersOutsideGoHeap(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("anonymous mappings are made on Linux only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	backend, err := compute.NewWithConfig(DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(5))
	const vocab, dim, ffn, rows = 4096, 128, 2048, 2048
	m := transformer.New(store.RootScope()).WithVocabSize(vocab).WithEmbedDim(dim).WithNumLayers(2).
		WithNumHeads(4).WithHeadDim(dim / 4).WithFFNDim(ffn).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := TransformerNet(m, TransformerOptions{TieEmbeddings: true, HeadBlockRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.ZeroOptimization.SubGroupSize = 65_536
	cfg.Zinf.Schedule = config.ScheduleLayerMajor
	xs := shapes.Make(dtypes.Int32, 1, 8)
	tr, err := Create(ctx, backend, cfg, store, net, Options{Runtime: zinf.Options{PieceBytes: 1 << 20}}, xs)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.ex.head == nil {
		t.Fatal("the head is not computed in blocks")
	}
	batch := func(seed int) []*tensors.Tensor {
		ids := make([]int32, 8)
		for i := range ids {
			ids[i] = int32((seed*31 + i*997) % vocab)
		}
		return []*tensors.Tensor{tensors.FromFlatDataAndDimensions(ids, 1, 8), tensors.FromFlatDataAndDimensions(ids, 1, 8)}
	}
	mbs := []MicroBatch{{Inputs: batch(1)[:1], Labels: batch(1)[1:]}, {Inputs: batch(2)[:1], Labels: batch(2)[1:]}}
	if _, err := tr.StepMicroBatches(ctx, mbs); err != nil {
		t.Fatal(err)
	}
	var big, bigBytes int
	check := func(what string, s *slot) {
		if s == nil || len(s.bytes) < mappedSlotBytes {
			return
		}
		big++
		bigBytes += len(s.bytes)
		if !s.mem.Mapped() {
			t.Errorf("%s (%s, %d bytes) is in the Go heap, not mapped outside it", what, s.t.Shape(), len(s.bytes))
		}
	}
	for _, c := range tr.pool.classes {
		for _, s := range c {
			check("a swap-in buffer", s)
		}
	}
	check("the head's block of the table", tr.ex.head.block)
	if big < 3 {
		t.Fatalf("%d swap-in buffers of %d bytes or more, want the table's, a block's FFN weights and the head's block", big, mappedSlotBytes)
	}
	if !tr.ex.head.sumMem.Mapped() {
		t.Error("the head's gradient sum is in the Go heap, not mapped outside it")
	}
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("%d mapped buffers of %d bytes; live Go heap %d bytes", big, bigBytes, ms.HeapAlloc)
}
