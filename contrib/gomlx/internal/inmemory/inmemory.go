// Package inmemory is how package reference runs zgomlx's per-layer
// executors over variables that stay in a model.Store, in Go memory: the
// reference (MemoryTrainer) steps through the very executors, in the very
// order, the offloaded Trainer does, so that the two can be compared bit
// for bit, yet zgomlx exports neither its executors nor its loop. zgomlx
// sets the functions below when it is initialized; package reference,
// which imports zgomlx, calls them.
//
// A net is a zgomlx.Net. This package cannot name the type (zgomlx
// imports it), so a net passes as any, and zgomlx asserts it.
package inmemory

import (
	"context"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"

	"github.com/zinfio/zinf/tensor"
)

// Var is one variable the executors read from the Store, in the order
// the offloaded Trainer registers them (by layer, then creation order).
type Var struct {
	// Name is the variable's path in the Store.
	Name string
	// DType is the variable's dtype in zinf's vocabulary.
	DType tensor.DType
	// Bytes are the Store value's bytes: what the executors read, and
	// where an update writes the new value.
	Bytes []byte
}

// Grad receives variable i's gradient of a micro-step, in fp32 (valid
// during the call only); last says it is the step's last micro-step.
type Grad func(i int, g []float32, last bool) error

// Run is a Net's per-layer executors over the Store's own values.
type Run interface {
	// Step runs one micro-step (forward, loss, backward, every gradient
	// to the Grad) and returns its loss.
	Step(ctx context.Context, xs, labels []*tensors.Tensor, last bool) (float32, error)
	// Compute is the executors' run time so far, and its part in each
	// layer (as zgomlx.Timings counts them).
	Compute() (total time.Duration, perLayer []time.Duration)
	// Close frees the executors.
	Close()
}

// The functions zgomlx sets in its init.
var (
	// Open builds net's executors over store's variables that filter
	// selects (nil: zgomlx.DefaultFilter), grouped by layers (empty: the
	// net's scopes); every one needs a value. Their gradients go to grad.
	Open func(backend compute.Backend, store *model.Store, net any, filter func(*model.Variable) bool, layers []string, grad Grad) (Run, []Var, error)
	// Check reports what is wrong with net, as zgomlx's constructors do.
	Check func(net any) error
	// Graph builds net whole in one graph (each layer in its scope, a
	// Net.Head written blockwise) and returns its loss.
	Graph func(store *model.Store, net any, xs, labels []*graph.Node) *graph.Node
	// Loss is the loss a Net with TrainLoss fn builds from its
	// predictions ys: averaged when fn's is not a scalar.
	Loss func(fn train.LossFn, ys, labels []*graph.Node) *graph.Node
)
