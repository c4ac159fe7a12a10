package gguf

import (
	"fmt"
	"math"
)

// Value is one metadata value: a scalar (uint8 ... float64, bool, string)
// or an array of scalars of one type. Arrays of arrays are not read
// (llama.cpp refuses them too).
type Value struct {
	// Type is the value's type; Elem is an Array's element type.
	Type, Elem ValueType
	v          any
}

// Any returns the value as Go holds it: uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64 or float64, or a
// slice of one of them for an Array.
func (v Value) Any() any { return v.v }

// Len returns an Array's length (0 for a scalar).
func (v Value) Len() int {
	switch a := v.v.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	}
	return 0
}

// Int returns an integer scalar of any width as an int64; ok is false for
// another type or a uint64 above math.MaxInt64.
func (v Value) Int() (n int64, ok bool) {
	switch x := v.v.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

// Float returns a float32 or float64 scalar as a float64.
func (v Value) Float() (float64, bool) {
	switch x := v.v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// Str returns a string scalar.
func (v Value) Str() (string, bool) { s, ok := v.v.(string); return s, ok }

// Bool returns a bool scalar.
func (v Value) Bool() (bool, bool) { b, ok := v.v.(bool); return b, ok }

// Strings returns an array of strings (shared, not copied).
func (v Value) Strings() ([]string, bool) { s, ok := v.v.([]string); return s, ok }

// Float32s returns an array of float32 (shared, not copied).
func (v Value) Float32s() ([]float32, bool) { s, ok := v.v.([]float32); return s, ok }

// Int32s returns an array of int32 (shared, not copied).
func (v Value) Int32s() ([]int32, bool) { s, ok := v.v.([]int32); return s, ok }

// String formats the value for messages; a long array shows its type and
// length only.
func (v Value) String() string {
	if v.Type == Array {
		if v.Len() <= 8 {
			return fmt.Sprintf("%v", v.v)
		}
		return fmt.Sprintf("[%d %v values]", v.Len(), v.Elem)
	}
	if s, ok := v.v.(string); ok {
		if len(s) > 64 {
			s = s[:64] + "..."
		}
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprint(v.v)
}

// valueOf wraps a Go value the writer stores: one of the scalar types
// Any lists, an int (stored as int64 when it does not fit int32, else
// int32), or a slice of one of them.
func valueOf(x any) (Value, error) {
	scalar := func(t ValueType) (Value, error) { return Value{Type: t, v: x}, nil }
	array := func(t ValueType) (Value, error) { return Value{Type: Array, Elem: t, v: x}, nil }
	switch y := x.(type) {
	case uint8:
		return scalar(Uint8)
	case int8:
		return scalar(Int8)
	case uint16:
		return scalar(Uint16)
	case int16:
		return scalar(Int16)
	case uint32:
		return scalar(Uint32)
	case int32:
		return scalar(Int32)
	case float32:
		return scalar(Float32)
	case bool:
		return scalar(Bool)
	case string:
		return scalar(String)
	case uint64:
		return scalar(Uint64)
	case int64:
		return scalar(Int64)
	case float64:
		return scalar(Float64)
	case int:
		if int64(y) == int64(int32(y)) {
			return Value{Type: Int32, v: int32(y)}, nil
		}
		return Value{Type: Int64, v: int64(y)}, nil
	case []uint8:
		return array(Uint8)
	case []int8:
		return array(Int8)
	case []uint16:
		return array(Uint16)
	case []int16:
		return array(Int16)
	case []uint32:
		return array(Uint32)
	case []int32:
		return array(Int32)
	case []float32:
		return array(Float32)
	case []bool:
		return array(Bool)
	case []string:
		return array(String)
	case []uint64:
		return array(Uint64)
	case []int64:
		return array(Int64)
	case []float64:
		return array(Float64)
	}
	return Value{}, fmt.Errorf("gguf: a metadata value of Go type %T (allowed: the fixed-size integers, float32, float64, bool, string, int, and slices of them)", x)
}
