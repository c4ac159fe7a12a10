package decoder_test

import (
	"slices"
	"testing"

	"github.com/zinfio/zinf/decoder"
)

// TestGGUFNames: GGUF's names cover the same roles as Hugging Face's for
// every block, norm and bias setting, each name once; Llama's layer reads
// as llama.cpp names it.
func TestGGUFNames(t *testing.T) {
	c := llama()
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range names {
		if n.Layer == 0 || n.Layer < 0 {
			got = append(got, n.Name)
		}
	}
	want := []string{"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
		"blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
		"token_embd.weight", "output_norm.weight", "output.weight"}
	if !slices.Equal(got, want) {
		t.Fatalf("names %q, want %q", got, want)
	}
	for _, v := range []func(*decoder.Config){
		func(c *decoder.Config) { c.TiedHead = true },
		func(c *decoder.Config) {
			c.Block, c.Norm, c.QKVBias, c.OutBias, c.FFNBias = decoder.Sandwich, decoder.LayerNorm, true, true, true
		},
		func(c *decoder.Config) {
			c.Block, c.EmbedNorm, c.Gated, c.FusedGateUp = decoder.PostNorm, decoder.RMSNorm, true, true
		},
	} {
		c := llama()
		v(&c)
		g, err := c.Names(decoder.GGUFNames, "")
		if err != nil {
			t.Fatal(err)
		}
		h, _ := c.Names(decoder.HFNames, "")
		seen := map[string]bool{}
		roles := func(ns []decoder.Name) (r []decoder.Name) {
			for _, n := range ns {
				r = append(r, decoder.Name{Role: n.Role, Layer: n.Layer})
			}
			return r
		}
		for _, n := range g {
			if seen[n.Name] {
				t.Fatalf("%+v: name %q twice", c, n.Name)
			}
			seen[n.Name] = true
		}
		if !slices.Equal(roles(g), roles(h)) {
			t.Fatalf("%+v: GGUF roles %v, Hugging Face's %v", c, roles(g), roles(h))
		}
	}
}
