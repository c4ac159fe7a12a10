package swapper

import (
	"fmt"

	"github.com/zinfio/zinf/buffers"
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
)

// Size returns the bytes per element.
func (d DType) Size() int {
	if d == Float32 {
		return 4
	}
	return 2
}

// String returns "fp32", "bf16" or "fp16".
func (d DType) String() string {
	switch d {
	case BFloat16:
		return "bf16"
	case Float16:
		return "fp16"
	}
	return "fp32"
}

// SafetensorsName returns the dtype's safetensors spelling (F32, BF16, F16).
func (d DType) SafetensorsName() string {
	switch d {
	case BFloat16:
		return "BF16"
	case Float16:
		return "F16"
	}
	return "F32"
}

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
	return 0, fmt.Errorf("swapper: unknown dtype %q (allowed: fp32, bf16, fp16)", s)
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

// Encode converts src (fp32) into dst as len(src) little-endian elements of
// d; dst must hold len(src)*d.Size() bytes.
func Encode(d DType, dst []byte, src []float32) {
	switch d {
	case BFloat16:
		buffers.Float32ToBFloat16(buffers.BFloat16Bytes(dst), src)
	case Float16:
		buffers.Float32ToFloat16(buffers.Float16Bytes(dst), src)
	default:
		copy(buffers.Float32Bytes(dst), src)
	}
}

// Decode converts len(dst) little-endian elements of d in src to fp32.
func Decode(d DType, dst []float32, src []byte) {
	switch d {
	case BFloat16:
		buffers.BFloat16ToFloat32(dst, buffers.BFloat16Bytes(src))
	case Float16:
		buffers.Float16ToFloat32(dst, buffers.Float16Bytes(src))
	default:
		copy(dst, buffers.Float32Bytes(src))
	}
}
