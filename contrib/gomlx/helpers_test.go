package zgomlx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend" // the pure-Go backend
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/layers/attention"
	"github.com/gomlx/gomlx/ml/layers/norm"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/contrib/gomlx/zgomlxtest"
	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/plan"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// The backend, the MLP, its batches, the seeded Store and the bitwise
// comparison are the reference package's tests' too (zgomlxtest).
var (
	backend  = zgomlxtest.Backend
	mlpNet   = zgomlxtest.MLP
	mlpBatch = zgomlxtest.MLPBatch
	newStore = zgomlxtest.NewStore
	sameBits = zgomlxtest.SameBits
)

// bigRows is the row count of the tests' large embedding tables (rows of
// 64 fp32): 20000 (5 MiB, past the 4 MiB piece, so zinf streams the table
// in pieces and reads it by rows), or 100000, a real vocabulary's size,
// under make stress (ZINF_STRESS=1). The smaller default keeps the
// package's -race run well inside its timeout.
func bigRows() int { return testenv.Scale(20000, 100000) }

// testConfig is zinf's default config with swap files in a temp dir,
// every parameter on NVMe (no max_in_cpu cache), a small pinned pool and
// a learning rate that moves the weights visibly in a few steps.
func testConfig(t testing.TB, pinned int64) *config.Config {
	t.Helper()
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = config.Size(pinned)
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.Optimizer.LR = 0.01
	return c
}

// watchdog ends the test's context after d and fails the test with every
// goroutine's stack: a stalled loop shows who waits on what.
func watchdog(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				buf := make([]byte, 1<<20)
				t.Errorf("watchdog: the test ran past %s; goroutines:\n%s", d, buf[:runtime.Stack(buf, true)])
			}
		case <-done:
		}
	}()
	t.Cleanup(func() {
		close(done)
		<-finished
		cancel()
	})
	return ctx
}

// lmNet is a small causal transformer language model: a token and
// position embedding, blocks of pre-norm attention and an MLP with
// residuals, a final layer norm and the unembedding; the loss is the mean
// cross-entropy of the next token.
func lmNet(vocab, seq, dim, heads, blocks int, dtype dtypes.DType) zgomlx.Net {
	net := zgomlx.Net{}
	net.Layers = append(net.Layers, zgomlx.Layer{Scope: "/embed", Fn: func(scope *model.Scope, tokens *Node) *Node {
		x := layers.Embedding(scope.In("tokens"), tokens, dtype, vocab, dim)
		pos := scope.VariableWithShape("positions", shapes.Make(dtype, seq, dim)).NodeValue(tokens.Graph())
		return Add(x, ExpandAxes(pos, 0))
	}})
	for b := range blocks {
		net.Layers = append(net.Layers, zgomlx.Layer{Scope: fmt.Sprintf("/block_%d", b), Fn: func(scope *model.Scope, x *Node) *Node {
			h := norm.LayerNorm(scope.In("ln1"), x, -1).Done()
			x = Add(x, attention.SelfAttention(scope.In("attn"), h, heads, dim/heads).WithCausalMask(true).Done())
			h = norm.LayerNorm(scope.In("ln2"), x, -1).Done()
			h = Tanh(layers.Dense(scope.In("fc1"), h, true, 4*dim))
			return Add(x, layers.Dense(scope.In("fc2"), h, true, dim))
		}})
	}
	net.Layers = append(net.Layers, zgomlx.Layer{Scope: "/head", Fn: func(scope *model.Scope, x *Node) *Node {
		return layers.Dense(scope.In("out"), norm.LayerNorm(scope.In("ln"), x, -1).Done(), false, vocab)
	}})
	net.Loss = func(logits, labels *Node) *Node {
		logits = ConvertDType(logits, dtypes.Float32)
		logp := LogSoftmax(logits, -1)
		oneHot := OneHot(labels, vocab, dtypes.Float32)
		return Neg(ReduceAllMean(ReduceSum(Mul(logp, oneHot), -1)))
	}
	return net
}

// clone copies a Store (values included).
func clone(t testing.TB, s *model.Store) *model.Store {
	t.Helper()
	c, err := s.Clone()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lmBatch is a synthetic next-token task: each sequence counts up from a
// start token modulo the vocabulary (so the next token is learnable).
func lmBatch(step, batch, seq, vocab int) (x, y *tensors.Tensor) {
	xs := make([]int32, batch*seq)
	ys := make([]int32, batch*seq)
	for b := range batch {
		start := (b*7 + step*3) % vocab
		for s := range seq {
			xs[b*seq+s] = int32((start + s) % vocab)
			ys[b*seq+s] = int32((start + s + 1) % vocab)
		}
	}
	return tensors.FromFlatDataAndDimensions(xs, batch, seq), tensors.FromFlatDataAndDimensions(ys, batch, seq)
}

// sameBytes fails the test at the first byte that differs.
func sameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
		}
	}
}

// valueBytes copies a tensor's bytes.
func valueBytes(t testing.TB, v *tensors.Tensor) []byte {
	t.Helper()
	var out []byte
	if err := v.ConstBytes(func(b []byte) { out = append([]byte(nil), b...) }); err != nil {
		t.Fatal(err)
	}
	return out
}

// noFusionForHalf turns GoMLX's fused ops off for a bf16/fp16 case: the
// Go backend of compute v0.1.2 builds a fused dense for them and then has
// no kernel to run it ("op not implemented"); the decomposed ops work.
func noFusionForHalf(t *testing.T, name string) {
	if strings.Contains(name, "BFloat16") || strings.Contains(name, "Float16") {
		t.Setenv(FusionEnv, "false")
	}
}

// asFloat32s copies a float32 tensor's values.
func asFloat32s(t testing.TB, v *tensors.Tensor) []float32 {
	t.Helper()
	out, err := tensors.CopyFlatData[float32](v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMain(m *testing.M) {
	slog.SetDefault(quiet)
	os.Exit(m.Run())
}

// offloadedAndWhole initializes net's variables in store for input shape
// xs, then opens the two trainers every equality test compares: zinf's
// (store moved to NVMe) and the whole-graph reference on a copy of the
// initial values (returned), with the config's Adam. Both close when the
// test ends.
func offloadedAndWhole(ctx context.Context, t *testing.T, b compute.Backend, cfg *config.Config, store *model.Store, net zgomlx.Net, xs shapes.Shape) (*zgomlx.Trainer, *reference.WholeGraph, *model.Store) {
	t.Helper()
	if _, err := zgomlx.Initialize(b, store, net, xs); err != nil {
		t.Fatal(err)
	}
	whole := clone(t, store)
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	wg, err := reference.NewWholeGraph(b, whole, net, reference.Adam(plan.Hyper(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wg.Close() })
	return tr, wg, whole
}

// stepBoth runs steps training steps on zinf's trainer and the whole-graph
// reference with the same batches (batch(step)) and fails the test at the
// first step whose losses differ in any bit; what names the offloaded run
// in the message. It returns the steps' losses.
func stepBoth(ctx context.Context, t *testing.T, tr *zgomlx.Trainer, wg *reference.WholeGraph, steps int, what string, batch func(step int) (x, y *tensors.Tensor)) []float32 {
	t.Helper()
	losses := make([]float32, steps)
	for step := range steps {
		x, y := batch(step)
		lo, err := tr.Step(ctx, x, y)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		lw, err := wg.Step(x, y)
		if err != nil {
			t.Fatal(err)
		}
		if lo != lw {
			t.Fatalf("step %d: loss %v %s, %v whole graph", step, lo, what, lw)
		}
		losses[step] = lo
	}
	return losses
}
