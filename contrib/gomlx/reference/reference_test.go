package reference_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive // graph-building code reads as math
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/plan"
)

// mlp is a three-layer MLP with a mean squared error loss.
func mlp() zgomlx.Net {
	var net zgomlx.Net
	for i, w := range []int{16, 12, 3} {
		last := i == 2
		net.Layers = append(net.Layers, zgomlx.Layer{Scope: fmt.Sprintf("/dense_%d", i), Fn: func(scope *model.Scope, x *Node) *Node {
			y := layers.Dense(scope, x, true, w)
			if last {
				return y
			}
			return Tanh(y)
		}})
	}
	net.Loss = func(y, labels *Node) *Node {
		d := Sub(y, labels)
		return ReduceAllMean(Mul(d, d))
	}
	return net
}

func batch(step int) (x, y *tensors.Tensor) {
	xs := make([]float32, 4*5)
	for i := range xs {
		xs[i] = float32((i*37+step*11)%101)/50.5 - 1
	}
	ys := make([]float32, 4*3)
	for i := range ys {
		ys[i] = float32(math.Sin(float64(xs[(i*7)%len(xs)]) * 2))
	}
	return tensors.FromFlatDataAndDimensions(xs, 4, 5), tensors.FromFlatDataAndDimensions(ys, 4, 3)
}

// TestMemoryTrainerEqualsWholeGraph: the in-memory per-layer reference
// and GoMLX's usual whole-graph training with zinf's Adam give the same
// gradients, losses and weights, bit for bit, through the package's
// public API only.
func TestMemoryTrainerEqualsWholeGraph(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	net := mlp()
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(7))
	if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Float32, 4, 5)); err != nil {
		t.Fatal(err)
	}
	whole, err := store.Clone()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Optimizer.LR = 0.01

	x, y := batch(0)
	wantLoss, want, err := reference.WholeGraphGradients(b, whole, net, nil, x, y)
	if err != nil {
		t.Fatal(err)
	}
	mt, err := reference.NewMemoryTrainer(b, store, net, cfg, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mt.Close()
	loss, got, err := mt.Gradients(ctx, x, y)
	if err != nil {
		t.Fatal(err)
	}
	if loss != wantLoss || len(got) != len(want) || len(got) == 0 {
		t.Fatalf("loss %v and %d gradients per layer, %v and %d whole", loss, len(got), wantLoss, len(want))
	}
	for name, w := range want {
		for i := range w {
			if math.Float32bits(got[name][i]) != math.Float32bits(w[i]) {
				t.Fatalf("gradient of %s[%d]: %v per layer, %v whole", name, i, got[name][i], w[i])
			}
		}
	}

	wg, err := reference.NewWholeGraph(b, whole, net, reference.Adam(plan.Hyper(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Close()
	for step := range 3 {
		x, y := batch(step)
		a, err := mt.Step(ctx, x, y)
		if err != nil {
			t.Fatal(err)
		}
		w, err := wg.Step(x, y)
		if err != nil {
			t.Fatal(err)
		}
		if a != w {
			t.Fatalf("step %d: loss %v per layer in memory, %v whole graph", step, a, w)
		}
	}
	if mt.Steps() != 3 {
		t.Errorf("Steps() = %d, want 3", mt.Steps())
	}
	for v := range store.IterVariables() {
		if !v.Trainable {
			continue
		}
		a, err := v.Value()
		if err != nil {
			t.Fatal(err)
		}
		wv := whole.GetVariable(v.Path())
		w, err := wv.Value()
		if err != nil {
			t.Fatal(err)
		}
		if !a.Equal(w) {
			t.Errorf("%s differs after 3 steps", v.Path())
		}
	}
}

// TestMemoryTrainerRefusals: a config whose step the reference does not
// reproduce is refused, naming the key and what is allowed.
func TestMemoryTrainerRefusals(t *testing.T) {
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.GradientClipping = 1
	_, err = reference.NewMemoryTrainer(b, model.NewStore(), mlp(), cfg, zgomlx.Options{})
	if err == nil || !strings.Contains(err.Error(), "gradient_clipping 1 (allowed: 0)") {
		t.Fatalf("gradient clipping: err %v", err)
	}
	_, err = reference.NewMemoryTrainer(b, model.NewStore(), zgomlx.Net{}, config.Default(), zgomlx.Options{})
	if err == nil || !strings.Contains(err.Error(), "Net has no layers") {
		t.Fatalf("empty Net: err %v", err)
	}
	if _, err := reference.NewWholeGraph(b, model.NewStore(), mlp(), nil); err == nil || !strings.Contains(err.Error(), "nil optimizer") {
		t.Fatalf("nil optimizer: err %v", err)
	}
}
