package zinf_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/tensor"
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
	c.numel, c.layers = map[string]int{}, nil
	var ls [][]tensor.Desc
	for l, row := range [][]int{{300007, 61}, {140001, 7}} {
		var ts []tensor.Desc
		var names []string
		for i, n := range row {
			name := fmt.Sprintf("l%d.t%d", l, i)
			ts = append(ts, tensor.Desc{Name: name, Shape: []int{n}})
			names = append(names, name)
			c.numel[name] = n
		}
		ls = append(ls, ts)
		c.layers = append(c.layers, names)
	}
	c.model = zinf.LayeredModel(ls...)
	c.cfg.ZeroOptimization.SubGroupSize = 1 << 20 // whole tensors: updates of 300007 elements
	c.cfg.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	c.steps = 2
	c.run(t, 77, rand.New(rand.NewPCG(77, 1)))
	end()
	end() // a second call does nothing
}
