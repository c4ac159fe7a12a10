package optimizer_test

import (
	"fmt"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// Adam over 8-bit blockwise moments: the states of n elements take n
// bytes each plus one absmax per 256 elements, and start at zero.
func ExampleAdam8() {
	const n = 1000
	f := optimizer.FormatBlockwise8
	p := make([]float32, n)
	g := make([]float32, n)
	for i := range n {
		p[i], g[i] = 1, float32(i%7)-3
	}
	m, v := make([]uint8, n), make([]uint8, n)
	mAbsmax, vAbsmax := make([]float32, f.Blocks(n)), make([]float32, f.Blocks(n))
	// Zero moments: every code the zero entry, every absmax 0.
	optimizer.SignedDynamicMap().Quantize(m, mAbsmax, make([]float32, n))
	optimizer.UnsignedDynamicMap().Quantize(v, vAbsmax, make([]float32, n))

	optimizer.Adam8(p, g, m, v, mAbsmax, vAbsmax, 1, optimizer.Hyper{LR: 0.01})

	fmt.Printf("p[0] = %.4f, p[3] = %.4f\n", p[0], p[3])
	fmt.Printf("record of %d elements: %d bytes (fp32: %d)\n", n, f.RecordBytes(optimizer.Hyper{}, n), optimizer.FormatFP32.RecordBytes(optimizer.Hyper{}, n))
	// Output:
	// p[0] = 1.0100, p[3] = 1.0000
	// record of 1000 elements: 6032 bytes (fp32: 12000)
}
