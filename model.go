package zinf

import (
	"errors"
	"fmt"

	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// Model describes what a Runtime trains: every tensor with its name, full
// shape and the layer that uses it. Open plans placement, prefetch and
// pinned memory from it before any value is seen.
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

// modelInfo is a validated Model.
type modelInfo struct {
	descs  []tensor.Desc
	numel  map[string]int64
	layer  map[string]int
	layers [][]string // tensor names per layer, in the order given
}

// check validates m and indexes it; every problem is reported.
func (m Model) check() (*modelInfo, error) {
	if len(m.Tensors) == 0 {
		return nil, errors.New("zinf: model: no tensors (describe the model's parameters in Model.Tensors, e.g. with zinf.LayeredModel)")
	}
	if len(m.Tensors) > MaxModelTensors {
		return nil, fmt.Errorf("zinf: model: %d tensors (allowed: at most %d)", len(m.Tensors), MaxModelTensors)
	}
	mi := &modelInfo{descs: m.Tensors, numel: make(map[string]int64, len(m.Tensors)), layer: make(map[string]int, len(m.Tensors))}
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
		if _, dup := mi.numel[d.Name]; dup {
			errs = append(errs, fmt.Errorf("zinf: model: tensor %q is listed twice", d.Name))
			continue
		}
		mi.numel[d.Name] = n
		mi.layer[d.Name] = d.Layer
		maxLayer = max(maxLayer, d.Layer)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if m.Layers < 0 || m.Layers > MaxModelTensors {
		return nil, fmt.Errorf("zinf: model: Layers = %d (allowed: 0..%d)", m.Layers, MaxModelTensors)
	}
	mi.layers = make([][]string, max(maxLayer+1, m.Layers))
	for _, d := range m.Tensors {
		mi.layers[d.Layer] = append(mi.layers[d.Layer], d.Name)
	}
	return mi, nil
}

// partition is this rank's element range of a tensor of numel elements.
func partition(numel, rank, world int) (lo, hi int) { return param.Partition(numel, rank, world) }
