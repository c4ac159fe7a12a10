package swapper

import (
	"fmt"

	"github.com/zinfio/zinf/buffers"
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

// transcodeChunk is how many elements Transcode converts at a time through
// a float32 array on the stack: big enough to amortize the calls, small
// enough for any goroutine stack.
const transcodeChunk = 512

// Transcode converts the little-endian elements of from in src into dst
// as elements of to: len(src)/from.Size() elements, and dst must hold as
// many of to. Conversions go through float32 (exact for bf16 and fp16),
// rounding to nearest even where to is narrower, as Encode does; nothing
// is allocated, so a swap-in into a caller's buffer of another dtype costs
// no Go heap.
func Transcode(from DType, src []byte, to DType, dst []byte) {
	if from == to {
		copy(dst, src)
		return
	}
	var tmp [transcodeChunk]float32
	fs, ts := from.Size(), to.Size()
	for len(src) >= fs {
		n := min(transcodeChunk, len(src)/fs)
		Decode(from, tmp[:n], src[:n*fs])
		Encode(to, dst[:n*ts], tmp[:n])
		src, dst = src[n*fs:], dst[n*ts:]
	}
}
