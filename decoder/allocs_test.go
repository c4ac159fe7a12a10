package decoder_test

import (
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// TestStepAllocatesNothing: once its scratch has grown, a decoding step
// (the embedding, every layer with its norms and biases, attention split
// over the workers at a long context, the head) allocates nothing, out-in
// and in-out alike, batch 1 and 4.
func TestStepAllocatesNothing(t *testing.T) {
	c := llama()
	c.QKVBias = true
	for _, layout := range []decoder.Layout{decoder.OutIn, decoder.InOut} {
		c.Layout, c.HeadLayout = layout, layout
		m := randomModel(t, c, 5).as(t, kernels.F32)
		pool, err := kernels.NewPool(kernels.Options{Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		d, err := decoder.New(c, pool)
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range []struct{ batch, pos int }{{1, 2}, {4, 600}} {
			const maxLen = 1024
			n := c.Layers * sh.batch * maxLen * c.KVHeads * c.HeadDim
			cache, err := decoder.NewKVCache(c, sh.batch, maxLen, make([]float32, n), make([]float32, n))
			if err != nil {
				t.Fatal(err)
			}
			toks, pos, out := make([][]int32, sh.batch), make([]int, sh.batch), make([]float32, sh.batch*c.Vocab)
			for b := range toks {
				toks[b], pos[b] = []int32{int32(3 + b)}, sh.pos
			}
			step := func() {
				if err := d.Begin(cache, toks, pos, &m.mw); err != nil {
					t.Fatal(err)
				}
				for l := range c.Layers {
					if err := d.Layer(l, &m.layers[l]); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.Logits(&m.mw, out); err != nil {
					t.Fatal(err)
				}
			}
			if a := testing.AllocsPerRun(10, step); a != 0 {
				t.Errorf("%v, batch %d at position %d: %v allocations a decoding step, want 0", layout, sh.batch, sh.pos, a)
			}
		}
		pool.Close()
	}
}
