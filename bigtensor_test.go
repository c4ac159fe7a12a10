package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/internal/test/testenv"
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
		p, err := zinf.PlanModel(context.Background(), cfg, m, zinf.Options{NoBandwidthProbe: true, PieceBytes: pieceBytes})
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

// TestPiecesUnderFaults: tensors moved in pieces (1 MiB: the embedding's
// parameter is streamed in 3 pieces, its gradient kept in 3 and the
// matrix's in 2) train bit for bit as in memory while ENOSPC and EIO are
// injected into writes — Init, gradient write-behinds (a gradient in
// pieces may fail after some pieces were added: its retry must not add
// them twice), steps — and every failed call is retried, over random call
// orders, at world 1 and 2.
func TestPiecesUnderFaults(t *testing.T) {
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "emb", Shape: []int{10_007, 64}}},
		[]tensor.Desc{{Name: "w", Shape: []int{512, 700}}, {Name: "b", Shape: []int{700}}},
	)
	for _, world := range []int{1, 2} {
		for _, seed := range testenv.Seeds(t, 2, 6) {
			t.Run(fmt.Sprintf("world %d seed %d", world, seed), func(t *testing.T) {
				t.Logf("reproduce with ZINF_TEST_SEED=%d", seed)
				rng := rand.New(rand.NewPCG(seed, uint64(world)))
				cfg, _ := testConfig(t)
				cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
				cfg.ZeroOptimization.SubGroupSize = 1 << 15
				cfg.GradientAccumulationSteps = 3
				ctx, watch := watchdog(t, 3*time.Minute)
				comms, err := comm.NewLocal(world, comm.LocalOptions{StallTimeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				var rts []*zinf.Runtime
				var injs []*faults.Injector
				for r := range world {
					inj := faults.New(seed ^ uint64(r+1)*0x9e37)
					rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, Rank: r, WorldSize: world, Comm: comms[r],
						Faults: inj, PieceBytes: 1 << 20, SerialStep: rng.IntN(2) == 0})
					if err != nil {
						t.Fatal(err)
					}
					defer rt.Close()
					watch(rt)
					if !rt.Params.Streamed("emb") {
						t.Fatal("emb is not streamed in 1 MiB pieces")
					}
					rts = append(rts, rt)
					injs = append(injs, inj)
				}
				tr := &trainRun{t: t, rng: rng, model: model, cfg: cfg, rts: rts, comms: comms, injs: injs, micro: 3, steps: 3, faultRate: 0.3, orders: true}
				tr.run(ctx)
				var hits int
				for _, inj := range injs {
					hits += inj.Hits()
				}
				t.Logf("injected faults: %d, retries: %d", hits, tr.retries.Load())
			})
		}
	}
}

// TestPieceBytesKey: zinf.piece_bytes in a config file sets the piece
// (Options.PieceBytes overrides it), and a value out of range is refused
// naming the key.
func TestPieceBytesKey(t *testing.T) {
	model := zinf.LayeredModel([]tensor.Desc{{Name: "emb", Shape: []int{40_000, 64}}})
	_, dir := testConfig(t)
	path := dir + "/ds.json"
	write := func(v string) {
		t.Helper()
		js := `{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "` + dir + `"}, "offload_optimizer": {"device": "nvme", "nvme_path": "` + dir + `"}},
			"zinf": {"tiers": {"cpu_pinned_bytes": "64MiB"}, "piece_bytes": ` + v + `}}`
		if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`"2MiB"`)
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		opt, want int64
	}{{0, 2 << 20}, {1 << 20, 1 << 20}, {-1, 0}} {
		p, err := zinf.PlanModel(context.Background(), c, model, zinf.Options{NoBandwidthProbe: true, PieceBytes: o.opt})
		if err != nil {
			t.Fatal(err)
		}
		if p.Reservations.PieceBytes != o.want {
			t.Errorf("zinf.piece_bytes 2MiB, Options.PieceBytes %d: piece %d, want %d", o.opt, p.Reservations.PieceBytes, o.want)
		}
	}
	write(`"2TiB"`)
	if _, err := config.Load(path); err == nil || !strings.Contains(err.Error(), "zinf.piece_bytes") {
		t.Fatalf("piece_bytes 2TiB: %v (want a problem naming zinf.piece_bytes)", err)
	}
}
