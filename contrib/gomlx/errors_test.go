package zgomlx_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// TestBadNetsAreRefused: a Net or a layer the per-layer executors cannot
// run is refused with an error naming the layer and what is wrong.
func TestBadNetsAreRefused(t *testing.T) {
	ctx := watchdog(t, 2*time.Minute)
	b := backend(t)
	good := mlpNet(8, 3)
	xs := shapes.Make(dtypes.Float32, 2, 4)
	for _, c := range []struct {
		name string
		net  zgomlx.Net
		want string
	}{
		{"no layers", zgomlx.Net{Loss: good.Loss}, "no layers"},
		{"no loss", zgomlx.Net{Layers: good.Layers}, "Net.Loss is nil"},
		{"root scope", zgomlx.Net{Layers: []zgomlx.Layer{{Scope: "/", Fn: good.Layers[0].Fn}}, Loss: good.Loss}, `scope "/"`},
		{"no fn", zgomlx.Net{Layers: []zgomlx.Layer{{Scope: "/a"}}, Loss: good.Loss}, "has no Fn"},
	} {
		if _, err := zgomlx.Initialize(b, model.NewStore(), c.net, xs); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", c.name, err, c.want)
		}
	}

	// A layer that changes a variable in its graph (a counter) cannot be
	// recomputed; a non-scalar loss is not a loss.
	counter := zgomlx.Net{Layers: []zgomlx.Layer{
		{Scope: "/dense", Fn: good.Layers[0].Fn},
		{Scope: "/counting", Fn: func(scope *model.Scope, x *Node) *Node {
			c := scope.VariableWithValue("count", float32(0)).SetTrainable(false)
			c.SetNodeValue(AddScalar(c.NodeValue(x.Graph()), 1))
			return layers.Dense(scope, x, true, 3)
		}},
	}, Loss: good.Loss}
	store := newStore(t, b, counter, xs, 1)
	tr, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), store, counter, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	x, y := mlpBatch(0, 2, 4, 3)
	if _, err := tr.Step(ctx, x, y); err == nil || !strings.Contains(err.Error(), `layer "/counting" updates variable "/counting/count"`) || errors.Is(err, zgomlx.ErrStepAborted) {
		t.Fatalf("a layer updating a variable: %v (want it named, and not as a step to run again)", err)
	}
	if _, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), model.NewStore(), counter, zgomlx.Options{}, xs); !errors.Is(err, zgomlx.ErrNotPure) {
		t.Fatalf("Create of a layer updating a variable: %v, want ErrNotPure", err)
	}

	vector := good
	vector.Loss = func(y, labels *Node) *Node { return Sub(y, labels) }
	store = newStore(t, b, vector, xs, 1)
	tr2, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), store, vector, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	if _, err := tr2.Step(ctx, x, y); err == nil || !strings.Contains(err.Error(), "a scalar is needed") {
		t.Fatalf("a non-scalar loss: %v", err)
	}
	if _, err := tr2.Step(ctx, nil, y); err == nil {
		t.Fatal("Step accepted a nil input")
	}

	// The in-memory reference mirrors Adam at a constant rate only; the
	// Trainer does not apply fp16 loss scaling.
	ref := testConfig(t, 8<<20)
	ref.Optimizer.Type = config.OptimizerSGD
	ref.GradientClipping = 1
	if _, err := reference.NewMemoryTrainer(b, newStore(t, b, good, xs, 1), good, ref, zgomlx.Options{}); err == nil ||
		!strings.Contains(err.Error(), `optimizer.type "SGD"`) || !strings.Contains(err.Error(), "gradient_clipping 1") {
		t.Fatalf("a config the reference cannot mirror: %v", err)
	}
	fp16 := testConfig(t, 8<<20)
	fp16.FP16 = true
	kept := newStore(t, b, good, xs, 1)
	if _, err := zgomlx.Create(ctx, b, fp16, kept, good, zgomlx.Options{}); err == nil || !strings.Contains(err.Error(), "fp16.enabled") {
		t.Fatalf("fp16 without loss scaling: %v", err)
	}
	if !kept.GetVariable("/dense_0/dense/weights").HasValue() {
		t.Fatal("a refused Open took the Store's values")
	}

}
