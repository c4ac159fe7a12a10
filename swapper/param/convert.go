package param

import (
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// encode converts src (fp32) into dst, len(src) elements of dt.
func encode(dt swapper.DType, dst []byte, src []float32) {
	switch dt {
	case swapper.BFloat16:
		buffers.Float32ToBFloat16(buffers.BFloat16Bytes(dst), src)
	case swapper.Float16:
		buffers.Float32ToFloat16(buffers.Float16Bytes(dst), src)
	default:
		copy(buffers.Float32Bytes(dst), src)
	}
}

// decode converts src (len(dst) elements of dt) into dst.
func decode(dt swapper.DType, dst []float32, src []byte) {
	switch dt {
	case swapper.BFloat16:
		buffers.BFloat16ToFloat32(dst, buffers.BFloat16Bytes(src))
	case swapper.Float16:
		buffers.Float16ToFloat32(dst, buffers.Float16Bytes(src))
	default:
		copy(dst, buffers.Float32Bytes(src))
	}
}
