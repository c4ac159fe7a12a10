package reference_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/contrib/gomlx/zgomlxtest"
	"github.com/zinfio/zinf/plan"
)

// mlp is a three-layer MLP with a mean squared error loss, for batches
// of 4 x 5 inputs and 4 x 3 targets.
func mlp() zgomlx.Net { return zgomlxtest.MLP(16, 12, 3) }

func batch(step int) (x, y *tensors.Tensor) { return zgomlxtest.MLPBatch(step, 4, 5, 3) }

// TestMemoryTrainerEqualsWholeGraph: the in-memory per-layer reference
// and GoMLX's usual whole-graph training with zinf's Adam give the same
// gradients, losses and weights, bit for bit, through the package's
// public API only.
func TestMemoryTrainerEqualsWholeGraph(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	b := zgomlxtest.Backend(t)
	net := mlp()
	store := zgomlxtest.NewStore(t, b, net, shapes.Make(dtypes.Float32, 4, 5), 7)
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
		zgomlxtest.SameBits(t, "gradient of "+name+" (per layer against whole)", got[name], w)
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
	b := zgomlxtest.Backend(t)
	cfg := config.Default()
	cfg.GradientClipping = 1
	_, err := reference.NewMemoryTrainer(b, model.NewStore(), mlp(), cfg, zgomlx.Options{})
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
