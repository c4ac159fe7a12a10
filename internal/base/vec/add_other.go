//go:build !amd64

package vec

// addVec has no vector kernel on this architecture: the caller's loop
// adds every element.
func addVec([]float32, []float32) int { return 0 }

// plusZeroVec has no vector kernel on this architecture: the caller's
// loop copies every element.
func plusZeroVec([]float32, []float32) int { return 0 }

// addPairVec has no vector kernel on this architecture.
func addPairVec([]float32, []float32, []float32) int { return 0 }

// plusZeroPairVec has no vector kernel on this architecture.
func plusZeroPairVec([]float32, []float32, []float32) int { return 0 }
