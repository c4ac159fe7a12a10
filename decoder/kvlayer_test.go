package decoder_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// TestLayerKVCache: a KV cache bound a layer at a time (NewLayerKVCache,
// BindLayer), each layer's entry moved through one shared buffer as a
// tier that hands out one layer at a time would, gives the bits of the
// cache in one piece (NewKVCache), prefill and decoding steps, batch 2;
// an unbound layer and a wrong length are errors naming them.
func TestLayerKVCache(t *testing.T) {
	c := llama()
	m := randomModel(t, c, 29).as(t, kernels.F32)
	const batch, maxLen = 2, 12
	whole := c.Layers * batch * maxLen * c.KVHeads * c.HeadDim
	one, err := decoder.NewKVCache(c, batch, maxLen, make([]float32, whole), make([]float32, whole))
	if err != nil {
		t.Fatal(err)
	}
	lc, err := decoder.NewLayerKVCache(c, batch, maxLen)
	if err != nil {
		t.Fatal(err)
	}
	per := lc.LayerValues()
	if per*c.Layers != whole {
		t.Fatalf("LayerValues %d, want %d", per, whole/c.Layers)
	}
	// The tier: each layer's entry, and the one buffer it is handed in.
	tier := make([][]float32, c.Layers)
	for l := range tier {
		tier[l] = make([]float32, 2*per)
	}
	slot := make([]float32, 2*per)
	d1, _ := decoder.New(c, nil)
	d2, _ := decoder.New(c, nil)
	toks := [][]int32{{1, 5, 9}, {2, 7, 4}}
	pos := []int{0, 0}
	out1, out2 := make([]float32, batch*c.Vocab), make([]float32, batch*c.Vocab)
	for step := range 5 {
		if err := d1.Begin(one, toks, pos, &m.mw); err != nil {
			t.Fatal(err)
		}
		if err := d2.Begin(lc, toks, pos, &m.mw); err != nil {
			t.Fatal(err)
		}
		for l := range c.Layers {
			if err := d1.Layer(l, &m.layers[l]); err != nil {
				t.Fatal(err)
			}
			copy(slot, tier[l])
			if err := lc.BindLayer(l, slot[:per], slot[per:]); err != nil {
				t.Fatal(err)
			}
			if err := d2.Layer(l, &m.layers[l]); err != nil {
				t.Fatal(err)
			}
			copy(tier[l], slot)
			clear(slot)
			if err := lc.BindLayer(l, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := d1.Logits(&m.mw, out1); err != nil {
			t.Fatal(err)
		}
		if err := d2.Logits(&m.mw, out2); err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(out1, out2, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
			t.Fatalf("step %d: one-piece cache %v, layer-bound %v", step, out1[:4], out2[:4])
		}
		for b := range pos {
			pos[b] += len(toks[b])
			toks[b] = []int32{int32(3*step+b) % int32(c.Vocab)}
		}
	}
	if err := d2.Begin(lc, toks, pos, &m.mw); err != nil {
		t.Fatal(err)
	}
	if err := d2.Layer(0, &m.layers[0]); err == nil || !strings.Contains(err.Error(), "layer 0 is not bound") {
		t.Fatalf("an unbound layer: %v", err)
	}
	if err := lc.BindLayer(0, make([]float32, per-1), make([]float32, per)); err == nil {
		t.Fatal("a short K: no error")
	}
	if err := lc.BindLayer(c.Layers, nil, nil); err == nil {
		t.Fatal("a layer past the last: no error")
	}
}
