package decoder_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// BenchmarkDecodeStep is one decoding step (all layers and the head) of a
// Llama-shaped model of 8 layers, dim 512 (about 26 M parameters: 105 MB
// in f32, past the last level cache of the machines it was measured on),
// at position 64, per stored type, layout and batch: tokens/s and the
// weights' bytes a second it reaches (GB/s). "inout" stores the dense
// layers and the head in features by out features, as GoMLX's zoo
// transformer does. Its first sub-benchmark, memory-read, sums 256 MiB
// of float32 over GOMAXPROCS goroutines with the products' SIMD: the
// memory's bandwidth in the same run, the roofline a step's GB/s is a
// share of. Run it with -count and compare medians, since rounds of
// every sub-benchmark then interleave.
func BenchmarkDecodeStep(b *testing.B) {
	b.Run("memory-read", func(b *testing.B) {
		data := make([]float32, 256<<20/4)
		for i := range data {
			data[i] = float32(i & 0xff)
		}
		workers := runtime.GOMAXPROCS(0)
		sums := make([]float32, workers)
		b.SetBytes(int64(4 * len(data)))
		var wg sync.WaitGroup
		for b.Loop() {
			for i := range workers {
				part := data[len(data)*i/workers/kernels.Lanes*kernels.Lanes : len(data)*(i+1)/workers/kernels.Lanes*kernels.Lanes]
				wg.Go(func() { sums[i] = kernels.SumF32(part) })
			}
			wg.Wait()
		}
		b.ReportMetric(float64(4*len(data))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	})
	c := decoder.Config{Vocab: 1024, Dim: 512, Layers: 8, Heads: 8, KVHeads: 8, HeadDim: 64, FFNDim: 1408,
		Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm, NormEps: 1e-5,
		Activation: decoder.SiLU, Gated: true, RoPEBase: 10000}
	ci := c
	ci.Layout, ci.HeadLayout = decoder.InOut, decoder.InOut
	for _, layout := range []struct {
		name  string
		c     decoder.Config
		types []kernels.DType
	}{
		{"outin", c, []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0}},
		{"inout", ci, []kernels.DType{kernels.F32, kernels.BF16}},
	} {
		c := layout.c
		base := randomModel(b, c, 1)
		for _, typ := range layout.types {
			m := base.as(b, typ)
			var bytes int
			for l := range m.layers {
				for _, t := range m.layers[l] {
					bytes += len(t.Data)
				}
			}
			bytes += len(m.mw.Head.Data)
			for _, batch := range []int{1, 4} {
				b.Run(fmt.Sprintf("%s/%v/batch%d", layout.name, typ, batch), func(b *testing.B) {
					d, err := decoder.New(c, nil)
					if err != nil {
						b.Fatal(err)
					}
					const pos = 64
					n := c.Layers * batch * (pos + 1) * c.KVHeads * c.HeadDim
					cache, err := decoder.NewKVCache(c, batch, pos+1, make([]float32, n), make([]float32, n))
					if err != nil {
						b.Fatal(err)
					}
					toks, at := make([][]int32, batch), make([]int, batch)
					for i := range toks {
						toks[i], at[i] = []int32{int32(i)}, pos
					}
					out := make([]float32, batch*c.Vocab)
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						if err := d.Begin(cache, toks, at, &m.mw); err != nil {
							b.Fatal(err)
						}
						for l := range c.Layers {
							if err := d.Layer(l, &m.layers[l]); err != nil {
								b.Fatal(err)
							}
						}
						if err := d.Logits(&m.mw, out); err != nil {
							b.Fatal(err)
						}
					}
					s := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(float64(batch)/s, "tokens/s")
					b.ReportMetric(float64(bytes)/s/1e9, "GB/s")
				})
			}
		}
	}
}
