//go:build !amd64

package grad

// addVec has no vector kernel on this architecture: the caller's loop
// adds every element.
func addVec([]float32, []float32) int { return 0 }

// plusZeroVec has no vector kernel on this architecture: the caller's
// loop copies every element.
func plusZeroVec([]float32, []float32) int { return 0 }
