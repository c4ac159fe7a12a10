package zinf_test

import (
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf"
)

// TestBeginComputeKeepsBits trains layer-major steps of tensors long
// enough that zinf's checksums, gradient sums, copies and optimizer
// updates go in chunks with yield points between them, with compute
// marked (zinf.BeginCompute) the whole time: the parameters read, the
// steps' decisions and the final masters and optimizer states equal the
// in-memory reference bit for bit, as without.
func TestBeginComputeKeepsBits(t *testing.T) {
	end := zinf.BeginCompute()
	defer end()
	c := scheduleCase(t, "adamw", 3, true)
	c.setLayers([][]int{{300007, 61}, {140001, 7}})
	c.cfg.ZeroOptimization.SubGroupSize = 1 << 20 // whole tensors: updates of 300007 elements
	c.cfg.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	c.steps = 2
	c.run(t, 77, rand.New(rand.NewPCG(77, 1)))
	end()
	end() // a second call does nothing
}
