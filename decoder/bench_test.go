package decoder_test

import (
	"fmt"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// BenchmarkDecodeStep is one decoding step (all layers and the head) of a
// Llama-shaped model of 8 layers, dim 512 (about 29 M parameters), at
// position 64, per stored type and batch: tokens/s and the weights' bytes
// a second it reaches.
func BenchmarkDecodeStep(b *testing.B) {
	c := decoder.Config{Vocab: 1024, Dim: 512, Layers: 8, Heads: 8, KVHeads: 8, HeadDim: 64, FFNDim: 1408,
		Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm, NormEps: 1e-5,
		Activation: decoder.SiLU, Gated: true, RoPEBase: 10000}
	base := randomModel(b, c, 1)
	for _, typ := range []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0} {
		m := base.as(b, typ)
		var bytes int
		for l := range m.layers {
			for _, t := range m.layers[l] {
				bytes += len(t.Data)
			}
		}
		bytes += len(m.mw.Head.Data)
		for _, batch := range []int{1, 4} {
			b.Run(fmt.Sprintf("%v/batch%d", typ, batch), func(b *testing.B) {
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
