package zgomlx_test

import (
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestCreateWithAndWithoutShapes: Create is the one constructor of a
// Trainer. Given the first layer's input shapes it creates and
// initializes the variables layer by layer; given none it registers a
// Store whose variables have values; the two Trainers over the same
// initial values take the same step. A Net whose first layer takes two
// inputs is given both shapes.
func TestCreateWithAndWithoutShapes(t *testing.T) {
	ctx := watchdog(t, 2*time.Minute)
	b := backend(t)
	net := mlpNet(8, 3)
	x := shapes.Make(dtypes.Float32, 4, 5)
	bx, by := mlpBatch(0, 4, 5, 3)

	fresh := model.NewStore()
	fresh.SetParam(model.ParamInitialSeed, int64(5))
	created, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), fresh, net, zgomlx.Options{}, x)
	if err != nil {
		t.Fatal(err)
	}
	defer created.Close()
	registered, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), newStore(t, b, net, x, 5), net, zgomlx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer registered.Close()
	a, err := created.Step(ctx, bx, by)
	if err != nil {
		t.Fatal(err)
	}
	r, err := registered.Step(ctx, bx, by)
	if err != nil {
		t.Fatal(err)
	}
	if a != r {
		t.Fatalf("first step's loss %v created from shapes, %v registered with values", a, r)
	}

	two := zgomlx.Net{
		Layers: []zgomlx.Layer{{Scope: "/sum", FnN: func(scope *model.Scope, xs []*Node) []*Node {
			return []*Node{layers.Dense(scope, Add(xs[0], xs[1]), true, 3)}
		}}},
		Loss: func(y, labels *Node) *Node { d := Sub(y, labels); return ReduceAllMean(Mul(d, d)) },
	}
	if _, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), model.NewStore(), two, zgomlx.Options{}, x); err == nil {
		t.Fatal("Create of a two-input Net given one shape: no error")
	}
	tr, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), model.NewStore(), two, zgomlx.Options{}, x, x)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.StepN(ctx, []*tensors.Tensor{bx, bx}, []*tensors.Tensor{by}); err != nil {
		t.Fatal(err)
	}
}
