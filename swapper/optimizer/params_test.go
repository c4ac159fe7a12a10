package optimizer_test

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestStepParams steps with per-step parameters — a zero learning rate
// (which still moves the moments), a gradient factor, replaced betas —
// through Step and a transaction, and compares with AdamStep on whole
// tensors bit for bit; invalid parameters are refused before anything is
// read.
func TestStepParams(t *testing.T) {
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h := optimizer.Hyper{LR: 1e-2, WeightDecay: 0.01, AdamW: true}
	src := &goldenGrads{}
	opt, err := optimizer.New(optimizer.Options{Pool: pool, Grads: src, Hyper: h, SubGroupSize: 7, PipelineDepth: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	sizes := map[string]int{"a": 1, "b": 23, "c": 64}
	ref := map[string][3][]float32{}
	for name, n := range sizes {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(rng.NormFloat64())
		}
		if err := opt.Register(name, w); err != nil {
			t.Fatal(err)
		}
		ref[name] = [3][]float32{append([]float32(nil), w...), make([]float32, n), make([]float32, n)}
	}
	if d := opt.DefaultParams(); d.LR != 1e-2 || d.ScaleGrads {
		t.Fatalf("DefaultParams %+v", d)
	}
	ctx := context.Background()
	steps := []optimizer.StepParams{
		{LR: 0}, // a real step at rate 0: moments move, weights do not (but decay is 1-0*wd)
		{LR: 3e-3, ScaleGrads: true, GradScale: 0.125}, // an exact unscale
		{LR: 5e-3, ScaleGrads: true, GradScale: 0.37},  // a clip factor
		{LR: 1e-3, Beta1: 0.8, Beta2: 0.99},            // OneCycle's betas
		{LR: 2e-3, ScaleGrads: true, GradScale: 0},     // a factor that underflowed
	}
	for k, p := range steps {
		src.g = map[string][]float32{}
		for name, n := range sizes {
			g := make([]float32, n)
			for i := range g {
				g[i] = float32(rng.NormFloat64() * 0.1)
			}
			src.g[name] = g
		}
		before := map[string][]float32{}
		for name := range sizes {
			before[name] = append([]float32(nil), src.g[name]...)
		}
		if k%2 == 0 {
			if err := opt.StepWith(ctx, p); err != nil {
				t.Fatal(err)
			}
		} else {
			txn, err := opt.BeginStepWith(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if txn.Params() != p {
				t.Fatalf("txn params %+v, want %+v", txn.Params(), p)
			}
			if err := txn.Tensor("b"); err != nil {
				t.Fatal(err)
			}
			if err := txn.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for name := range sizes {
			r := ref[name]
			optimizer.AdamStep(r[0], before[name], r[1], r[2], k+1, h, p)
			got, m, v, err := opt.ReadState(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			for j, pair := range [][2][]float32{{got, r[0]}, {m, r[1]}, {v, r[2]}} {
				for i := range pair[1] {
					if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
						t.Fatalf("step %d (%+v): %s state %d [%d] = %v, AdamStep %v", k+1, p, name, j, i, pair[0][i], pair[1][i])
					}
				}
			}
		}
	}
	for _, bad := range []struct {
		p    optimizer.StepParams
		want string
	}{
		{optimizer.StepParams{LR: -1}, "StepParams.LR = -1"},
		{optimizer.StepParams{LR: float32(math.NaN())}, "StepParams.LR = NaN"},
		{optimizer.StepParams{LR: 1, Beta1: 1}, "StepParams.Beta1 = 1"},
		{optimizer.StepParams{LR: 1, ScaleGrads: true, GradScale: float32(math.Inf(1))}, "StepParams.GradScale = +Inf"},
	} {
		err := opt.StepWith(ctx, bad.p)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("StepWith(%+v) = %v, want %q", bad.p, err, bad.want)
		}
		if _, err := opt.BeginStepWith(ctx, bad.p); err == nil {
			t.Errorf("BeginStepWith(%+v) accepted", bad.p)
		}
	}
	if opt.StepCount() != len(steps) {
		t.Fatalf("step count %d after %d steps and refused ones", opt.StepCount(), len(steps))
	}
}

func TestGradFactor(t *testing.T) {
	// No clipping: the unscale alone, exact for a power of two.
	if f, norm, coef := optimizer.GradFactor(16*1024*1024, 1024, 0); f != 1.0/1024 || norm != 4 || coef != 1 {
		t.Errorf("unscale: %v %v %v", f, norm, coef)
	}
	// Clipping that does not trigger: (norm + 1e-6)/c <= 1.
	if f, _, coef := optimizer.GradFactor(4, 1, 2.5); f != 1 || coef != 1 {
		t.Errorf("no trigger: %v %v", f, coef)
	}
	// Triggering: q = (2 + 1e-6)/0.5, factor 1/(q*S), as DeepSpeed combines them.
	f, norm, coef := optimizer.GradFactor(4*64*64, 64, 0.5)
	q := (2 + 1e-6) / 0.5
	if norm != 2 || f != float32(1/(q*64)) || coef != 1/q {
		t.Errorf("trigger: %v %v %v", f, norm, coef)
	}
	if _, norm, _ := optimizer.GradFactor(math.Inf(1), 1, 1); !math.IsInf(norm, 1) {
		t.Errorf("overflow norm %v", norm)
	}
	if s := optimizer.SumSquares([]float32{3, 4, float32(math.Inf(-1))}); !math.IsInf(s, 1) {
		t.Errorf("SumSquares with an inf: %v", s)
	}
	if s := optimizer.SumSquares([]float32{3, 4}); s != 25 {
		t.Errorf("SumSquares(3, 4) = %v", s)
	}
}
