// Package zgomlxtest holds what tests of code that trains through
// contrib/gomlx need again and again, as net/http/httptest does for
// servers: the backend, a small MLP and its batches, a seeded Store and a
// bit-for-bit comparison of tensors. The tests of contrib/gomlx and of its
// reference package train and compare with it, so they keep training the
// same model.
package zgomlxtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive // graph-building code reads as math
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// Backend is the pure-Go backend the package supports
// (zgomlx.DefaultBackend); the test fails if it cannot be made.
func Backend(t testing.TB) compute.Backend {
	t.Helper()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// MLP is a deep MLP: dense+tanh layers of the given widths, the last one
// linear (the head); the loss is the mean squared error.
func MLP(widths ...int) zgomlx.Net {
	var net zgomlx.Net
	for i, w := range widths {
		last := i == len(widths)-1
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

// MLPBatch is a deterministic regression batch of batch rows: inputs in
// [-1, 1) and targets a smooth function of them; step varies the values.
func MLPBatch(step, batch, in, out int) (x, y *tensors.Tensor) {
	xs := make([]float32, batch*in)
	for i := range xs {
		xs[i] = float32((i*37+step*11)%101)/50.5 - 1
	}
	ys := make([]float32, batch*out)
	for i := range ys {
		ys[i] = float32(math.Sin(float64(xs[(i*7)%len(xs)]) * 2))
	}
	return tensors.FromFlatDataAndDimensions(xs, batch, in), tensors.FromFlatDataAndDimensions(ys, batch, out)
}

// NewStore initializes net's variables for input shape x with a seed.
func NewStore(t testing.TB, b compute.Backend, net zgomlx.Net, x shapes.Shape, seed int64) *model.Store {
	t.Helper()
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, seed)
	if _, err := zgomlx.Initialize(b, store, net, x); err != nil {
		t.Fatal(err)
	}
	return store
}

// SameBits fails the test at the first element whose bits differ.
func SameBits(t testing.TB, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d elements, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v (%#08x), want %v (%#08x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}
