package optimizer

import (
	"testing"

	"github.com/zinfio/zinf/buffers"
)

// TestAdam8AllocatesNothing: an 8-bit (or bf16-moment) update takes its
// scratch from a pool; a stack array handed to the kernel's function
// value escaped, 5 KiB a call, tens of thousands of calls a step. (Under
// the race detector a sync.Pool drops some of what it is given, so a
// call there may allocate; the test allows one allocation in four.)
func TestAdam8AllocatesNothing(t *testing.T) {
	n := 4 * Blockwise8BlockSize
	p, g, m, v := adam8BenchOperands(n)
	qm, qv := make([]uint8, n), make([]uint8, n)
	blocks := FormatBlockwise8.Blocks(int64(n))
	am, av := make([]float32, blocks), make([]float32, blocks)
	SignedDynamicMap().Quantize(qm, am, m)
	UnsignedDynamicMap().Quantize(qv, av, v)
	h := Hyper{LR: 1e-4}
	for _, k := range Kernels() {
		k.Adam8(p, g, qm, qv, am, av, 1, h) // the pool's first scratch
		if a := testing.AllocsPerRun(40, func() { k.Adam8(p, g, qm, qv, am, av, 1, h) }); a > 0.5 {
			t.Errorf("kernel %s: %.2f allocations an update, want none", k, a)
		}
		bm, bv := make([]buffers.BFloat16, n), make([]buffers.BFloat16, n)
		buffers.Float32ToBFloat16(bm, m)
		buffers.Float32ToBFloat16(bv, v)
		k.AdamBF16(p, g, bm, bv, 1, h)
		if a := testing.AllocsPerRun(40, func() { k.AdamBF16(p, g, bm, bv, 1, h) }); a > 0.5 {
			t.Errorf("kernel %s: %.2f allocations a bf16-moment update, want none", k, a)
		}
	}
}
