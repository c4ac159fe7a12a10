package zgomlx_test

import (
	"context"
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
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestTiedHeadNVMeBytesAgainstPlan trains a tiny tied transformer whose
// head runs in blocks of the table (TransformerOptions.HeadBlockRows),
// layer-major at k = 1 and 6 micro-batches, every state on NVMe, and
// compares a step's NVMe bytes (read + written) with the plan's prediction
// (rt.Placement().Predicted), which counts the table read whole twice a
// step. The head reads it whole twice (forward and backward); the lookup
// reads the step's rows once, in the forward pass: its backward pass needs
// the same rows, still in the swap-in buffer, and reads nothing (it read
// them again before, the pieces holding them a second time). At k = 1 the
// step is within 3% of the plan; at k = 6 the excess is at most one read of
// the table (the rows' pieces), where reading the rows twice made it
// about two.
func TestTiedHeadNVMeBytesAgainstPlan(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	const vocab, dim, seq = 8192, 64, 16
	const table = int64(vocab * dim * 4) // fp32 parameters
	for _, k := range []int{1, 6} {
		store := model.NewStore()
		store.SetParam(model.ParamInitialSeed, int64(7))
		m := transformer.New(store.RootScope()).WithVocabSize(vocab).WithEmbedDim(dim).WithNumLayers(2).
			WithNumHeads(4).WithHeadDim(dim / 4).WithFFNDim(4 * dim).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
		net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: 1024})
		if err != nil {
			t.Fatal(err)
		}
		cfg := config.Default()
		cfg.SetScratchDir(t.TempDir())
		cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
		cfg.ZeroOptimization.SubGroupSize = 65_536
		cfg.Zinf.Tiers.CPUPinnedBytes = 24 << 20
		cfg.Zinf.Schedule = config.ScheduleLayerMajor
		cfg.GradientAccumulationSteps = k
		tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{Runtime: zinf.Options{PieceBytes: 64 << 10}}, shapes.Make(dtypes.Int32, 1, seq))
		if err != nil {
			t.Fatal(err)
		}
		rt := tr.Offload().Runtime()
		pr := rt.Placement().Predicted
		n := 0
		step := func() (int64, int64) {
			mbs := make([]zgomlx.MicroBatch, k)
			for i := range mbs {
				ids := make([]int32, seq)
				lab := make([]int32, seq)
				for j := range ids {
					ids[j] = int32((n*7919 + j*613) % vocab)
					lab[j] = int32((n*104729 + j*37) % vocab)
				}
				n++
				mbs[i] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{tensors.FromFlatDataAndDimensions(ids, 1, seq)},
					Labels: []*tensors.Tensor{tensors.FromFlatDataAndDimensions(lab, 1, seq)}}
			}
			m0 := rt.Metrics()
			if _, err := tr.StepMicroBatches(ctx, mbs); err != nil {
				t.Fatal(err)
			}
			m1 := rt.Metrics()
			return m1.BytesRead - m0.BytesRead, m1.BytesWritten - m0.BytesWritten
		}
		step()
		r, w := step()
		pred := pr.NVMeReadBytes + pr.NVMeWriteBytes
		dev := float64(r+w)/float64(pred) - 1
		t.Logf("k=%d: read %d (plan %d), written %d (plan %d): %+.2f%% of the plan; the table is %d bytes", k, r, pr.NVMeReadBytes, w, pr.NVMeWriteBytes, 100*dev, table)
		if w != pr.NVMeWriteBytes {
			t.Errorf("k=%d: %d bytes written a step, the plan's %d", k, w, pr.NVMeWriteBytes)
		}
		switch {
		case k == 1 && (dev > 0.03 || dev < -0.03):
			t.Errorf("k=1: NVMe bytes of a step %d, the plan's %d: %+.1f%% (allowed: within 3%%)", r+w, pred, 100*dev)
		case r+w < pred*97/100 || r+w > pred+table:
			t.Errorf("k=%d: NVMe bytes of a step %d, the plan's %d: %+d (allowed: from -3%% to one read of the %d-byte table more, the forward pass's rows)", k, r+w, pred, r+w-pred, table)
		}
		tr.Close()
	}
}
