package zgomlx_test

import (
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// TestBlockedHead: the zoo transformer with its tied head computed in
// blocks of the table (TransformerOptions.HeadBlockRows: Net.Head) trains
// bit for bit as the same Net in one graph (the head written blockwise,
// the last block padded with zero rows), losses and every variable after
// three steps; the Trainer reads the table in blocks and at the batch's
// rows, never whole into a Go buffer of its size.
func TestBlockedHead(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	const vocab, rows = 20000, 4096 // 5 blocks, the last one 3616 rows padded
	cfg := testConfig(t, 64<<20)
	cfg.ZeroOptimization.SubGroupSize = 65_536
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(bigVocabModel(store, vocab), zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	if net.Head == nil || net.Head.Rows != rows || net.Head.Table != "/token_embed/embeddings" {
		t.Fatalf("Net.Head %+v", net.Head)
	}
	xs := shapes.Make(dtypes.Int32, 2, 8)
	tr, wg, whole := offloadedAndWhole(ctx, t, b, cfg, store, net, xs)
	tableBytes := int64(vocab * 64 * 4)
	stepBoth(ctx, t, tr, wg, 3, "offloaded with the head in blocks", func(step int) (x, y *tensors.Tensor) { return repeatBatch(step, vocab) })
	sameVars(ctx, t, tr.Offload(), whole)
	// The table was read in blocks (twice a step: forward and backward)
	// and at the batch's rows; no swap-in buffer holds it read whole.
	if got := tr.SwapBufferBytes(); got >= 2*tableBytes {
		t.Fatalf("swap-in buffers %d bytes: the %d-byte table's slot and a second copy", got, tableBytes)
	}
	if r := tr.ParamBytesRead(); r < 3*2*tableBytes {
		t.Fatalf("%d bytes read in 3 steps: fewer than the table's %d bytes twice a step (the head's blocks)", r, tableBytes)
	}
	// Evaluation and forward passes run the head in blocks too.
	x, y := repeatBatch(9, vocab)
	le, err := tr.EvalLoss(ctx, x, y)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := tr.Forward(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0].Shape().Dim(-1) != vocab {
		t.Fatalf("Forward: %d outputs, the first %v (want the logits [2 8 %d])", len(outs), outs[0].Shape(), vocab)
	}
	outs[0].FinalizeAll()
	if le <= 0 {
		t.Fatalf("held-out loss %v", le)
	}
}

// TestBlockedHeadRefusals: the options a blocked head cannot take are
// refused with the field named.
func TestBlockedHeadRefusals(t *testing.T) {
	store := model.NewStore()
	_, err := zgomlx.TransformerNet(bigVocabModel(store, 1000), zgomlx.TransformerOptions{HeadBlockRows: 128})
	if err == nil || !strings.Contains(err.Error(), "TieEmbeddings") {
		t.Fatalf("HeadBlockRows without TieEmbeddings: %v", err)
	}
	_, err = zgomlx.TransformerNet(bigVocabModel(model.NewStore(), 1000), zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: -1})
	if err == nil || !strings.Contains(err.Error(), "HeadBlockRows") {
		t.Fatalf("HeadBlockRows -1: %v", err)
	}
	net, err := zgomlx.TransformerNet(bigVocabModel(model.NewStore(), 1000), zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: 128})
	if err != nil {
		t.Fatal(err)
	}
	b := backend(t)
	s := model.NewStore()
	net, _ = zgomlx.TransformerNet(bigVocabModel(s, 1000), zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: 128})
	if _, err := zgomlx.Initialize(b, s, net, shapes.Make(dtypes.Int32, 1, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := reference.NewMemoryTrainer(b, s, net, testConfig(t, 8<<20), zgomlx.Options{}); err == nil || !strings.Contains(err.Error(), "Net.Head") {
		t.Fatalf("MemoryTrainer with a Net.Head: %v", err)
	}
	// A table that fits one piece is not streamed: blocks are refused.
	_, err = zgomlx.Create(t.Context(), b, testConfig(t, 8<<20), s, net, zgomlx.Options{KeepValues: true})
	if err == nil || !strings.Contains(err.Error(), "not streamed") {
		t.Fatalf("Open with a 1000-row table in blocks: %v", err)
	}
}

// TestBlockedHeadUnderAuto: with zinf.schedule "auto" picking
// layer-major for 2 micro-batches, a Net.Head whose table is the first
// layer's lookup (TransformerNet's) runs them layer-major (the activation
// tier used) and says nothing of the order; with the lookup taken away
// (the table read whole by its layer) it runs them micro-batch-major and
// says so once, at Info level, on the runtime's logger. Both train.
func TestBlockedHeadUnderAuto(t *testing.T) {
	ctx := watchdog(t, 6*time.Minute)
	b := backend(t)
	const vocab, rows = 20000, 4096
	const said = "runs micro-batch-major"
	for _, lookup := range []bool{true, false} {
		cfg := testConfig(t, 64<<20)
		cfg.ZeroOptimization.SubGroupSize = 65_536
		cfg.GradientAccumulationSteps = 2
		cfg.Zinf.Schedule = config.ScheduleAuto
		// A fixed disk (no probe) so the plan's pick does not move with the
		// machine: two micro-batches read the weights once layer-major, twice
		// the other way.
		cfg.Zinf.Bandwidth.ReadBytesPerSec, cfg.Zinf.Bandwidth.WriteBytesPerSec = 1<<30, 1<<30
		store := model.NewStore()
		net, err := zgomlx.TransformerNet(bigVocabModel(store, vocab), zgomlx.TransformerOptions{TieEmbeddings: true, HeadBlockRows: rows})
		if err != nil {
			t.Fatal(err)
		}
		if !lookup {
			net.Layers[0].Lookups = nil
		}
		if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, 2, 8)); err != nil {
			t.Fatal(err)
		}
		var log syncBuffer // the runtime's goroutines log too
		tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{Runtime: zinf.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		if s := tr.Offload().Runtime().Schedule(); s != zinf.LayerMajor {
			t.Fatalf("the plan picked %s for 2 micro-batches on a 1 GiB/s disk: the case under test does not arise (%v)", s, tr.Offload().Runtime().Placement().Notes)
		}
		var losses []float32
		for step := range 2 {
			mbs := make([]zgomlx.MicroBatch, 2)
			for m := range mbs {
				x, y := repeatBatch(2*step+m, vocab)
				mbs[m] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
			}
			l, err := tr.StepMicroBatches(ctx, mbs)
			if err != nil {
				t.Fatalf("lookup %v step %d: %v", lookup, step, err)
			}
			losses = append(losses, l...)
		}
		n, saved := strings.Count(log.String(), said), tr.ActivationStats().Saved
		switch {
		case lookup && (n != 0 || saved == 0):
			t.Fatalf("table a lookup: the log says %q %d times, %d activation entries saved (want layer-major: 0 times, some saved):\n%s", said, n, saved, log.String())
		case !lookup && (n != 1 || saved != 0):
			t.Fatalf("table read whole: the log says %q %d times, %d activation entries saved (want micro-batch-major: once, none saved):\n%s", said, n, saved, log.String())
		}
		for i, l := range losses {
			if !(l > 0) || math.IsInf(float64(l), 0) {
				t.Fatalf("lookup %v micro-batch %d: loss %v", lookup, i, l)
			}
		}
	}
}
