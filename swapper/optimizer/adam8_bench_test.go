package optimizer_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// BenchmarkAdam8 measures one core's Adam update over 8-bit blockwise
// moments (Adam8) next to the same update over fp32 moments (Adam), on
// every kernel of this CPU, at 16 Mi elements (256 Ki under -short): far
// beyond the caches, where the update is bound by the bytes it moves.
// SetBytes is those bytes per call: fp32, 28 per element (master read and
// written, gradient read, two moments read and written); 8-bit, 16 per
// element plus 16 per block of 256 (the four absmax read and written).
// Compare the Gelem/s of adam8 and adam32 of one kernel; the bar
// is >= 1.5x.
func BenchmarkAdam8(b *testing.B) {
	n := 16 << 20
	if testing.Short() {
		n = 256 << 10
	}
	r := rand.New(rand.NewPCG(1, 2))
	p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range n {
		p[i], g[i], m[i] = float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64())
		v[i] = float32(math.Abs(r.NormFloat64()))
	}
	blocks := optimizer.FormatBlockwise8.Blocks(int64(n))
	qm, qv := make([]uint8, n), make([]uint8, n)
	am, av := make([]float32, blocks), make([]float32, blocks)
	optimizer.SignedDynamicMap().Quantize(qm, am, m)
	optimizer.UnsignedDynamicMap().Quantize(qv, av, v)
	h := optimizer.Hyper{LR: 1e-4}
	for _, k := range optimizer.Kernels() {
		report := func(b *testing.B) {
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
		}
		b.Run(fmt.Sprintf("n=%dKi/%s/adam32", n>>10, k), func(b *testing.B) {
			b.SetBytes(28 * int64(n))
			for b.Loop() {
				k.Adam(p, g, m, v, 1, h)
			}
			report(b)
		})
		b.Run(fmt.Sprintf("n=%dKi/%s/adam8", n>>10, k), func(b *testing.B) {
			b.SetBytes(16*int64(n) + 16*blocks)
			for b.Loop() {
				k.Adam8(p, g, qm, qv, am, av, 1, h)
			}
			report(b)
		})
	}
}
