package zinf_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestBigEmbeddingTrainsInPieces: a model whose 100k-row embedding
// (100000 x 64, fp32: 25.6 MB of parameter, 128 MB of state with its
// gradient, master and Adam moments) is by far its largest tensor plans a
// minimum pool of at most 1.25x the embedding's bytes plus what the
// planner says the same model without it needs — moving it whole needed
// three power-of-two blocks of it — trains at exactly that pool bit for
// bit as in memory (the differential harness: every read and the final
// masters and moments), and one block below it is refused with an error
// naming the tensor that sets the minimum and what to lower.
func TestBigEmbeddingTrainsInPieces(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a 6.4M-element embedding")
	}
	emb := tensor.Desc{Name: "tok_embed", Shape: []int{100_000, 64}}
	rest := [][]tensor.Desc{
		{{Name: "mlp.w1", Shape: []int{64, 512}}, {Name: "mlp.b1", Shape: []int{512}}},
		{{Name: "mlp.w2", Shape: []int{512, 64}}, {Name: "norm", Shape: []int{64}}},
	}
	model := zinf.LayeredModel(append([][]tensor.Desc{{emb}}, rest...)...)
	others := zinf.LayeredModel(append([][]tensor.Desc{{}}, rest...)...)
	embBytes := int64(100_000 * 64 * 4)

	cfg, _ := testConfig(t)
	cfg.ZeroOptimization.SubGroupSize = 65_536
	cfg.GradientAccumulationSteps = 2
	plan := func(m zinf.Model, pieceBytes int64) zinf.Reservations {
		t.Helper()
		p, err := zinf.PlanModel(context.Background(), cfg, m, zinf.PlanOptions{NoBandwidthProbe: true, PieceBytes: pieceBytes})
		if err != nil {
			t.Fatal(err)
		}
		return p.Reservations
	}
	all, rest0, whole := plan(model, 0), plan(others, 0), plan(model, -1)
	bar := rest0.MinPoolBytes + embBytes*5/4
	t.Logf("minimum pool: %d bytes in pieces of %d (the rest of the model alone %d: the embedding adds %.2fx its %d bytes); moved whole %d (%.2fx); bar %d",
		all.MinPoolBytes, all.PieceBytes, rest0.MinPoolBytes, float64(all.MinPoolBytes-rest0.MinPoolBytes)/float64(embBytes), embBytes,
		whole.MinPoolBytes, float64(whole.MinPoolBytes-rest0.MinPoolBytes)/float64(embBytes), bar)
	if all.MinPoolBytes > bar {
		t.Fatalf("minimum pool %d is above 1.25x the embedding's bytes plus the rest's minimum (%d)\n%s", all.MinPoolBytes, bar, all)
	}
	if whole.MinPoolBytes <= bar {
		t.Fatalf("moved whole the embedding needs %d, within the bar %d: the test shows nothing", whole.MinPoolBytes, bar)
	}

	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(all.MinPoolBytes - all.GranuleBytes)
	_, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
	var small *zinf.PoolTooSmallError
	if !errors.As(err, &small) || small.Need != all.MinPoolBytes {
		t.Fatalf("one block below the minimum: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, `"`) || !strings.Contains(msg, "largest part") {
		t.Fatalf("the error names no tensor: %v", err)
	}
	t.Logf("one block below: %v", strings.SplitN(err.Error(), "Reservations:", 2)[0])
	// Moved whole, the error points at what sets the minimum: the
	// embedding, and the piece size.
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(whole.MinPoolBytes - whole.GranuleBytes)
	_, err = zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, PieceBytes: -1})
	if err == nil || !strings.Contains(err.Error(), `"tok_embed"`) || !strings.Contains(err.Error(), "PieceBytes") {
		t.Fatalf("moved whole, one block below the minimum: %v (want it to name \"tok_embed\" and PieceBytes)", err)
	}

	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(all.MinPoolBytes)
	ctx, watch := watchdog(t, 4*time.Minute)
	rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	if !rt.Params.Streamed("tok_embed") || rt.Params.Streamed("mlp.w1") {
		t.Fatalf("streamed: tok_embed %v, mlp.w1 %v (want the embedding only)", rt.Params.Streamed("tok_embed"), rt.Params.Streamed("mlp.w1"))
	}
	tr := &trainRun{t: t, model: model, cfg: cfg, rts: []*zinf.Runtime{rt}, micro: 2, steps: 2}
	tr.run(ctx)
	m := rt.Metrics()
	t.Logf("pinned peak %d of %d bytes (%.2fx the embedding)", m.PinnedPeakBytes, m.PinnedBytes, float64(m.PinnedPeakBytes)/float64(embBytes))
}
