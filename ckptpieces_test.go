package zinf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/swapper"
)

// TestCheckpointStreamedTensor: a parameter larger than a piece (streamed:
// never resident, written piece by piece) is saved and loaded — into
// another world size, where it is streamed too — with its optimizer
// states, bit for bit. The piece is 1 MiB (the swap store's stripe), so a
// tensor of 600k elements is streamed at both world sizes (a partition of
// 1.2 MiB or more) with a quarter of the I/O of one larger than the
// default piece; make stress runs the default piece (4 MiB) with a tensor
// of 2.4M elements.
func TestCheckpointStreamedTensor(t *testing.T) {
	numel, pieceBytes := testenv.Scale(600_007, 2_400_007), config.Size(testenv.Scale(1<<20, 0))
	params := []ckptParam{{"b", 33, 0, swapper.TierNVMe}, {"emb", numel, 1, swapper.TierNVMe}}
	for _, c := range [][2]int{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("%dto%d", c[0], c[1]), func(t *testing.T) {
			ctx := context.Background()
			pool := func(cfg *config.Config) {
				cfg.Zinf.Tiers.CPUPinnedBytes = 48 << 20
				cfg.Zinf.PieceBytes = pieceBytes
			}
			src := openRanksOf(t, params, c[0], swapper.Float32, 1, pool)
			for _, rt := range src {
				if !rt.Params.Streamed("emb") {
					t.Fatalf("rank %d: emb is not streamed", rt.Rank)
				}
			}
			rng := rand.New(rand.NewPCG(9, 2))
			for _, p := range params {
				full := make([][]float32, 3)
				for k := range full {
					full[k] = make([]float32, p.numel)
					for i := range full[k] {
						full[k][i] = rng.Float32()
					}
				}
				for _, rt := range src {
					lo, hi := rt.Partition(p.name)
					if err := rt.Optimizer.LoadState(ctx, p.name, full[0][lo:hi], full[1][lo:hi], full[2][lo:hi], 5); err != nil {
						t.Fatal(err)
					}
					if _, err := rt.Params.StageUpdate(ctx, p.name, full[0][lo:hi]); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, rt := range src {
				if err := rt.Params.CommitUpdates(); err != nil {
					t.Fatal(err)
				}
			}
			want := gatherStateOf(t, src, params)
			dir := filepath.Join(t.TempDir(), "step-000005")
			if _, err := SaveCheckpoint(ctx, dir, src, CheckpointMeta{Step: 5}, checkpoint.SaveOptions{Logger: quietLog}); err != nil {
				t.Fatal(err)
			}
			dst := openRanksOf(t, params, c[1], swapper.Float32, 2, pool)
			if d := want.diff(gatherStateOf(t, dst, params)); d == "" {
				t.Fatal("test broken: the fresh runtimes already equal the saved ones")
			}
			if _, err := LoadCheckpoint(ctx, dir, dst); err != nil {
				t.Fatal(err)
			}
			if d := want.diff(gatherStateOf(t, dst, params)); d != "" {
				t.Fatalf("after loading: %s", d)
			}
		})
	}
}
