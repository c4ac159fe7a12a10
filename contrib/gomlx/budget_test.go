package zgomlx_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// TestStateFourTimesPinned trains a transformer whose training state
// (parameters, fp32 masters, Adam moments, gradients) is more than four
// times the pinned pool — the least pool zinf accepts for it, which
// Register names when given less — with every parameter on NVMe, and
// matches in-memory training bit for bit.
func TestStateFourTimesPinned(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	const vocab, seq, batch = 31, 8, 2
	net := lmNet(vocab, seq, 32, 2, 12, dtypes.Float32)
	b := backend(t)
	x := shapes.Make(dtypes.Int32, batch, seq)
	store := newStore(t, b, net, x, 9)
	memStore := clone(t, store)
	// The minimum pool, from Register's refusal of a smaller one.
	// The optimizer's pinned pipeline holds a few sub-groups in flight,
	// each with a ranged gradient read; with zinf.checksums such a read
	// covers whole 1 MiB checksum chunks, a floor of several MiB that this
	// small model would not clear. Without checksums, sub-groups of 8K
	// elements keep the pipeline small next to the model.
	const subGroup = 8192
	small := func(cfg *config.Config) *config.Config {
		cfg.ZeroOptimization.SubGroupSize = subGroup
		cfg.Zinf.Checksums = false
		return cfg
	}
	cfg := small(testConfig(t, 4096))
	_, err := zgomlx.Register(ctx, cfg, store, zgomlx.Options{Layers: net.Scopes()})
	var tooSmall *zinf.PoolTooSmallError
	if !errors.As(err, &tooSmall) {
		t.Fatalf("a 4 KiB pool: want *zinf.PoolTooSmallError, got %v", err)
	}
	if !store.GetVariable("/block_0/fc1/dense/weights").HasValue() {
		t.Fatal("a refused Register released values")
	}
	cfg = small(testConfig(t, tooSmall.Need))
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	state, pinned := tr.Offload().StateBytes(), tr.Offload().Runtime().Metrics().PinnedBytes
	t.Logf("state %d bytes, pinned pool %d bytes (%.1fx); reservations:\n%s", state, pinned, float64(state)/float64(pinned), tooSmall.Res)
	if state < 4*pinned {
		t.Fatalf("state %d bytes is less than 4x the pinned pool of %d", state, pinned)
	}
	mt, err := reference.NewMemoryTrainer(b, memStore, net, cfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	batchOf := func(i int) (x, y *tensors.Tensor) { return lmBatch(i, batch, seq, vocab) }
	for i := range 4 {
		x, y := batchOf(i)
		lo, err := tr.Step(ctx, x, y)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if lm, _ := mt.Step(ctx, x, y); lm != lo {
			t.Fatalf("step %d: loss %v offloaded, %v in memory", i, lo, lm)
		}
	}
	sameModel(ctx, t, "after 4 steps", tr, mt, memStore)
	if m := tr.Offload().Runtime().Metrics(); m.PinnedPeakBytes > pinned || m.BytesRead < state/2 {
		t.Fatalf("pinned peak %d of %d, %d bytes read from NVMe", m.PinnedPeakBytes, pinned, m.BytesRead)
	}
}
