package main

import (
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/buffers"
)

// tensorBytes copies a tensor's bytes.
func tensorBytes(t *tensors.Tensor) []byte {
	var out []byte
	if err := t.ConstBytes(func(b []byte) { out = append([]byte(nil), b...) }); err != nil {
		panic(err)
	}
	return out
}

// asFloat32 widens little-endian values of dt.
func asFloat32(dt dtypes.DType, b []byte) []float32 {
	switch dt {
	case dtypes.BFloat16:
		out := make([]float32, len(b)/2)
		buffers.BFloat16ToFloat32(out, buffers.BFloat16Bytes(b))
		return out
	case dtypes.Float16:
		out := make([]float32, len(b)/2)
		buffers.Float16ToFloat32(out, buffers.Float16Bytes(b))
		return out
	}
	out := make([]float32, len(b)/4)
	copy(out, buffers.Float32Bytes(b))
	return out
}
