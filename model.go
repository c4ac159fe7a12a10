package zinf

import (
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

// Model describes what a Runtime trains: every tensor with its name, full
// shape and the layer that uses it. Open plans placement, prefetch and
// pinned memory from it before any value is seen (see plan.Model).
type Model = plan.Model

// MaxModelTensors bounds Model.Tensors: far above real models, and small
// enough that a plan over them stays in memory.
const MaxModelTensors = plan.MaxModelTensors

// LayeredModel builds a Model from layers in forward order: each tensor's
// Layer is set to its layer's index.
func LayeredModel(layers ...[]tensor.Desc) Model { return plan.LayeredModel(layers...) }

// partition is this rank's element range of a tensor of numel elements.
func partition(numel, rank, world int) (lo, hi int) { return plan.Partition(numel, rank, world) }
