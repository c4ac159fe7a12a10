package gguf

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/zinfio/zinf/decoder"
)

// Model is what a file's metadata says of its model, mapped onto the
// native decoder.
type Model struct {
	// Architecture is general.architecture ("llama").
	Architecture string
	// Config is the decoder's configuration of the model.
	Config decoder.Config
	// ContextLength is the positions the model was trained for
	// (llama.context_length).
	ContextLength int
}

// Architectures the decoder computes.
const allowedArchitectures = "llama"

// Model maps the llama architecture's metadata onto a decoder.Config and
// checks that the file holds every tensor the configuration needs, under
// decoder.GGUFNames, with its shape and a type the decoder reads (f16 is
// widened to f32 as it is read).
//
// The keys read, under the prefix "llama.": block_count,
// embedding_length, attention.head_count, attention.head_count_kv
// (default head_count), attention.key_length (default embedding_length /
// head_count; attention.value_length must equal it), feed_forward_length,
// rope.freq_base (default 10000), rope.dimension_count (default the head
// dimension), attention.layer_norm_rms_epsilon and context_length. The
// vocabulary is token_embd.weight's row count, which llama.vocab_size and
// tokenizer.ggml.tokens must match where present. The head is tied to the
// embedding when output.weight is absent.
//
// RoPE: llama.cpp's converter stores the llama architecture's query and
// key rows permuted within each head so that ggml's normal RoPE mode,
// which rotates the pairs (2i, 2i+1), computes what Hugging Face's Llama
// computes by rotating (i, i + d/2) on the rows as trained: Hugging Face
// row i + s*d/2 of a head (s = 0, 1) becomes GGUF row 2i + s
// (InterleaveRoPERows does it). The Config therefore sets
// RoPEInterleaved, and the file's rows are used as stored.
//
// Not covered, and refused naming the key or tensor: RoPE scaling
// (rope.scaling.type other than none, rope_freqs.weight), mixtures of
// experts (expert_count), per-layer head counts, and the other
// architectures.
func (f *File) Model() (*Model, error) {
	bad := func(key string, format string, a ...any) error {
		return fmt.Errorf("gguf: %s: %s: %s", f.Name, key, fmt.Sprintf(format, a...))
	}
	archV, ok := f.Get("general.architecture")
	if !ok {
		return nil, bad("general.architecture", "absent (allowed: %s)", allowedArchitectures)
	}
	arch, _ := archV.Str()
	if arch != "llama" {
		return nil, bad("general.architecture", "%v (allowed: %s)", archV, allowedArchitectures)
	}
	p := arch + "."
	// get reads an integer key within lo..hi; def < 0 makes it required.
	get := func(key string, def, lo, hi int64) (int, error) {
		v, ok := f.Get(p + key)
		if !ok {
			if def < 0 {
				return 0, bad(p+key, "absent (required)")
			}
			return int(def), nil
		}
		if v.Type == Array {
			return 0, bad(p+key, "an array %v (per-layer values are not covered; allowed: one integer %d..%d)", v, lo, hi)
		}
		n, ok := v.Int()
		if !ok || n < lo || n > hi {
			return 0, bad(p+key, "%v of type %v (allowed: an integer %d..%d)", v, v.Type, lo, hi)
		}
		return int(n), nil
	}
	getF := func(key string, def float64, required bool, ok func(float64) bool, allowed string) (float64, error) {
		v, present := f.Get(p + key)
		if !present {
			if required {
				return 0, bad(p+key, "absent (required)")
			}
			return def, nil
		}
		x, isF := v.Float()
		if !isF || math.IsNaN(x) || !ok(x) {
			return 0, bad(p+key, "%v of type %v (allowed: %s)", v, v.Type, allowed)
		}
		return x, nil
	}
	const maxDim = 1 << 24
	var c decoder.Config
	if err := func() (err error) {
		if c.Layers, err = get("block_count", -1, 1, maxDim); err != nil {
			return err
		}
		if c.Dim, err = get("embedding_length", -1, 1, maxDim); err != nil {
			return err
		}
		if c.Heads, err = get("attention.head_count", -1, 1, maxDim); err != nil {
			return err
		}
		if c.KVHeads, err = get("attention.head_count_kv", int64(c.Heads), 1, int64(c.Heads)); err != nil {
			return err
		}
		if c.Heads%c.KVHeads != 0 {
			return bad(p+"attention.head_count_kv", "%d does not divide head_count %d", c.KVHeads, c.Heads)
		}
		def := int64(-1)
		if c.Dim%c.Heads == 0 {
			def = int64(c.Dim / c.Heads)
		}
		if c.HeadDim, err = get("attention.key_length", def, 1, maxDim); err != nil {
			return err
		}
		if vl, err := get("attention.value_length", int64(c.HeadDim), 1, maxDim); err != nil {
			return err
		} else if vl != c.HeadDim {
			return bad(p+"attention.value_length", "%d differs from the key length %d (not covered)", vl, c.HeadDim)
		}
		if c.FFNDim, err = get("feed_forward_length", -1, 1, maxDim); err != nil {
			return err
		}
		rd, err := get("rope.dimension_count", int64(c.HeadDim), 2, int64(c.HeadDim))
		if err != nil {
			return err
		}
		if rd%2 != 0 {
			return bad(p+"rope.dimension_count", "%d (allowed: an even count up to the head dimension %d)", rd, c.HeadDim)
		}
		if rd != c.HeadDim {
			c.RoPEDims = rd
		}
		if c.RoPEBase, err = getF("rope.freq_base", 10000, false, func(x float64) bool { return x > 1 && !math.IsInf(x, 0) }, "a finite base above 1"); err != nil {
			return err
		}
		if c.NormEps, err = getF("attention.layer_norm_rms_epsilon", 0, true, func(x float64) bool { return x >= 0 && x <= 1 }, "0..1"); err != nil {
			return err
		}
		return nil
	}(); err != nil {
		return nil, err
	}
	ctxLen, err := get("context_length", -1, 1, decoder.MaxCacheLen)
	if err != nil {
		return nil, err
	}
	if v, ok := f.Get(p + "rope.scaling.type"); ok {
		if s, _ := v.Str(); s != "none" {
			return nil, bad(p+"rope.scaling.type", "%v (RoPE scaling is not covered; allowed: none)", v)
		}
	}
	if v, ok := f.Get(p + "expert_count"); ok {
		if n, _ := v.Int(); n != 0 {
			return nil, bad(p+"expert_count", "%v (mixtures of experts are not covered; allowed: 0)", v)
		}
	}
	if _, ok := f.Tensor("rope_freqs.weight"); ok {
		return nil, bad("rope_freqs.weight", "present (RoPE frequency factors are not covered)")
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok {
		return nil, bad("token_embd.weight", "absent (required: the token embedding)")
	}
	if len(emb.Dims) != 2 || emb.Dims[0] != uint64(c.Dim) || emb.Dims[1] > maxDim {
		return nil, bad("token_embd.weight", "dims %v (want [embedding_length %d, vocab] with vocab up to %d)", emb.Dims, c.Dim, maxDim)
	}
	c.Vocab = int(emb.Dims[1])
	if n, err := get("vocab_size", int64(c.Vocab), 1, maxDim); err != nil {
		return nil, err
	} else if n != c.Vocab {
		return nil, bad(p+"vocab_size", "%d differs from token_embd.weight's %d rows", n, c.Vocab)
	}
	if v, ok := f.Get("tokenizer.ggml.tokens"); ok && v.Len() != c.Vocab {
		return nil, bad("tokenizer.ggml.tokens", "%d tokens, token_embd.weight has %d rows", v.Len(), c.Vocab)
	}
	c.Block, c.Norm, c.FinalNorm = decoder.PreNorm, decoder.RMSNorm, decoder.RMSNorm
	c.Activation, c.Gated, c.RoPEInterleaved = decoder.SiLU, true, true
	_, head := f.Tensor("output.weight")
	c.TiedHead = !head
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("gguf: %s: the llama metadata gives an invalid decoder configuration: %w", f.Name, err)
	}
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		t, ok := f.Tensor(n.Name)
		if !ok {
			return nil, bad(n.Name, "absent (the llama architecture needs it)")
		}
		want := c.Shape(n.Role)
		if got := t.Shape(); !equalInts(got, want) {
			return nil, bad(n.Name, "shape %v (dims %v), want %v", got, t.Dims, want)
		}
		if _, err := f.DataBytes(t); err != nil {
			return nil, err
		}
		if len(want) == 1 && t.Type != F32 && t.Type != BF16 && t.Type != F16 {
			return nil, bad(n.Name, "a vector of type %v (allowed: f32, f16, bf16)", t.Type)
		}
	}
	return &Model{Architecture: arch, Config: c, ContextLength: ctxLen}, nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Weights reads every weight of the model c (Model's Config) into memory
// alloc returns (nil: new Go memory), one call per tensor with the bytes
// it needs, and returns the decoder's views of them. Nothing else of the
// file is read; the views stay valid as long as the memory does.
func (f *File) Weights(c decoder.Config, alloc func(bytes int) ([]byte, error)) (decoder.ModelWeights, []decoder.LayerWeights, error) {
	if alloc == nil {
		alloc = func(n int) ([]byte, error) { return make([]byte, n), nil }
	}
	b, err := c.Binding(decoder.GGUFNames, "")
	if err != nil {
		return decoder.ModelWeights{}, nil, err
	}
	view := func(name string) (decoder.Tensor, error) {
		t, ok := f.Tensor(name)
		if !ok {
			return decoder.Tensor{}, fmt.Errorf("gguf: %s: no tensor %q", f.Name, name)
		}
		n, err := f.DataBytes(t)
		if err != nil {
			return decoder.Tensor{}, err
		}
		buf, err := alloc(int(n))
		if err != nil {
			return decoder.Tensor{}, err
		}
		d, err := f.ReadData(t, buf)
		if err != nil {
			return decoder.Tensor{}, err
		}
		dt, err := d.Type.DType()
		if err != nil {
			return decoder.Tensor{}, err
		}
		return decoder.Tensor{Type: dt, Data: d.Data}, nil
	}
	var mw decoder.ModelWeights
	if err := b.Model(view, &mw); err != nil {
		return decoder.ModelWeights{}, nil, err
	}
	layers := make([]decoder.LayerWeights, c.Layers)
	for l := range layers {
		if err := b.Layer(l, view, &layers[l]); err != nil {
			return decoder.ModelWeights{}, nil, err
		}
	}
	return mw, layers, nil
}

// InterleaveRoPERows reorders a query or key projection's rows from
// Hugging Face's Llama order to the llama architecture's GGUF order, as
// llama.cpp's converter does: within each of heads heads of d rows, row
// i + s*d/2 (s = 0, 1; i < d/2) moves to row 2i + s. rowBytes is the bytes
// of one row in its stored type; data holds whole rows, heads x d of them
// (d even). It returns the reordered rows in new memory.
func InterleaveRoPERows(data []byte, rowBytes, heads int) ([]byte, error) {
	if rowBytes < 1 || heads < 1 || len(data)%(rowBytes*heads) != 0 {
		return nil, fmt.Errorf("gguf: %d bytes are not whole rows of %d bytes for %d heads", len(data), rowBytes, heads)
	}
	d := len(data) / rowBytes / heads
	if d%2 != 0 {
		return nil, fmt.Errorf("gguf: a head of %d rows (allowed: an even count)", d)
	}
	out := make([]byte, len(data))
	for h := range heads {
		for s := range 2 {
			for i := range d / 2 {
				src := (h*d + s*d/2 + i) * rowBytes
				dst := (h*d + 2*i + s) * rowBytes
				copy(out[dst:dst+rowBytes], data[src:src+rowBytes])
			}
		}
	}
	return out, nil
}

// Token types of tokenizer.ggml.token_type, as llama.cpp numbers them.
const (
	TokenNormal      = 1
	TokenUnknown     = 2
	TokenControl     = 3
	TokenUserDefined = 4
	TokenUnused      = 5
	TokenByte        = 6
)

// Tokenizer is a file's tokenizer.ggml.* metadata. The slices are the
// metadata's own (not copied).
type Tokenizer struct {
	// Model is tokenizer.ggml.model: "llama" (SentencePiece), "gpt2"
	// (byte-level BPE), ...; Pre is tokenizer.ggml.pre.
	Model, Pre string
	Tokens     []string
	Scores     []float32 // nil when absent
	Types      []int32   // nil when absent
	Merges     []string  // nil when absent
	// BOS, EOS, UNK and PAD are the special tokens' ids, -1 when absent.
	BOS, EOS, UNK, PAD int
	// AddBOS and AddEOS are tokenizer.ggml.add_bos_token and
	// add_eos_token (false when absent).
	AddBOS, AddEOS bool
}

// Tokenizer reads the tokenizer metadata; it needs tokenizer.ggml.model
// and tokenizer.ggml.tokens, and checks that scores and types, where
// present, have an entry per token and that the special ids name tokens.
func (f *File) Tokenizer() (*Tokenizer, error) {
	bad := func(key string, format string, a ...any) error {
		return fmt.Errorf("gguf: %s: %s: %s", f.Name, key, fmt.Sprintf(format, a...))
	}
	t := &Tokenizer{BOS: -1, EOS: -1, UNK: -1, PAD: -1}
	v, ok := f.Get("tokenizer.ggml.model")
	if t.Model, _ = v.Str(); !ok || t.Model == "" {
		return nil, bad("tokenizer.ggml.model", "absent or not a string (%v)", v)
	}
	if v, ok := f.Get("tokenizer.ggml.pre"); ok {
		t.Pre, _ = v.Str()
	}
	v, ok = f.Get("tokenizer.ggml.tokens")
	if t.Tokens, _ = v.Strings(); !ok || t.Tokens == nil {
		return nil, bad("tokenizer.ggml.tokens", "absent or not an array of strings (%v)", v)
	}
	if v, ok := f.Get("tokenizer.ggml.scores"); ok {
		if t.Scores, _ = v.Float32s(); t.Scores == nil || len(t.Scores) != len(t.Tokens) {
			return nil, bad("tokenizer.ggml.scores", "%v (want %d float32 values, one per token)", v, len(t.Tokens))
		}
	}
	if v, ok := f.Get("tokenizer.ggml.token_type"); ok {
		if t.Types, _ = v.Int32s(); t.Types == nil || len(t.Types) != len(t.Tokens) {
			return nil, bad("tokenizer.ggml.token_type", "%v (want %d int32 values, one per token)", v, len(t.Tokens))
		}
	}
	if v, ok := f.Get("tokenizer.ggml.merges"); ok {
		if t.Merges, _ = v.Strings(); t.Merges == nil && v.Len() != 0 {
			return nil, bad("tokenizer.ggml.merges", "%v (want an array of strings)", v)
		}
	}
	for _, s := range []struct {
		key string
		id  *int
	}{{"bos_token_id", &t.BOS}, {"eos_token_id", &t.EOS}, {"unknown_token_id", &t.UNK}, {"padding_token_id", &t.PAD}} {
		v, ok := f.Get("tokenizer.ggml." + s.key)
		if !ok {
			continue
		}
		n, isInt := v.Int()
		if !isInt || n < 0 || n >= int64(len(t.Tokens)) {
			return nil, bad("tokenizer.ggml."+s.key, "%v (allowed: a token id 0..%d)", v, len(t.Tokens)-1)
		}
		*s.id = int(n)
	}
	for _, s := range []struct {
		key string
		b   *bool
	}{{"add_bos_token", &t.AddBOS}, {"add_eos_token", &t.AddEOS}} {
		if v, ok := f.Get("tokenizer.ggml." + s.key); ok {
			b, isBool := v.Bool()
			if !isBool {
				return nil, bad("tokenizer.ggml."+s.key, "%v of type %v (allowed: a bool)", v, v.Type)
			}
			*s.b = b
		}
	}
	return t, nil
}

// Piece returns the text of token id as llama.cpp prints a SentencePiece
// ("llama") vocabulary's token: a byte token <0xNN> is its byte, a
// normal token its text with U+2581 as a space, a control token its text.
// Other vocabularies' tokens are returned as stored.
func (t *Tokenizer) Piece(id int) string {
	if id < 0 || id >= len(t.Tokens) {
		return ""
	}
	s := t.Tokens[id]
	if t.Model != "llama" {
		return s
	}
	if t.Types != nil && t.Types[id] == TokenByte && len(s) == 6 && strings.HasPrefix(s, "<0x") && s[5] == '>' {
		if b, err := strconv.ParseUint(s[3:5], 16, 8); err == nil {
			return string([]byte{byte(b)})
		}
	}
	return strings.ReplaceAll(s, "\u2581", " ")
}
