package decoder

import (
	"fmt"

	"github.com/zinfio/zinf/decoder/kernels"
)

// Tensor is a view of one weight as it is stored: its type and its bytes
// (little-endian, row-major). The decoder reads Data during the call it is
// handed to and keeps no reference past it, so a view of a pinned buffer
// that is swapped out afterwards is safe.
type Tensor struct {
	Type kernels.DType
	Data []byte
}

// Role is a weight's part in the model.
type Role int

// The roles of a model's weights. The per-layer roles come first.
const (
	// AttnNorm is the normalization before attention (PreNorm,
	// Sandwich), or after the attention's residual addition (PostNorm).
	// Its Scale is RMSNorm's scale or LayerNorm's gain; NormOffset roles
	// hold LayerNorm's offsets.
	AttnNorm Role = iota
	AttnNormOffset
	// PostAttnNorm normalizes the attention's output (Sandwich only).
	PostAttnNorm
	PostAttnNormOffset
	// FFNNorm is the normalization before the FFN (PreNorm, Sandwich) or
	// after its residual addition (PostNorm).
	FFNNorm
	FFNNormOffset
	// PostFFNNorm normalizes the FFN's output (Sandwich only).
	PostFFNNorm
	PostFFNNormOffset
	// Query, Key, Value and Out are the attention's projections: Heads x
	// HeadDim, KVHeads x HeadDim (twice) and Dim outputs.
	Query
	QueryBias
	Key
	KeyBias
	Value
	ValueBias
	Out
	OutBias
	// Gate, Up and Down are the FFN's projections (Up holds gate and up,
	// 2*FFNDim outputs, with FusedGateUp; Gate is unused then).
	Gate
	GateBias
	Up
	UpBias
	Down
	DownBias
	numLayerRoles

	// Embedding is the token embedding table, Vocab x Dim.
	Embedding Role = 100 + iota
	EmbedNormScale
	EmbedNormOffset
	FinalNormScale
	FinalNormOffset
	// Head is the output head: Vocab x Dim (OutIn) or Dim x Vocab (InOut).
	Head
)

// LayerWeights are one transformer layer's weights, indexed by Role.
type LayerWeights [numLayerRoles]Tensor

// ModelWeights are the weights outside the layers.
type ModelWeights struct {
	Embedding                       Tensor
	EmbedNormScale, EmbedNormOffset Tensor
	FinalNormScale, FinalNormOffset Tensor
	Head                            Tensor // unused with TiedHead
}

// Set stores t for a model-level role (Embedding ... Head).
func (w *ModelWeights) Set(r Role, t Tensor) error {
	switch r {
	case Embedding:
		w.Embedding = t
	case EmbedNormScale:
		w.EmbedNormScale = t
	case EmbedNormOffset:
		w.EmbedNormOffset = t
	case FinalNormScale:
		w.FinalNormScale = t
	case FinalNormOffset:
		w.FinalNormOffset = t
	case Head:
		w.Head = t
	default:
		return fmt.Errorf("decoder: role %d is not a model-level role (Embedding, EmbedNormScale, EmbedNormOffset, FinalNormScale, FinalNormOffset, Head)", int(r))
	}
	return nil
}

// Naming is a convention for weight names.
type Naming int

const (
	// ZooNames are GoMLX's zoo transformer variable paths (as zinf's
	// generator names its tensors), under the model's scope.
	ZooNames Naming = iota + 1
	// HFNames are Hugging Face's tensor names (Llama, Qwen, Gemma).
	HFNames
)

// Name is a weight's name and role.
type Name struct {
	Role Role
	// Layer is the transformer layer (0-based), -1 for the model-level
	// roles.
	Layer int
	Name  string
}

// Names lists the weights the configuration needs, by name, in the
// convention n: the layers' first, then the embedding, the norms and the
// head. scope is the zoo model's scope path (e.g. "/transformer"; ignored
// for HFNames). Under ZooNames a PostNorm block takes the zoo's standard
// architecture's scopes (attn, norm1, norm2, ff1, ff2) and a Sandwich
// block its Gemma scopes (self_attn, input_norm, post_attention_norm,
// pre_feedforward_norm, post_feedforward_norm, mlp/gate_proj, ...); the
// zoo has no PreNorm architecture. Under HFNames a PreNorm block's second
// norm is post_attention_layernorm (before the FFN, as Llama and Qwen name
// it) and a Sandwich block's is the attention output's (Gemma 2 and 3).
func (c *Config) Names(n Naming, scope string) ([]Name, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var out []Name
	add := func(r Role, layer int, name string) { out = append(out, Name{r, layer, name}) }
	norm := func(kind Norm, scale, offset Role, layer int, base string) {
		switch {
		case kind == RMSNorm && n == ZooNames:
			add(scale, layer, base+"/rms_norm/scale")
		case kind == LayerNorm && n == ZooNames:
			add(scale, layer, base+"/layer_normalization/gain")
			add(offset, layer, base+"/layer_normalization/offset")
		case kind == RMSNorm:
			add(scale, layer, base+".weight")
		case kind == LayerNorm:
			add(scale, layer, base+".weight")
			add(offset, layer, base+".bias")
		}
	}
	switch n {
	case ZooNames:
		gemma := c.Block != PostNorm
		for l := range c.Layers {
			p := fmt.Sprintf("%s/layer_%d/", scope, l)
			attn, mlp := p+"attn/MultiHeadAttention/", p
			if gemma {
				attn, mlp = p+"self_attn/MultiHeadAttention/", p+"mlp/"
			}
			if gemma {
				norm(c.Norm, AttnNorm, AttnNormOffset, l, p+"input_norm")
				if c.Block == Sandwich {
					norm(c.Norm, PostAttnNorm, PostAttnNormOffset, l, p+"post_attention_norm")
				}
				norm(c.Norm, FFNNorm, FFNNormOffset, l, p+"pre_feedforward_norm")
				if c.Block == Sandwich {
					norm(c.Norm, PostFFNNorm, PostFFNNormOffset, l, p+"post_feedforward_norm")
				}
			} else {
				norm(c.Norm, AttnNorm, AttnNormOffset, l, p+"norm1")
				norm(c.Norm, FFNNorm, FFNNormOffset, l, p+"norm2")
			}
			for _, pr := range []struct {
				w, b Role
				name string
				bias bool
			}{{Query, QueryBias, "query", c.QKVBias}, {Key, KeyBias, "key", c.QKVBias}, {Value, ValueBias, "value", c.QKVBias}, {Out, OutBias, "output", c.OutBias}} {
				add(pr.w, l, attn+pr.name+"/dense/weights")
				if pr.bias {
					add(pr.b, l, attn+pr.name+"/dense/biases")
				}
			}
			ffn := []struct {
				w, b Role
				name string
			}{{Up, UpBias, "ff1"}, {Down, DownBias, "ff2"}}
			if gemma {
				ffn = []struct {
					w, b Role
					name string
				}{{Gate, GateBias, "gate_proj"}, {Up, UpBias, "up_proj"}, {Down, DownBias, "down_proj"}}
			}
			for _, pr := range ffn {
				add(pr.w, l, mlp+pr.name+"/dense/weights")
				if c.FFNBias {
					add(pr.b, l, mlp+pr.name+"/dense/biases")
				}
			}
		}
		add(Embedding, -1, scope+"/token_embed/embeddings")
		norm(c.EmbedNorm, EmbedNormScale, EmbedNormOffset, -1, scope+"/embed_norm")
		norm(c.FinalNorm, FinalNormScale, FinalNormOffset, -1, scope+"/final_norm")
		if !c.TiedHead {
			add(Head, -1, scope+"/output/dense/weights")
		}
	case HFNames:
		for l := range c.Layers {
			p := fmt.Sprintf("model.layers.%d.", l)
			norm(c.Norm, AttnNorm, AttnNormOffset, l, p+"input_layernorm")
			switch c.Block {
			case Sandwich:
				norm(c.Norm, PostAttnNorm, PostAttnNormOffset, l, p+"post_attention_layernorm")
				norm(c.Norm, FFNNorm, FFNNormOffset, l, p+"pre_feedforward_layernorm")
				norm(c.Norm, PostFFNNorm, PostFFNNormOffset, l, p+"post_feedforward_layernorm")
			default:
				norm(c.Norm, FFNNorm, FFNNormOffset, l, p+"post_attention_layernorm")
			}
			for _, pr := range []struct {
				w, b Role
				name string
				bias bool
			}{{Query, QueryBias, "q_proj", c.QKVBias}, {Key, KeyBias, "k_proj", c.QKVBias}, {Value, ValueBias, "v_proj", c.QKVBias}, {Out, OutBias, "o_proj", c.OutBias}} {
				add(pr.w, l, p+"self_attn."+pr.name+".weight")
				if pr.bias {
					add(pr.b, l, p+"self_attn."+pr.name+".bias")
				}
			}
			ffn := []struct {
				w, b Role
				name string
			}{{Up, UpBias, "up_proj"}, {Down, DownBias, "down_proj"}}
			if c.Gated && !c.FusedGateUp {
				ffn = append([]struct {
					w, b Role
					name string
				}{{Gate, GateBias, "gate_proj"}}, ffn...)
			}
			for _, pr := range ffn {
				add(pr.w, l, p+"mlp."+pr.name+".weight")
				if c.FFNBias {
					add(pr.b, l, p+"mlp."+pr.name+".bias")
				}
			}
		}
		add(Embedding, -1, "model.embed_tokens.weight")
		norm(c.EmbedNorm, EmbedNormScale, EmbedNormOffset, -1, "model.embed_norm")
		norm(c.FinalNorm, FinalNormScale, FinalNormOffset, -1, "model.norm")
		if !c.TiedHead {
			add(Head, -1, "lm_head.weight")
		}
	case GGUFNames:
		out = c.ggufNames()
	default:
		return nil, fmt.Errorf("decoder: naming %d (allowed: ZooNames, HFNames, GGUFNames)", int(n))
	}
	return out, nil
}

// Shape returns the dimensions of the weight of role r: out x in features
// for a matrix (as OutIn stores it; InOut stores in x out), Vocab x Dim for
// the embedding and the head, one dimension for a vector (a norm's scale
// or offset, a bias). It returns nil for an unknown role.
func (c *Config) Shape(r Role) []int {
	q, kv, f := c.Heads*c.HeadDim, c.kvHeads()*c.HeadDim, c.FFNDim
	up := f
	if c.FusedGateUp {
		up = 2 * f
	}
	switch r {
	case AttnNorm, AttnNormOffset, PostAttnNorm, PostAttnNormOffset, FFNNorm, FFNNormOffset, PostFFNNorm, PostFFNNormOffset,
		EmbedNormScale, EmbedNormOffset, FinalNormScale, FinalNormOffset, OutBias, DownBias:
		return []int{c.Dim}
	case Query:
		return []int{q, c.Dim}
	case QueryBias:
		return []int{q}
	case Key, Value:
		return []int{kv, c.Dim}
	case KeyBias, ValueBias:
		return []int{kv}
	case Out:
		return []int{c.Dim, q}
	case Gate:
		return []int{f, c.Dim}
	case GateBias:
		return []int{f}
	case Up:
		return []int{up, c.Dim}
	case UpBias:
		return []int{up}
	case Down:
		return []int{c.Dim, f}
	case Embedding, Head:
		return []int{c.Vocab, c.Dim}
	}
	return nil
}

// Binding holds the names of a configuration's weights by layer, so that
// the views of a layer's weights can be gathered by name as a streaming
// caller swaps them in (zinf's generator: a view of each pinned buffer).
type Binding struct {
	layers [][]Name
	model  []Name
}

// Binding lists the weights of c under the naming n (see Names).
func (c *Config) Binding(n Naming, scope string) (*Binding, error) {
	names, err := c.Names(n, scope)
	if err != nil {
		return nil, err
	}
	b := &Binding{layers: make([][]Name, c.Layers)}
	for _, nm := range names {
		if nm.Layer >= 0 {
			b.layers[nm.Layer] = append(b.layers[nm.Layer], nm)
		} else {
			b.model = append(b.model, nm)
		}
	}
	return b, nil
}

// Names returns the names of layer l's weights (nil for a layer outside
// the model).
func (b *Binding) Names(l int) []Name {
	if l < 0 || l >= len(b.layers) {
		return nil
	}
	return b.layers[l]
}

// Layer fills dst with layer l's weights, each the view that view returns
// for its name; an error from view is returned with the name.
func (b *Binding) Layer(l int, view func(name string) (Tensor, error), dst *LayerWeights) error {
	if l < 0 || l >= len(b.layers) {
		return fmt.Errorf("decoder: layer %d is outside 0..%d", l, len(b.layers)-1)
	}
	*dst = LayerWeights{}
	for _, nm := range b.layers[l] {
		t, err := view(nm.Name)
		if err != nil {
			return fmt.Errorf("decoder: weight %q: %w", nm.Name, err)
		}
		dst[nm.Role] = t
	}
	return nil
}

// Model fills dst with the weights outside the layers.
func (b *Binding) Model(view func(name string) (Tensor, error), dst *ModelWeights) error {
	*dst = ModelWeights{}
	for _, nm := range b.model {
		t, err := view(nm.Name)
		if err != nil {
			return fmt.Errorf("decoder: weight %q: %w", nm.Name, err)
		}
		if err := dst.Set(nm.Role, t); err != nil {
			return err
		}
	}
	return nil
}
