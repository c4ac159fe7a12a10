// Package tensor is zinf's shared vocabulary: the element types (DType),
// the tiers a tensor can live on (Tier) and the description of a tensor a
// model is made of (Desc). It is a leaf: every layer — policy, the
// swappers, checkpoints and the root package — may import it, and it
// imports nothing of zinf.
package tensor

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor in memory and on disk.
type DType uint8

const (
	// Float32 is IEEE binary32.
	Float32 DType = iota
	// BFloat16 is the upper half of a binary32.
	BFloat16
	// Float16 is IEEE binary16.
	Float16
	// Uint8 is an unsigned byte: the codes of 8-bit optimizer states in
	// checkpoints (zinf.optimizer_states "8bit"). No parameter is stored
	// or computed in it: Valid reports false, and ParseDType does not
	// read it (checkpoint headers spell it "U8").
	Uint8
)

// Size returns the bytes per element.
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case Uint8:
		return 1
	}
	return 2
}

// String returns "fp32", "bf16", "fp16" or "uint8".
func (d DType) String() string {
	switch d {
	case BFloat16:
		return "bf16"
	case Float16:
		return "fp16"
	case Uint8:
		return "uint8"
	}
	return "fp32"
}

// SafetensorsName returns the dtype's safetensors spelling (F32, BF16, F16,
// U8).
func (d DType) SafetensorsName() string {
	switch d {
	case BFloat16:
		return "BF16"
	case Float16:
		return "F16"
	case Uint8:
		return "U8"
	}
	return "F32"
}

// Valid reports whether d is one of the dtypes tensors are stored and
// computed in (Float32, BFloat16, Float16; not Uint8, which only holds
// codes in checkpoints).
func (d DType) Valid() bool { return d <= Float16 }

// ParseDType reads "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16".
func ParseDType(s string) (DType, error) {
	switch s {
	case "fp32", "float32", "f32", "F32":
		return Float32, nil
	case "bf16", "bfloat16", "BF16":
		return BFloat16, nil
	case "fp16", "float16", "half", "F16":
		return Float16, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (allowed: fp32, bf16, fp16)", s)
}

// Tier is where a tensor lives.
type Tier uint8

const (
	// TierNVMe: on NVMe, swapped in when used.
	TierNVMe Tier = iota
	// TierCPU: in pinned host memory for the whole run.
	TierCPU
	// TierGPU: in accelerator memory for the whole run.
	TierGPU
)

// String returns "nvme", "cpu" or "gpu".
func (t Tier) String() string {
	switch t {
	case TierCPU:
		return "cpu"
	case TierGPU:
		return "gpu"
	}
	return "nvme"
}

// MaxElems bounds the elements of one tensor (2^40): far above any real
// parameter, and small enough that element and byte counts never overflow.
const MaxElems = int64(1) << 40

// Desc describes one tensor of a model: what a runtime needs to know
// before it has seen a value.
type Desc struct {
	// Name identifies the tensor; unique in a model.
	Name string
	// Shape is the tensor's full (unpartitioned) shape. Every dimension is
	// >= 1; a scalar has an empty shape and one element.
	Shape []int
	// Layer is the index of the layer that uses the tensor, in forward
	// order (0 first). It is the unit of prefetch and release.
	Layer int
}

// Numel returns the number of elements of the full tensor, or an error
// when a dimension is not positive or the product exceeds MaxElems.
func (d Desc) Numel() (int64, error) {
	n := int64(1)
	for i, s := range d.Shape {
		if s < 1 {
			return 0, fmt.Errorf("tensor %q: shape %v: dimension %d is %d (allowed: >= 1)", d.Name, d.Shape, i, s)
		}
		if n > MaxElems/int64(s) {
			return 0, fmt.Errorf("tensor %q: shape %v: more than %d elements", d.Name, d.Shape, MaxElems)
		}
		n *= int64(s)
	}
	return n, nil
}

// String formats d as name[shape]@layer.
func (d Desc) String() string {
	dims := make([]string, len(d.Shape))
	for i, s := range d.Shape {
		dims[i] = fmt.Sprint(s)
	}
	return fmt.Sprintf("%s[%s]@%d", d.Name, strings.Join(dims, "x"), d.Layer)
}

// ErrClosed is what every "closed" error of zinf's packages matches with
// errors.Is: the runtime's (zinf.ErrClosed is this one), the engine's,
// the pool's, the stores', the swappers', the device's and the
// checkpoint writer's, so a caller checks one sentinel whatever layer
// noticed the Close. Each package keeps its own sentinel (made with
// ClosedError) for callers of that package.
var ErrClosed = closedError("closed")

// ClosedError returns a package's "closed" sentinel: an error with the
// message msg that matches itself and ErrClosed with errors.Is.
func ClosedError(msg string) error { return closedError(msg) }

type closedError string

func (e closedError) Error() string { return string(e) }

// Is reports ErrClosed.
func (e closedError) Is(target error) bool { return target == ErrClosed }
