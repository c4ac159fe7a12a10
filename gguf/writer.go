package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Writer builds a GGUF file (version 3): metadata, then tensor infos, then
// each tensor's data aligned to general.alignment (DefaultAlignment unless
// set). The data of a tensor is asked for only as the file is written, so
// a model larger than the memory can be written tensor by tensor.
type Writer struct {
	kv      []KV
	keys    map[string]bool
	tensors []wtensor
	names   map[string]bool
}

type wtensor struct {
	name  string
	dims  []uint64
	typ   Type
	bytes int64
	data  func() ([]byte, error)
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{keys: map[string]bool{}, names: map[string]bool{}}
}

// Set adds the metadata key with the value x: a fixed-size integer,
// float32, float64, bool, string, int (int32 when it fits, else int64),
// or a slice of one of them (an array). general.alignment must be a
// uint32 power of two up to MaxAlignment.
func (w *Writer) Set(key string, x any) error {
	if key == "" || len(key) > MaxKeyBytes {
		return fmt.Errorf("gguf: metadata key %q (allowed: 1..%d bytes)", key, MaxKeyBytes)
	}
	if w.keys[key] {
		return fmt.Errorf("gguf: metadata key %q set twice", key)
	}
	v, err := valueOf(x)
	if err != nil {
		return fmt.Errorf("gguf: metadata key %q: %w", key, err)
	}
	if key == "general.alignment" {
		a, ok := v.Int()
		if v.Type != Uint32 || !ok || a < 1 || a > MaxAlignment || a&(a-1) != 0 {
			return fmt.Errorf("gguf: general.alignment %v of type %v (allowed: a uint32 power of two, 1..%d)", v, v.Type, MaxAlignment)
		}
	}
	w.keys[key] = true
	w.kv = append(w.kv, KV{key, v})
	return nil
}

// AddTensor adds a tensor of type t and row-major shape (slowest first:
// a weight matrix is out x in) whose bytes data holds.
func (w *Writer) AddTensor(name string, t Type, shape []int, data []byte) error {
	return w.AddTensorFunc(name, t, shape, func() ([]byte, error) { return data, nil })
}

// AddTensorFunc adds a tensor whose bytes data returns when the file is
// written (once; the slice is not kept).
func (w *Writer) AddTensorFunc(name string, t Type, shape []int, data func() ([]byte, error)) error {
	if name == "" || len(name) > MaxNameBytes {
		return fmt.Errorf("gguf: tensor name %q (allowed: 1..%d bytes)", name, MaxNameBytes)
	}
	if w.names[name] {
		return fmt.Errorf("gguf: tensor %q added twice", name)
	}
	info, ok := types[t]
	if !ok {
		return fmt.Errorf("gguf: tensor %s: type %v is unknown", name, t)
	}
	if len(shape) < 1 || len(shape) > MaxDims {
		return fmt.Errorf("gguf: tensor %s: shape %v (allowed: 1..%d dimensions)", name, shape, MaxDims)
	}
	dims := make([]uint64, len(shape))
	elems := int64(1)
	for i, d := range shape {
		if d < 1 || elems > math.MaxInt64/4/int64(d) {
			return fmt.Errorf("gguf: tensor %s: shape %v (allowed: positive dimensions)", name, shape)
		}
		dims[len(shape)-1-i] = uint64(d)
		elems *= int64(d)
	}
	if dims[0]%uint64(info.blockElems) != 0 {
		return fmt.Errorf("gguf: tensor %s: rows of %d values of type %v, not a multiple of its block of %d", name, dims[0], t, info.blockElems)
	}
	w.names[name] = true
	w.tensors = append(w.tensors, wtensor{name, dims, t, elems / int64(info.blockElems) * int64(info.blockBytes), data})
	return nil
}

// WriteTo writes the file to out.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	align := int64(DefaultAlignment)
	for _, kv := range w.kv {
		if kv.Key == "general.alignment" {
			a, _ := kv.Value.Int()
			align = a
		}
	}
	cw := &countWriter{w: bufio.NewWriterSize(out, 1<<20)}
	le := binary.LittleEndian
	b8 := make([]byte, 8)
	u32 := func(v uint32) { le.PutUint32(b8, v); cw.Write(b8[:4]) }
	u64 := func(v uint64) { le.PutUint64(b8, v); cw.Write(b8) }
	str := func(s string) { u64(uint64(len(s))); io.WriteString(cw, s) }
	cw.Write([]byte(magic))
	u32(3)
	u64(uint64(len(w.tensors)))
	u64(uint64(len(w.kv)))
	for _, kv := range w.kv {
		str(kv.Key)
		u32(uint32(kv.Value.Type))
		if kv.Value.Type == Array {
			u32(uint32(kv.Value.Elem))
			u64(uint64(kv.Value.Len()))
		}
		writeValue(cw, kv.Value.v)
	}
	offs := make([]int64, len(w.tensors))
	var off int64
	for i, t := range w.tensors {
		str(t.name)
		u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			u64(d)
		}
		u32(uint32(t.typ))
		offs[i] = off
		u64(uint64(off))
		off = (off + t.bytes + align - 1) / align * align
	}
	pad := func() {
		if r := cw.n % align; r != 0 {
			cw.Write(make([]byte, align-r))
		}
	}
	pad()
	for _, t := range w.tensors {
		data, err := t.data()
		if err != nil {
			return cw.n, fmt.Errorf("gguf: tensor %s: %w", t.name, err)
		}
		if int64(len(data)) != t.bytes {
			return cw.n, fmt.Errorf("gguf: tensor %s: %d bytes of data, want %d (shape %v of type %v)", t.name, len(data), t.bytes, t.dims, t.typ)
		}
		cw.Write(data)
		pad()
	}
	if cw.err != nil {
		return cw.n, cw.err
	}
	return cw.n, cw.w.Flush()
}

// WriteFile writes the file at path, which must not exist (an existing
// file is never overwritten); a failed write removes what it wrote.
func (w *Writer) WriteFile(path string) error {
	fd, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	_, err = w.WriteTo(fd)
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("gguf: writing %s: %w", path, err)
	}
	return nil
}

type countWriter struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

func writeValue(w io.Writer, x any) {
	le := binary.LittleEndian
	switch v := x.(type) {
	case string:
		var b [8]byte
		le.PutUint64(b[:], uint64(len(v)))
		w.Write(b[:])
		io.WriteString(w, v)
	case []string:
		for _, s := range v {
			writeValue(w, s)
		}
	case bool:
		b := byte(0)
		if v {
			b = 1
		}
		w.Write([]byte{b})
	case []bool:
		for _, s := range v {
			writeValue(w, s)
		}
	default:
		binary.Write(w, le, x)
	}
}

// SetByteVocab sets a SentencePiece ("llama") vocabulary of vocab tokens
// that llama.cpp accepts and tokenizes any text with: <unk>, <s> and </s>
// (ids 0, 1, 2), the 256 byte tokens <0x00>..<0xFF> (ids 3..258, so text
// is tokenized byte by byte) and normal tokens "[tN]" (N the id) for the
// rest, scores 0, no space prefix. vocab must be at least 259.
func (w *Writer) SetByteVocab(vocab int) error {
	if vocab < 259 {
		return fmt.Errorf("gguf: a byte vocabulary of %d tokens (allowed: at least 259: 3 special and 256 byte tokens)", vocab)
	}
	tokens := make([]string, vocab)
	typ := make([]int32, vocab)
	tokens[0], tokens[1], tokens[2] = "<unk>", "<s>", "</s>"
	typ[0], typ[1], typ[2] = TokenUnknown, TokenControl, TokenControl
	for b := range 256 {
		tokens[3+b] = fmt.Sprintf("<0x%02X>", b)
		typ[3+b] = TokenByte
	}
	for i := 259; i < vocab; i++ {
		tokens[i] = fmt.Sprintf("[t%d]", i)
		typ[i] = TokenNormal
	}
	return errors.Join(
		w.Set("tokenizer.ggml.model", "llama"),
		w.Set("tokenizer.ggml.tokens", tokens),
		w.Set("tokenizer.ggml.scores", make([]float32, vocab)),
		w.Set("tokenizer.ggml.token_type", typ),
		w.Set("tokenizer.ggml.bos_token_id", uint32(1)),
		w.Set("tokenizer.ggml.eos_token_id", uint32(2)),
		w.Set("tokenizer.ggml.unknown_token_id", uint32(0)),
		w.Set("tokenizer.ggml.add_bos_token", true),
		w.Set("tokenizer.ggml.add_space_prefix", false),
	)
}

// ByteTokens returns the ids SetByteVocab's vocabulary gives text: <s>
// then one byte token per byte.
func ByteTokens(text string) []int32 {
	ids := []int32{1}
	for i := range len(text) {
		ids = append(ids, 3+int32(text[i]))
	}
	return ids
}

// SetLlama sets the llama architecture's metadata for c (a Config Model
// reads back: PreNorm, RMSNorm, gated SiLU, RoPE interleaved as GGUF
// stores it) with the context length ctx.
func (w *Writer) SetLlama(name string, c ModelShape, ctx int) error {
	return errors.Join(
		w.Set("general.architecture", "llama"),
		w.Set("general.name", name),
		w.Set("llama.context_length", uint32(ctx)),
		w.Set("llama.embedding_length", uint32(c.Dim)),
		w.Set("llama.block_count", uint32(c.Layers)),
		w.Set("llama.feed_forward_length", uint32(c.FFNDim)),
		w.Set("llama.attention.head_count", uint32(c.Heads)),
		w.Set("llama.attention.head_count_kv", uint32(c.KVHeads)),
		w.Set("llama.attention.key_length", uint32(c.HeadDim)),
		w.Set("llama.attention.value_length", uint32(c.HeadDim)),
		w.Set("llama.rope.freq_base", float32(c.RoPEBase)),
		w.Set("llama.rope.dimension_count", uint32(c.HeadDim)),
		w.Set("llama.attention.layer_norm_rms_epsilon", float32(c.NormEps)),
	)
}

// ModelShape is the shape SetLlama writes.
type ModelShape struct {
	Dim, Layers, Heads, KVHeads, HeadDim, FFNDim int
	RoPEBase, NormEps                            float64
}
