package policy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/zinfio/zinf/tensor"
)

// ModelSpec describes the simulated model of zinf's examples: Layers dense
// layers of Width x Width weights and Width biases.
type ModelSpec struct {
	// Layers is the number of dense layers (required, 1..MaxModelLayers).
	Layers int
	// Width is each layer's input and output size (required,
	// 1..MaxModelWidth).
	Width int
	// DType is the parameters' dtype. Default fp32.
	DType tensor.DType
	// Batch is the samples per micro-step. Default 1.
	Batch int
	// World is the data-parallel world size the parameters are partitioned
	// over (ZeRO-3). Default 1.
	World int
}

// Bounds of a model spec: a width keeps width*width elements far from
// overflowing an int64 byte count; the layer count bounds the inventory.
const (
	MaxModelLayers = 1 << 20
	MaxModelWidth  = 1 << 20
	MaxModelBatch  = 1 << 30
	MaxModelWorld  = 1 << 16
)

// modelKeys lists the keys of a model spec, in canonical order.
const modelKeys = "layers, width, dtype, batch, world"

// ParseModelSpec reads a spec such as
// "layers=24,width=4096,dtype=bf16,batch=8,world=1": comma-separated
// key=value pairs, in any order, spaces around them ignored. layers and
// width are required; dtype (fp32, bf16, fp16) defaults to fp32, batch and
// world to 1. An error names the key and what it allows.
func ParseModelSpec(s string) (ModelSpec, error) {
	m := ModelSpec{DType: tensor.Float32, Batch: 1, World: 1}
	seen := map[string]bool{}
	if strings.TrimSpace(s) == "" {
		return ModelSpec{}, invalidf("model spec is empty: want key=value pairs, e.g. layers=24,width=4096,dtype=bf16,batch=8,world=1")
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return ModelSpec{}, invalidf("model spec %q: empty item between commas", s)
		}
		key, val, ok := strings.Cut(part, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if !ok {
			return ModelSpec{}, invalidf("model spec %q: item %q is not key=value (keys: %s)", s, part, modelKeys)
		}
		if seen[key] {
			return ModelSpec{}, invalidf("model spec %q: key %s given twice", s, key)
		}
		seen[key] = true
		intIn := func(lo, hi int) (int, error) {
			n, err := strconv.Atoi(val)
			if err != nil || n < lo || n > hi {
				return 0, invalidf("model spec: %s=%q: want an integer in %d..%d", key, val, lo, hi)
			}
			return n, nil
		}
		var err error
		switch key {
		case "layers":
			m.Layers, err = intIn(1, MaxModelLayers)
		case "width":
			m.Width, err = intIn(1, MaxModelWidth)
		case "batch":
			m.Batch, err = intIn(1, MaxModelBatch)
		case "world":
			m.World, err = intIn(1, MaxModelWorld)
		case "dtype":
			m.DType, err = tensor.ParseDType(val)
			if err != nil {
				err = invalidf("model spec: dtype=%q: want fp32, bf16 or fp16", val)
			}
		default:
			err = invalidf("model spec: unknown key %q (keys: %s)", key, modelKeys)
		}
		if err != nil {
			return ModelSpec{}, err
		}
	}
	for _, k := range []string{"layers", "width"} {
		if !seen[k] {
			return ModelSpec{}, invalidf("model spec %q: %s is required (a positive integer)", s, k)
		}
	}
	return m, nil
}

// String returns the spec in ParseModelSpec's canonical form.
func (m ModelSpec) String() string {
	return fmt.Sprintf("layers=%d,width=%d,dtype=%s,batch=%d,world=%d", m.Layers, m.Width, m.DType, m.Batch, m.World)
}

// ParamCount is the number of parameters of the whole (unpartitioned)
// model.
func (m ModelSpec) ParamCount() int64 {
	w := int64(m.Width)
	return int64(m.Layers) * (w*w + w)
}

// FLOPsPerLayer is one layer's forward+backward floating-point work for
// one micro-step: 2 operations per weight and sample forward, 4 backward.
// Divided by a device's FLOP/s it gives Hints.ComputeSecondsPerLayer.
func (m ModelSpec) FLOPsPerLayer() float64 {
	w := float64(m.Width)
	return 6 * float64(max(m.Batch, 1)) * (w*w + w)
}

// Tensors describes the model's parameters in forward order, each with
// its full shape and layer: per layer the Width x Width weight
// ("layer%03d.weight") and the Width bias ("layer%03d.bias"). It is the
// model description zinf.Open and zinf.PlanModel take.
func (m ModelSpec) Tensors() []tensor.Desc {
	out := make([]tensor.Desc, 0, 2*max(m.Layers, 0))
	for l := 0; l < m.Layers; l++ {
		out = append(out, tensor.Desc{Name: fmt.Sprintf(weightName, l), Shape: []int{m.Width, m.Width}, Layer: l},
			tensor.Desc{Name: fmt.Sprintf(biasName, l), Shape: []int{m.Width}, Layer: l})
	}
	return out
}

// Parameter, gradient and optimizer-state names.
const (
	weightName = "layer%03d.weight"
	biasName   = "layer%03d.bias"
)

// partition returns this rank's share of n elements: every rank holds
// ceil(n/world) (the last one padded), as ZeRO-3 partitions.
func partition(n int64, world int) int64 {
	w := int64(world)
	return (n + w - 1) / w
}

// Inventory lists this rank's tensors: per layer the weight and bias
// partitions in DType ("layer%03d.weight", "layer%03d.bias"), their fp32
// gradient partitions (".grad"), and per parameter three fp32 optimizer
// states (".master", ".exp_avg", ".exp_avg_sq"). Every partition is
// ceil(numel/world) elements, so the sizes are the same on every rank;
// world <= 0 means m.World. Order is the order of use: forward layer
// 0..L-1 (parameters), backward L-1..0 (gradients produced), then the
// optimizer step layer by layer.
func (m ModelSpec) Inventory(rank, world int) []Tensor {
	_ = rank // every rank's partition has the same size
	if world <= 0 {
		world = max(m.World, 1)
	}
	L := m.Layers
	w := int64(m.Width)
	numel := [2]int64{w * w, w}
	names := [2]string{weightName, biasName}
	ps := int64(m.DType.Size())
	out := make([]Tensor, 0, L*2*5)
	order := 0
	for l := 0; l < L; l++ {
		for i := range names {
			out = append(out, Tensor{Name: fmt.Sprintf(names[i], l), Bytes: partition(numel[i], world) * ps, Kind: Param, Layer: l, Order: order})
			order++
		}
	}
	for l := L - 1; l >= 0; l-- {
		for i := range names {
			out = append(out, Tensor{Name: fmt.Sprintf(names[i], l) + gradSuffix, Bytes: partition(numel[i], world) * 4, Kind: Grad, Layer: l, Order: order})
			order++
		}
	}
	for l := 0; l < L; l++ {
		for i := range names {
			for _, s := range []string{".master", ".exp_avg", ".exp_avg_sq"} {
				out = append(out, Tensor{Name: fmt.Sprintf(names[i], l) + s, Bytes: partition(numel[i], world) * 4, Kind: OptimState, Layer: l, Order: order})
				order++
			}
		}
	}
	return out
}

// InventoryOf is the inventory of a model given as tensor descriptions
// (each with its full element count in numel, by name), for one rank of
// world: every parameter in dtype, its fp32 gradient and its fp32 optimizer
// states (master, exp_avg, exp_avg_sq), each sized as the rank's ZeRO-3
// partition, in order of use: parameters in forward order, gradients in
// backward order, then the optimizer states.
func InventoryOf(descs []tensor.Desc, numel map[string]int64, dtype tensor.DType, world int) []Tensor {
	world = max(world, 1)
	ps := int64(dtype.Size())
	out := make([]Tensor, 0, len(descs)*5)
	byLayer := append([]tensor.Desc(nil), descs...)
	sort.SliceStable(byLayer, func(i, j int) bool { return byLayer[i].Layer < byLayer[j].Layer })
	order := 0
	for _, d := range byLayer {
		out = append(out, Tensor{Name: d.Name, Bytes: partition(numel[d.Name], world) * ps, Kind: Param, Layer: d.Layer, Order: order})
		order++
	}
	for i := len(byLayer) - 1; i >= 0; i-- {
		d := byLayer[i]
		out = append(out, Tensor{Name: d.Name + gradSuffix, Bytes: partition(numel[d.Name], world) * 4, Kind: Grad, Layer: d.Layer, Order: order})
		order++
	}
	for _, d := range byLayer {
		for _, s := range []string{".master", ".exp_avg", ".exp_avg_sq"} {
			out = append(out, Tensor{Name: d.Name + s, Bytes: partition(numel[d.Name], world) * 4, Kind: OptimState, Layer: d.Layer, Order: order})
			order++
		}
	}
	return out
}
