package optimizer_test

import (
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestAdam8DifferentialCatchesMutants runs the 8-bit differential test
// (diffAdam8) on Go models of the SIMD kernels (optimizer.Adam8Mutants):
// the faithful model must pass and every model with one deviation (ties
// to the lower entry, a reciprocal for the divide, a floating-point
// maximum for the absmax, no guard for an all-zero block, NaN codes, the
// bucket of the magnitude, a vector of each block left out) must fail, so
// that a passing kernel cannot have made one of those mistakes.
func TestAdam8DifferentialCatchesMutants(t *testing.T) {
	seed := uint64(time1())
	t.Logf("seed %d", seed)
	for _, m := range optimizer.Adam8Mutants() {
		t.Run(m.Name, func(t *testing.T) {
			err := diffAdam8(m.Kernel, seed)
			switch {
			case m.Faithful && err != nil:
				t.Fatalf("the faithful model differs from the reference: %v", err)
			case !m.Faithful && err == nil:
				t.Fatalf("the differential test let the mutant %q through", m.Name)
			case err != nil:
				t.Logf("caught: %v", err)
			}
		})
	}
}
