package swapper

import (
	"fmt"
	"unsafe"

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
// no Go heap. src and dst need no alignment.
func Transcode(from DType, src []byte, to DType, dst []byte) {
	if from == to {
		copy(dst, src)
		return
	}
	fs, ts := from.Size(), to.Size()
	n := len(src) / fs
	if to == Float32 && aligned(src, fs) && aligned(dst, ts) {
		// Widening to float32 (a narrower model computed in fp32): decode
		// straight into dst, no stack round trip.
		Decode(from, buffers.Float32Bytes(dst[:n*ts]), src[:n*fs])
		return
	}
	var tmp [transcodeChunk]float32
	var raw [transcodeChunk]float32 // aligned bytes for a misaligned src or dst chunk
	for n > 0 {
		c := min(transcodeChunk, n)
		s, d := src[:c*fs], dst[:c*ts]
		if !aligned(s, fs) {
			s = buffers.AsBytes(raw[:])[:c*fs]
			copy(s, src)
		}
		Decode(from, tmp[:c], s)
		if aligned(d, ts) {
			Encode(to, d, tmp[:c])
		} else {
			r := buffers.AsBytes(raw[:])[:c*ts]
			Encode(to, r, tmp[:c])
			copy(d, r)
		}
		src, dst, n = src[c*fs:], dst[c*ts:], n-c
	}
}

// aligned says b starts on a multiple of size bytes (Decode and Encode
// view the bytes as elements, and a misaligned view is refused).
func aligned(b []byte, size int) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(size) == 0
}
