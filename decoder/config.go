package decoder

import (
	"errors"
	"fmt"
	"math"

	"github.com/zinfio/zinf/decoder/kernels"
)

// Block is the order of a layer's normalizations and residual additions.
type Block int

const (
	// PostNorm is GoMLX's zoo transformer, standard architecture:
	// x = norm1(x + attn(x)); x = norm2(x + ffn(x)).
	PostNorm Block = iota + 1
	// PreNorm is Llama's, Qwen's and Gemma 1's: x = x + attn(norm1(x));
	// x = x + ffn(norm2(x)).
	PreNorm
	// Sandwich is Gemma 2's and 3's and the zoo's Gemma architectures:
	// x = x + norm2(attn(norm1(x))); x = x + norm4(ffn(norm3(x))).
	Sandwich
)

func (b Block) String() string {
	switch b {
	case PostNorm:
		return "post-norm"
	case PreNorm:
		return "pre-norm"
	case Sandwich:
		return "sandwich"
	}
	return fmt.Sprintf("Block(%d)", int(b))
}

// Norm is a normalization over the model dimension.
type Norm int

const (
	// NoNorm leaves the activations as they are (and has no weights).
	NoNorm Norm = iota
	// RMSNorm is x / sqrt(mean(x²) + eps) * (scale + ScaleOffset).
	RMSNorm
	// LayerNorm is (x - mean) / sqrt(var + eps) * gain + offset, the
	// zoo's default normalization.
	LayerNorm
)

func (n Norm) String() string {
	switch n {
	case NoNorm:
		return "none"
	case RMSNorm:
		return "rms"
	case LayerNorm:
		return "layer"
	}
	return fmt.Sprintf("Norm(%d)", int(n))
}

// Activation is the feed-forward network's nonlinearity.
type Activation int

const (
	// SiLU is x * sigmoid(x) (SwiGLU when gated).
	SiLU Activation = iota + 1
	// GELU is the exact x * Φ(x) (GeGLU when gated).
	GELU
	// GELUTanh is GELU's tanh approximation (Gemma's gelu_pytorch_tanh).
	GELUTanh
	// ReLU is max(x, 0).
	ReLU
)

func (a Activation) String() string {
	switch a {
	case SiLU:
		return "silu"
	case GELU:
		return "gelu"
	case GELUTanh:
		return "gelu_tanh"
	case ReLU:
		return "relu"
	}
	return fmt.Sprintf("Activation(%d)", int(a))
}

// Layout is how a linear layer's weight matrix is stored.
type Layout int

const (
	// OutIn is out features x in features, row-major: Hugging Face's,
	// GGUF's, and the zoo's with WithTransposedWeights(true). The products
	// run on decoder/kernels.
	OutIn Layout = iota
	// InOut is in features x out features: the zoo's default dense
	// layers, and its output head whatever the setting. Only F32 and BF16
	// are accepted in this layout, and its products run on a slower
	// column-axpy loop of this package (see doc.go).
	InOut
)

func (l Layout) String() string {
	if l == InOut {
		return "in-out"
	}
	return "out-in"
}

// MaxCacheLen bounds a KV cache's positions (and so RoPE's positions).
const MaxCacheLen = 1 << 20

// Config describes a decoder-only transformer: the architecture the zoo
// transformer and the Llama, Qwen and Gemma families share.
type Config struct {
	Vocab   int // tokens
	Dim     int // model (embedding) dimension
	Layers  int // transformer layers
	Heads   int // query heads
	KVHeads int // key/value heads (grouped-query attention): 0 means Heads
	HeadDim int // dimension of a head
	FFNDim  int // hidden dimension of the feed-forward network

	Block Block
	// Norm is the layers' normalization; EmbedNorm is applied once to the
	// embeddings, FinalNorm to the last layer's output.
	Norm, EmbedNorm, FinalNorm Norm
	// NormEps is the normalizations' epsilon (added to the mean square or
	// the variance).
	NormEps float64
	// NormScaleOffset is added to every RMSNorm scale (Gemma 1–3: 1).
	NormScaleOffset float64
	// EmbedScale multiplies the token embeddings by sqrt(Dim) (Gemma).
	EmbedScale bool

	Activation Activation
	// Gated is the gated FFN, down(act(gate(x)) * up(x)) (SwiGLU, GeGLU);
	// otherwise down(act(up(x))). FusedGateUp stores gate and up as one
	// matrix of 2*FFNDim outputs, gate first (the zoo's standard
	// architecture with the swiglu activation).
	Gated, FusedGateUp bool

	// QKVBias, OutBias and FFNBias add a bias to the query, key and value
	// projections, to the attention output projection and to the FFN's
	// projections (the zoo's WithBias sets all three; Qwen 2 has QKVBias
	// only).
	QKVBias, OutBias, FFNBias bool

	// RoPEBase is the rotary embedding's base frequency; 0 disables RoPE.
	// RoPEDims rotates the first RoPEDims dimensions of each head (0: all;
	// even). RoPEInterleaved pairs dimensions (2i, 2i+1) as GPT-J and GGUF
	// files of the llama architecture do; otherwise (i, i+RoPEDims/2), as
	// the zoo and Hugging Face's Llama do.
	RoPEBase        float64
	RoPEDims        int
	RoPEInterleaved bool

	// TiedHead reads the output head from the token embedding.
	TiedHead bool
	// Layout is the storage of the layers' projections; HeadLayout the
	// output head's (the zoo's head is InOut even with transposed
	// projections; a tied head is OutIn).
	Layout, HeadLayout Layout
}

// kvHeads returns the key/value heads.
func (c *Config) kvHeads() int {
	if c.KVHeads == 0 {
		return c.Heads
	}
	return c.KVHeads
}

// ropeDims returns the rotated dimensions of a head.
func (c *Config) ropeDims() int {
	if c.RoPEBase == 0 {
		return 0
	}
	if c.RoPEDims == 0 {
		return c.HeadDim
	}
	return c.RoPEDims
}

// maxSize bounds each dimension so that the products of two stay far from
// overflowing int on 32-bit machines too.
const maxSize = 1 << 24

// Validate checks the configuration; each problem names the field, its
// value and what is allowed.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("decoder: "+format, a...)) }
	for _, f := range []struct {
		name string
		v    int
	}{{"Vocab", c.Vocab}, {"Dim", c.Dim}, {"Layers", c.Layers}, {"Heads", c.Heads}, {"HeadDim", c.HeadDim}, {"FFNDim", c.FFNDim}} {
		if f.v < 1 || f.v > maxSize {
			bad("Config.%s %d is outside 1..%d", f.name, f.v, maxSize)
		}
	}
	if c.KVHeads < 0 || c.KVHeads > maxSize {
		bad("Config.KVHeads %d is outside 0..%d (0 means Heads)", c.KVHeads, maxSize)
	} else if c.Heads > 0 && c.kvHeads() > 0 && c.Heads%c.kvHeads() != 0 {
		bad("Config.KVHeads %d does not divide Heads %d (each key/value head serves a whole group of query heads)", c.KVHeads, c.Heads)
	}
	if c.Heads > 0 && c.HeadDim > 0 && int64(c.Heads)*int64(c.HeadDim) > maxSize {
		bad("Config.Heads %d x HeadDim %d is above %d", c.Heads, c.HeadDim, maxSize)
	}
	switch c.Block {
	case PostNorm, PreNorm, Sandwich:
	default:
		bad("Config.Block %v (allowed: PostNorm, PreNorm, Sandwich)", c.Block)
	}
	for _, n := range []struct {
		name string
		v    Norm
	}{{"Norm", c.Norm}, {"EmbedNorm", c.EmbedNorm}, {"FinalNorm", c.FinalNorm}} {
		if n.v != NoNorm && n.v != RMSNorm && n.v != LayerNorm {
			bad("Config.%s %v (allowed: NoNorm, RMSNorm, LayerNorm)", n.name, n.v)
		}
	}
	if c.Block != PostNorm && c.Norm == NoNorm {
		bad("Config.Norm none with Block %v (allowed: RMSNorm or LayerNorm; only PostNorm takes no normalization)", c.Block)
	}
	if math.IsNaN(c.NormEps) || math.IsInf(c.NormEps, 0) || c.NormEps < 0 || c.NormEps > 1 {
		bad("Config.NormEps %v is outside 0..1", c.NormEps)
	}
	if math.IsNaN(c.NormScaleOffset) || math.IsInf(c.NormScaleOffset, 0) {
		bad("Config.NormScaleOffset %v is not finite", c.NormScaleOffset)
	}
	switch c.Activation {
	case SiLU, GELU, GELUTanh, ReLU:
	default:
		bad("Config.Activation %v (allowed: SiLU, GELU, GELUTanh, ReLU)", c.Activation)
	}
	if c.FusedGateUp && !c.Gated {
		bad("Config.FusedGateUp true with Gated false (a fused gate and up matrix belongs to a gated FFN)")
	}
	if math.IsNaN(c.RoPEBase) || math.IsInf(c.RoPEBase, 0) || c.RoPEBase < 0 || c.RoPEBase > 0 && c.RoPEBase <= 1 {
		bad("Config.RoPEBase %v (allowed: 0 for no RoPE, or a finite base above 1)", c.RoPEBase)
	}
	if c.RoPEDims < 0 || c.RoPEDims%2 != 0 || c.HeadDim > 0 && c.RoPEDims > c.HeadDim {
		bad("Config.RoPEDims %d (allowed: 0 for the whole head, or an even count up to HeadDim %d)", c.RoPEDims, c.HeadDim)
	} else if c.RoPEBase > 0 && c.RoPEDims == 0 && c.HeadDim%2 != 0 {
		bad("Config.HeadDim %d is odd with RoPE over the whole head (allowed: an even HeadDim, or RoPEDims below it)", c.HeadDim)
	}
	for _, l := range []struct {
		name string
		v    Layout
	}{{"Layout", c.Layout}, {"HeadLayout", c.HeadLayout}} {
		if l.v != OutIn && l.v != InOut {
			bad("Config.%s %v (allowed: OutIn, InOut)", l.name, l.v)
		}
	}
	if c.TiedHead && c.HeadLayout != OutIn {
		bad("Config.HeadLayout %v with TiedHead (a tied head is the embedding table, Vocab x Dim: OutIn)", c.HeadLayout)
	}
	return errors.Join(errs...)
}

// checkType refuses a weight type the layout cannot take.
func checkType(name string, t kernels.DType, l Layout) error {
	if _, err := kernels.RowBytes(t, 0); err != nil {
		return fmt.Errorf("decoder: weight %s: type %v (allowed: f32, bf16, q8_0, q4_0)", name, t)
	}
	if l == InOut && t != kernels.F32 && t != kernels.BF16 {
		return fmt.Errorf("decoder: weight %s: type %v in the in-out layout (allowed there: f32, bf16)", name, t)
	}
	return nil
}
