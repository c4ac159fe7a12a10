package optimizer

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAdamSplit: an update split over any number of workers, at lengths
// around the chunk boundaries, updates every element exactly once, on
// every kernel: the bits equal one scalar call over the whole range.
func TestAdamSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	lens := []int{0, 1, 17, minChunk - 1, minChunk, minChunk + 1, 2*minChunk - 1, 2 * minChunk, 2*minChunk + 17, 5*minChunk + 3, 41*minChunk + 5}
	if testing.Short() {
		lens = lens[:7]
	}
	a := newAdamArgs(4, Hyper{LR: 1e-2, WeightDecay: 0.1})
	for _, n := range lens {
		var ops [4][]float32
		for k := range ops {
			ops[k] = make([]float32, n)
			for i := range ops[k] {
				ops[k][i] = float32(r.NormFloat64())
			}
		}
		for i := range ops[3] {
			ops[3][i] = float32(math.Abs(float64(ops[3][i])))
		}
		var want [4][]float32
		for k := range ops {
			want[k] = slices.Clone(ops[k])
		}
		adamScalar(want[0], want[1], want[2], want[3], &a)
		for _, k := range append([]*kernel{scalarKernel}, simdKernels...) {
			for workers := 1; workers <= 5; workers++ {
				var got [4][]float32
				for j := range ops {
					got[j] = slices.Clone(ops[j])
				}
				k.adamSplit(got[0], got[1], got[2], got[3], &a, workers)
				for j := range got {
					for i := range got[j] {
						if math.Float32bits(got[j][i]) != math.Float32bits(want[j][i]) {
							t.Fatalf("%s, n=%d, %d workers: operand %d element %d is %v, want %v", k.name, n, workers, j, i, got[j][i], want[j][i])
						}
					}
				}
			}
		}
	}
}
