package param

import (
	"github.com/zinfio/zinf/swapper"
)

// encode converts src (fp32) into dst, len(src) elements of dt.
func encode(dt swapper.DType, dst []byte, src []float32) { swapper.Encode(dt, dst, src) }

// decode converts src (len(dst) elements of dt) into dst.
func decode(dt swapper.DType, dst []float32, src []byte) { swapper.Decode(dt, dst, src) }
