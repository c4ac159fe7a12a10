package zgomlx_test

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestRowTableBufferOutsideGoHeap is the regression test of the Go heap a
// large-vocabulary lookup costs: the zoo transformer with a 32768 x 512
// fp32 table (64 MiB) streamed by zinf and read by rows, its tied head in
// blocks of 1024 rows, created and stepped layer-major. The lookup's
// swap-in buffer has the whole table's shape; it lies outside the Go heap,
// so the live Go heap after Create and two steps holds less than half the
// table more than before Create. Made in the Go heap (as it was), the
// buffer alone was the table's size of live heap, and the collector let
// as much garbage again build up before it ran.
func TestRowTableBufferOutsideGoHeap(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	const vocab, dim, rows, k = 32768, 512, 1024, 2
	live := func() int64 {
		runtime.GC()
		runtime.GC() // the pools' idle buffers (sync.Pool) dropped
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return int64(s[0].Value.Uint64())
	}
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(8))
	m := transformer.New(store.RootScope()).WithVocabSize(vocab).WithEmbedDim(dim).WithNumLayers(1).
		WithNumHeads(4).WithHeadDim(dim / 4).WithFFNDim(dim).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	cfg := blockedHeadConfig(t, k, config.ScheduleLayerMajor)
	cfg.Zinf.Tiers.CPUPinnedBytes = 256 << 20
	before := live()
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, 2, 8))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	const table = vocab * dim * 4
	for s := range 2 {
		mbs := make([]zgomlx.MicroBatch, k)
		for i := range mbs {
			x, y := repeatBatch(s*k+i, vocab)
			mbs[i] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
		}
		if _, err := tr.StepMicroBatches(ctx, mbs); err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
	}
	after := live()
	grow := after - before
	t.Logf("live Go heap %d MiB before Create, %d MiB after two steps (%+.1f MiB); the table %d MiB; swap-in buffers %d MiB",
		before>>20, after>>20, float64(grow)/(1<<20), table>>20, tr.SwapBufferBytes()>>20)
	if tr.SwapBufferBytes() < table {
		t.Fatalf("swap-in buffers %d MiB: the lookup's table-shaped one (%d MiB) is missing", tr.SwapBufferBytes()>>20, table>>20)
	}
	if grow >= table/2 {
		t.Fatalf("the live Go heap grew %.1f MiB over Create and two steps: half the %d MiB table or more (the lookup's buffer is in the Go heap)",
			float64(grow)/(1<<20), table>>20)
	}
}
