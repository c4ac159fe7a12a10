package zgomlx_test

import (
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// TestLayerMajorGradientsWrittenOnce: a layer-major step writes every
// layer's gradients once whatever its micro-batches, the last layer's
// too, whose weights are still in their swap-in buffers when its
// backward begins (it was handed its micro-batches' gradients unheld, so
// each was written and read back: k-1 more writes of that layer a step).
// The gradient bytes written a step at k = 3 equal k = 1's; the losses
// and the model equal in-memory training bit for bit.
func TestLayerMajorGradientsWrittenOnce(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	b := backend(t)
	c := mlpChainCase()
	init := c.store(t, b)
	written := map[int]int64{}
	for _, k := range []int{1, 3} {
		lmStore, memStore := clone(t, init), clone(t, init)
		cfg := c.config(t, k, config.ScheduleLayerMajor)
		// This test counts the gradients' NVMe round trip: keep none pinned.
		cfg.Zinf.PinnedGrads = config.PinnedGradsOff
		tr, err := zgomlx.Create(ctx, b, cfg, lmStore, c.net, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		mt, err := reference.NewMemoryTrainer(b, memStore, c.net, cfg, zgomlx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer mt.Close()
		rt := tr.Offload().Runtime()
		for step := range 3 {
			mbs := c.microBatches(step, k)
			w0 := rt.Metrics().Grads.BytesWritten
			got, err := tr.StepMicroBatches(ctx, mbs)
			if err != nil {
				t.Fatalf("k=%d step %d: %v", k, step, err)
			}
			if step > 0 { // the first step's writes include what warming up leaves
				written[k] = rt.Metrics().Grads.BytesWritten - w0
			}
			sameLosses(t, "layer-major", got, stepMemory(ctx, t, mt, mbs))
		}
		sameModel(ctx, t, "layer-major", tr, mt, memStore)
	}
	if written[1] <= 0 || written[3] != written[1] {
		t.Fatalf("gradient bytes written a step: %d at k=3, %d at k=1 (want equal, > 0)", written[3], written[1])
	}
}
