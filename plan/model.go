// The model a plan is made for: its tensors by layer, checked and indexed.

package plan

import (
	"errors"
	"fmt"

	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// Model describes what a zinf.Runtime trains (zinf.Model): every tensor with
// its name, full shape and the layer that uses it. Placement, prefetch and
// pinned memory are planned from it before any value is seen.
type Model struct {
	// Tensors lists the model's parameters. Names are unique; layers are
	// numbered from 0 in forward order, and a layer may hold any number of
	// tensors (an empty layer is allowed and costs nothing).
	Tensors []tensor.Desc
	// Layers is the number of layers, when more than the last tensor's
	// layer + 1 (trailing layers without offloaded tensors). Default 0:
	// one more than the largest Desc.Layer.
	Layers int
}

// MaxModelTensors bounds Model.Tensors: far above real models, and small
// enough that a plan over them stays in memory.
const MaxModelTensors = 1 << 22

// LayeredModel builds a Model from layers in forward order: each tensor's
// Layer is set to its layer's index.
func LayeredModel(layers ...[]tensor.Desc) Model {
	m := Model{Layers: len(layers)}
	for l, ts := range layers {
		for _, t := range ts {
			t.Layer = l
			m.Tensors = append(m.Tensors, t)
		}
	}
	return m
}

// Index is a checked Model, indexed.
type Index struct {
	Descs  []tensor.Desc
	Numel  map[string]int64
	Layer  map[string]int
	Layers [][]string // tensor names per layer, in the order given
}

// Check validates m and indexes it; every problem is reported.
func (m Model) Check() (*Index, error) {
	if len(m.Tensors) == 0 {
		return nil, errors.New("zinf: model: no tensors (describe the model's parameters in Model.Tensors, e.g. with zinf.LayeredModel)")
	}
	if len(m.Tensors) > MaxModelTensors {
		return nil, fmt.Errorf("zinf: model: %d tensors (allowed: at most %d)", len(m.Tensors), MaxModelTensors)
	}
	mi := &Index{Descs: m.Tensors, Numel: make(map[string]int64, len(m.Tensors)), Layer: make(map[string]int, len(m.Tensors))}
	var errs []error
	maxLayer := 0
	for i, d := range m.Tensors {
		n, err := d.Numel()
		switch {
		case d.Name == "":
			errs = append(errs, fmt.Errorf("zinf: model: tensor %d has no name", i))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("zinf: model: %w", err))
			continue
		case d.Layer < 0 || d.Layer >= MaxModelTensors:
			errs = append(errs, fmt.Errorf("zinf: model: tensor %q: layer %d (allowed: 0..%d)", d.Name, d.Layer, MaxModelTensors-1))
			continue
		}
		if _, dup := mi.Numel[d.Name]; dup {
			errs = append(errs, fmt.Errorf("zinf: model: tensor %q is listed twice", d.Name))
			continue
		}
		mi.Numel[d.Name] = n
		mi.Layer[d.Name] = d.Layer
		maxLayer = max(maxLayer, d.Layer)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if m.Layers < 0 || m.Layers > MaxModelTensors {
		return nil, fmt.Errorf("zinf: model: Layers = %d (allowed: 0..%d)", m.Layers, MaxModelTensors)
	}
	mi.Layers = make([][]string, max(maxLayer+1, m.Layers))
	for _, d := range m.Tensors {
		mi.Layers[d.Layer] = append(mi.Layers[d.Layer], d.Name)
	}
	return mi, nil
}

// Partition is a rank's element range of a tensor of numel elements.
func Partition(numel, rank, world int) (lo, hi int) { return param.Partition(numel, rank, world) }
