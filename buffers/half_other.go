//go:build !amd64

package buffers

// widenBF16 has no vector kernel on this architecture: the caller's
// scalar loop does every value.
func widenBF16([]float32, []BFloat16) int { return 0 }

// narrowBF16 has no vector kernel on this architecture: the caller's
// scalar loop does every value.
func narrowBF16([]BFloat16, []float32) int { return 0 }
