package optimizer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// BenchmarkAdam8 measures one core's Adam update over 8-bit blockwise
// moments (Adam8) next to the same update over fp32 moments (Adam), on
// every kernel of this CPU, at 16 Mi elements (256 Ki under -short): far
// beyond the caches, where an update bound by memory is bound by the
// bytes it moves. SetBytes is those bytes per call: fp32, 28 per element
// (master read and written, gradient read, two moments read and
// written); 8-bit, 16 per element plus 16 per block of 256 (the four
// absmax read and written). Compare the Gelem/s of adam8 and adam32 of
// one kernel; the bar is >= 1.5x.
//
// n=16Ki/adam32 is the fp32 update on operands that stay in the L2 cache
// (256 KiB): the speed of its arithmetic alone. Adam8 runs every
// operation of Adam's body and more (the coding), so its elements/s
// cannot exceed that figure however few bytes it moves; if the fp32
// kernel at 16 Mi elements is within 1.5x of it, the bar is out of reach
// on that machine.
func BenchmarkAdam8(b *testing.B) {
	n := 16 << 20
	if testing.Short() {
		n = 256 << 10
	}
	for _, k := range Kernels() {
		p, g, m, v := adam8BenchOperands(16 << 10)
		b.Run(fmt.Sprintf("n=16Ki/%s/adam32", k), func(b *testing.B) {
			benchAdam8Run(b, len(p), 28*int64(len(p)), func() { k.Adam(p, g, m, v, 1, Hyper{LR: 1e-4}) })
		})
	}
	p, g, m, v := adam8BenchOperands(n)
	blocks := FormatBlockwise8.Blocks(int64(n))
	qm, qv := make([]uint8, n), make([]uint8, n)
	am, av := make([]float32, blocks), make([]float32, blocks)
	SignedDynamicMap().Quantize(qm, am, m)
	UnsignedDynamicMap().Quantize(qv, av, v)
	h := Hyper{LR: 1e-4}
	for _, k := range Kernels() {
		b.Run(fmt.Sprintf("n=%dKi/%s/adam32", n>>10, k), func(b *testing.B) {
			benchAdam8Run(b, n, 28*int64(n), func() { k.Adam(p, g, m, v, 1, h) })
		})
		b.Run(fmt.Sprintf("n=%dKi/%s/adam8", n>>10, k), func(b *testing.B) {
			benchAdam8Run(b, n, 16*int64(n)+16*blocks, func() { k.Adam8(p, g, qm, qv, am, av, 1, h) })
		})
	}
}

// adam8BenchOperands returns n random masters, gradients and moments (no
// zeros, no subnormals; exp_avg_sq positive).
func adam8BenchOperands(n int) (p, g, m, v []float32) {
	r := rand.New(rand.NewPCG(1, 2))
	p, g, m, v = make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range n {
		p[i], g[i], m[i] = float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64())
		v[i] = float32(math.Abs(r.NormFloat64()))
	}
	return p, g, m, v
}

// benchAdam8Run runs f, an update of n elements moving bytes bytes, and
// reports Gelem/s (wall clock) and Gelem/cpu-s (per CPU-second of the
// process: one core's speed whatever share of it other processes take).
func benchAdam8Run(b *testing.B, n int, bytes int64, f func()) {
	b.SetBytes(bytes)
	cpu0 := cpuSeconds()
	for b.Loop() {
		f()
	}
	elems := float64(n) * float64(b.N)
	b.ReportMetric(elems/b.Elapsed().Seconds()/1e9, "Gelem/s")
	if cpu := cpuSeconds() - cpu0; cpu > 0 {
		b.ReportMetric(elems/cpu/1e9, "Gelem/cpu-s")
	}
}
