package decoder_test

import (
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// TestStepAllocatesNothing: once its scratch has grown, a decoding step
// (the embedding, every layer with its norms and biases, the head)
// allocates nothing, out-in and in-out alike.
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
		const maxLen = 8
		n := c.Layers * maxLen * c.KVHeads * c.HeadDim
		cache, err := decoder.NewKVCache(c, 1, maxLen, make([]float32, n), make([]float32, n))
		if err != nil {
			t.Fatal(err)
		}
		toks, pos, out := [][]int32{{3}}, []int{2}, make([]float32, c.Vocab)
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
			t.Errorf("%v: %v allocations a decoding step, want 0", layout, a)
		}
		pool.Close()
	}
}
