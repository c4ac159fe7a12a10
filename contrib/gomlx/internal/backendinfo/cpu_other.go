//go:build !amd64

package backendinfo

// The Go backend's SIMD kernels exist for amd64 only: elsewhere the
// portable loops are all there is, and there is nothing to warn about.
func cpuHasSIMD() bool { return false }

func cpuSIMDName() string { return "" }
