package decoder

import "fmt"

// GGUFNames are the tensor names of GGUF files (llama.cpp's): token_embd,
// blk.N.attn_norm, blk.N.attn_q/k/v/output, blk.N.ffn_norm,
// blk.N.ffn_gate/up/down, output_norm and output, each with the suffix
// .weight (or .bias). It is declared here, beside the other conventions'
// code in weights.go, so that the GGUF reader (package gguf) can bind a
// file's tensors to a Config.
const GGUFNames Naming = HFNames + 1

// ggufNames lists c's weights under GGUFNames, in the order Names gives
// for the other conventions: the layers', then the embedding, the norms
// and the head. A PreNorm block's second norm is ffn_norm (before the
// FFN); a Sandwich block's are post_attention_norm, ffn_norm and
// post_ffw_norm, as llama.cpp names Gemma 2's. A PostNorm block (the
// zoo's) has no GGUF convention: its norms take the PreNorm names, in the
// order they are applied. A fused gate and up matrix is ffn_up alone.
func (c *Config) ggufNames() []Name {
	var out []Name
	add := func(r Role, layer int, name string) { out = append(out, Name{r, layer, name}) }
	norm := func(kind Norm, scale, offset Role, layer int, base string) {
		switch kind {
		case RMSNorm:
			add(scale, layer, base+".weight")
		case LayerNorm:
			add(scale, layer, base+".weight")
			add(offset, layer, base+".bias")
		}
	}
	for l := range c.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		norm(c.Norm, AttnNorm, AttnNormOffset, l, p+"attn_norm")
		if c.Block == Sandwich {
			norm(c.Norm, PostAttnNorm, PostAttnNormOffset, l, p+"post_attention_norm")
		}
		norm(c.Norm, FFNNorm, FFNNormOffset, l, p+"ffn_norm")
		if c.Block == Sandwich {
			norm(c.Norm, PostFFNNorm, PostFFNNormOffset, l, p+"post_ffw_norm")
		}
		for _, pr := range []struct {
			w, b Role
			name string
			bias bool
		}{{Query, QueryBias, "attn_q", c.QKVBias}, {Key, KeyBias, "attn_k", c.QKVBias}, {Value, ValueBias, "attn_v", c.QKVBias}, {Out, OutBias, "attn_output", c.OutBias}} {
			add(pr.w, l, p+pr.name+".weight")
			if pr.bias {
				add(pr.b, l, p+pr.name+".bias")
			}
		}
		type proj struct {
			w, b Role
			name string
		}
		ffn := []proj{{Up, UpBias, "ffn_up"}, {Down, DownBias, "ffn_down"}}
		if c.Gated && !c.FusedGateUp {
			ffn = append([]proj{{Gate, GateBias, "ffn_gate"}}, ffn...)
		}
		for _, pr := range ffn {
			add(pr.w, l, p+pr.name+".weight")
			if c.FFNBias {
				add(pr.b, l, p+pr.name+".bias")
			}
		}
	}
	add(Embedding, -1, "token_embd.weight")
	norm(c.EmbedNorm, EmbedNormScale, EmbedNormOffset, -1, "token_embd_norm")
	norm(c.FinalNorm, FinalNormScale, FinalNormOffset, -1, "output_norm")
	if !c.TiedHead {
		add(Head, -1, "output.weight")
	}
	return out
}
