//go:build !linux

package optimizer

import (
	"testing"
	"unsafe"
)

// benchMemory returns words float32s starting on a page boundary, as pool
// buffers do.
func benchMemory(b *testing.B, words int) ([]float32, func()) {
	b.Helper()
	raw := make([]float32, words+1024)
	skip := (4096 - int(uintptr(unsafe.Pointer(&raw[0]))%4096)) % 4096 / 4
	return raw[skip : skip+words], func() {}
}

// cpuSeconds is not measured here: benchmarks report wall-clock rates
// only.
func cpuSeconds() float64 { return 0 }
