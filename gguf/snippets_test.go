package gguf_test

import (
	"slices"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/gguf"
)

// firstToken is docs/gguf.md's example: the greedy token after the
// prompt, computed by the native decoder from a GGUF file.
func firstToken(path string, prompt []int32) (int, error) {
	f, err := gguf.Open(path) // the header only: no tensor data is read yet
	if err != nil {
		return 0, err
	}
	defer f.Close()
	m, err := f.Model() // the llama metadata as a decoder.Config, every tensor checked
	if err != nil {
		return 0, err
	}
	c := m.Config
	mw, layers, err := f.Weights(c, nil) // nil: Go memory; or an allocator from a pinned pool
	if err != nil {
		return 0, err
	}
	d, err := decoder.New(c, nil)
	if err != nil {
		return 0, err
	}
	n := c.Layers * len(prompt) * c.KVHeads * c.HeadDim // batch 1
	cache, err := decoder.NewKVCache(c, 1, len(prompt), make([]float32, n), make([]float32, n))
	if err != nil {
		return 0, err
	}
	if err := d.Begin(cache, [][]int32{prompt}, []int{0}, &mw); err != nil {
		return 0, err
	}
	for l := range c.Layers {
		if err := d.Layer(l, &layers[l]); err != nil {
			return 0, err
		}
	}
	logits := make([]float32, c.Vocab)
	if err := d.Logits(&mw, logits); err != nil {
		return 0, err
	}
	return slices.Index(logits, slices.Max(logits)), nil
}

// TestDocsSnippet runs firstToken on a small model written as GGUF: its
// token is the one the same weights give handed to the decoder directly.
func TestDocsSnippet(t *testing.T) {
	c := llamaConfig()
	c.RoPEInterleaved = true
	w, byName := direct(t, c, hfModel(c, 5), kernels.Q8_0, false)
	path := writeLlama(t, c, byName)
	prompt := gguf.ByteTokens("GGUF")
	got, err := firstToken(path, prompt)
	if err != nil {
		t.Fatal(err)
	}
	want := greedy(t, c, w, prompt, 0)[0]
	if w := slices.Index(want, slices.Max(want)); got != w {
		t.Fatalf("firstToken %d, the decoder on the same weights %d", got, w)
	}
}
