package gguf

import (
	"fmt"

	"github.com/zinfio/zinf/decoder/kernels"
)

// Type is a tensor's storage type as ggml numbers it (ggml_type).
type Type uint32

// The tensor types this package reads the data of; Types lists every type
// it knows the size of.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q8_0 Type = 8
	BF16 Type = 30
)

// typeInfo is a type's name and block: blockBytes bytes hold blockElems
// consecutive values of a row.
type typeInfo struct {
	name                   string
	blockElems, blockBytes int
}

// types are ggml's tensor types by number, with their block layout (the
// numbers ggml retired, 4, 5 and 31-33, 36-38, are absent: a file naming
// one is refused). The sizes are what ggml's type traits give.
var types = map[Type]typeInfo{
	0: {"f32", 1, 4}, 1: {"f16", 1, 2}, 2: {"q4_0", 32, 18}, 3: {"q4_1", 32, 20},
	6: {"q5_0", 32, 22}, 7: {"q5_1", 32, 24}, 8: {"q8_0", 32, 34}, 9: {"q8_1", 32, 40},
	10: {"q2_k", 256, 84}, 11: {"q3_k", 256, 110}, 12: {"q4_k", 256, 144}, 13: {"q5_k", 256, 176},
	14: {"q6_k", 256, 210}, 15: {"q8_k", 256, 292}, 16: {"iq2_xxs", 256, 66}, 17: {"iq2_xs", 256, 74},
	18: {"iq3_xxs", 256, 98}, 19: {"iq1_s", 256, 50}, 20: {"iq4_nl", 32, 18}, 21: {"iq3_s", 256, 110},
	22: {"iq2_s", 256, 82}, 23: {"iq4_xs", 256, 136}, 24: {"i8", 1, 1}, 25: {"i16", 1, 2},
	26: {"i32", 1, 4}, 27: {"i64", 1, 8}, 28: {"f64", 1, 8}, 29: {"iq1_m", 256, 56},
	30: {"bf16", 1, 2}, 34: {"tq1_0", 256, 54}, 35: {"tq2_0", 256, 66}, 39: {"mxfp4", 32, 17},
	40: {"nvfp4", 64, 36}, 41: {"q1_0", 128, 18}, 42: {"q2_0", 64, 18},
}

// String returns ggml's name of the type.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Known reports whether the package knows t's layout (and so a tensor's
// size in bytes).
func (t Type) Known() bool { _, ok := types[t]; return ok }

// Supported reports whether the package hands out t's data (f32, f16,
// bf16, q8_0, q4_0); a tensor of another known type is listed and its
// bytes can be read raw, but Data refuses it.
func (t Type) Supported() bool {
	switch t {
	case F32, F16, BF16, Q8_0, Q4_0:
		return true
	}
	return false
}

// supportedNames is what an error says is allowed.
const supportedNames = "f32, f16, bf16, q8_0, q4_0"

// DType returns the decoder's storage type for t: f32, bf16, q8_0 and
// q4_0 map one to one (ggml's q8_0 and q4_0 blocks are the kernels'
// layouts); f16 and every other type are refused (the decoder has no f16
// kernel: Data widens f16 to f32).
func (t Type) DType() (kernels.DType, error) {
	switch t {
	case F32:
		return kernels.F32, nil
	case BF16:
		return kernels.BF16, nil
	case Q8_0:
		return kernels.Q8_0, nil
	case Q4_0:
		return kernels.Q4_0, nil
	}
	return 0, fmt.Errorf("gguf: tensor type %v has no decoder type (allowed: f32, bf16, q8_0, q4_0; f16 is widened to f32 by Data)", t)
}

// TypeOf returns the GGUF type of a decoder storage type.
func TypeOf(t kernels.DType) (Type, error) {
	switch t {
	case kernels.F32:
		return F32, nil
	case kernels.BF16:
		return BF16, nil
	case kernels.Q8_0:
		return Q8_0, nil
	case kernels.Q4_0:
		return Q4_0, nil
	}
	return 0, fmt.Errorf("gguf: decoder type %v has no GGUF type (allowed: f32, bf16, q8_0, q4_0)", t)
}

// ValueType is the type of a metadata value (gguf_type).
type ValueType uint32

// The metadata value types, as the format numbers them.
const (
	Uint8 ValueType = iota
	Int8
	Uint16
	Int16
	Uint32
	Int32
	Float32
	Bool
	String
	Array
	Uint64
	Int64
	Float64
	numValueTypes
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

// String returns the format's name of the value type.
func (v ValueType) String() string {
	if v < numValueTypes {
		return valueTypeNames[v]
	}
	return fmt.Sprintf("value_type(%d)", uint32(v))
}

// size returns the bytes of one scalar of type v (0 for string, array and
// unknown types).
func (v ValueType) size() int {
	switch v {
	case Uint8, Int8, Bool:
		return 1
	case Uint16, Int16:
		return 2
	case Uint32, Int32, Float32:
		return 4
	case Uint64, Int64, Float64:
		return 8
	}
	return 0
}
