package swapper

import (
	"fmt"

	"github.com/zinfio/zinf/tensor"
)

// DType is the element type of a tensor; see package tensor.
type DType = tensor.DType

// The dtypes, as in package tensor.
const (
	Float32  = tensor.Float32
	BFloat16 = tensor.BFloat16
	Float16  = tensor.Float16
)

// ParseDType reads "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16".
func ParseDType(s string) (DType, error) {
	d, err := tensor.ParseDType(s)
	if err != nil {
		return 0, fmt.Errorf("swapper: %w", err)
	}
	return d, nil
}

// Tier is where a tensor lives; see package tensor.
type Tier = tensor.Tier

// The tiers, as in package tensor.
const (
	TierNVMe = tensor.TierNVMe
	TierCPU  = tensor.TierCPU
	TierGPU  = tensor.TierGPU
)
