package gguf_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/gguf"
)

// llamaConfig is a small Llama: GQA (4 query heads, 2 key/value heads),
// gated SiLU FFN, untied head, every matrix dimension a multiple of 32.
func llamaConfig() decoder.Config {
	return decoder.Config{Vocab: 300, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96,
		Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm, NormEps: 1.0 / 65536,
		Activation: decoder.SiLU, Gated: true, RoPEBase: 10000}
}

// hfModel draws a model's weights in Hugging Face's layout (query and key
// rows as trained, RoPE pairing i with i + d/2): matrices N(0, 1/in),
// norm scales near 1.
func hfModel(c decoder.Config, seed uint64) map[decoder.Role]map[int][]float32 {
	names, err := c.Names(decoder.HFNames, "")
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	m := map[decoder.Role]map[int][]float32{}
	for _, n := range names {
		shape := c.Shape(n.Role)
		size := 1
		for _, d := range shape {
			size *= d
		}
		mean, sd := 1.0, 0.1
		if len(shape) == 2 {
			mean, sd = 0, 1/math.Sqrt(float64(shape[1]))
		}
		v := make([]float32, size)
		for i := range v {
			v[i] = float32(mean + sd*rng.NormFloat64())
		}
		if m[n.Role] == nil {
			m[n.Role] = map[int][]float32{}
		}
		m[n.Role][n.Layer] = v
	}
	return m
}

// encode stores v in type t.
func encode(t *testing.T, typ kernels.DType, v []float32) []byte {
	t.Helper()
	b, err := kernels.Encode(typ, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// weights are a model's decoder views.
type weights struct {
	mw     decoder.ModelWeights
	layers []decoder.LayerWeights
}

// direct hands the model's weights to the decoder as they are in memory:
// matrices in typ, vectors f32, query and key rows interleaved (GGUF's
// order) when interleave is set.
func direct(t *testing.T, c decoder.Config, m map[decoder.Role]map[int][]float32, typ kernels.DType, interleave bool) (weights, map[string]decoder.Tensor) {
	t.Helper()
	names, _ := c.Names(decoder.GGUFNames, "")
	w := weights{layers: make([]decoder.LayerWeights, c.Layers)}
	byName := map[string]decoder.Tensor{}
	for _, n := range names {
		v := m[n.Role][n.Layer]
		shape := c.Shape(n.Role)
		tt := decoder.Tensor{Type: kernels.F32}
		if len(shape) == 2 {
			tt.Type = typ
		}
		tt.Data = encode(t, tt.Type, v)
		if interleave && (n.Role == decoder.Query || n.Role == decoder.Key) {
			heads := c.Heads
			if n.Role == decoder.Key {
				heads = c.KVHeads
			}
			rb, _ := kernels.RowBytes(tt.Type, shape[1])
			var err error
			if tt.Data, err = gguf.InterleaveRoPERows(tt.Data, rb, heads); err != nil {
				t.Fatal(err)
			}
		}
		byName[n.Name] = tt
		if n.Layer >= 0 {
			w.layers[n.Layer][n.Role] = tt
		} else if err := w.mw.Set(n.Role, tt); err != nil {
			t.Fatal(err)
		}
	}
	return w, byName
}

// writeLlama writes the model as a GGUF file of the llama architecture,
// with the byte vocabulary, and returns its path.
func writeLlama(t *testing.T, c decoder.Config, tensors map[string]decoder.Tensor) string {
	t.Helper()
	w := gguf.NewWriter()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.SetLlama("test", gguf.ModelShape{Dim: c.Dim, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, FFNDim: c.FFNDim, RoPEBase: c.RoPEBase, NormEps: c.NormEps}, 256))
	must(w.SetByteVocab(c.Vocab))
	names, _ := c.Names(decoder.GGUFNames, "")
	for _, n := range names {
		tt := tensors[n.Name]
		gt, err := gguf.TypeOf(tt.Type)
		must(err)
		must(w.AddTensor(n.Name, gt, c.Shape(n.Role), tt.Data))
	}
	path := filepath.Join(t.TempDir(), "model.gguf")
	must(w.WriteFile(path))
	return path
}

// greedy runs a prefill of prompt, then steps greedy steps, and returns
// each pass's logits.
func greedy(t *testing.T, c decoder.Config, w weights, prompt []int32, steps int) [][]float32 {
	t.Helper()
	d, err := decoder.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	maxLen := len(prompt) + steps
	n := c.Layers * maxLen * c.KVHeads * c.HeadDim
	cache, err := decoder.NewKVCache(c, 1, maxLen, make([]float32, n), make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	var all [][]float32
	toks, pos := prompt, 0
	for range steps + 1 {
		if err := d.Begin(cache, [][]int32{toks}, []int{pos}, &w.mw); err != nil {
			t.Fatal(err)
		}
		for l := range c.Layers {
			if err := d.Layer(l, &w.layers[l]); err != nil {
				t.Fatal(err)
			}
		}
		out := make([]float32, c.Vocab)
		if err := d.Logits(&w.mw, out); err != nil {
			t.Fatal(err)
		}
		all = append(all, out)
		pos += len(toks)
		toks = []int32{int32(slices.Index(out, slices.Max(out)))}
	}
	return all
}

// TestDecoderFromFile: a llama model written as GGUF (each stored type),
// read back with Open, Model and Weights, runs on the native decoder and
// gives the logits of the same bytes handed to the decoder directly, bit
// for bit; and the file's interleaved query and key rows with
// RoPEInterleaved give, within float32 rounding, the logits of Hugging
// Face's layout with its half-split RoPE (the converter's permutation is
// the one the reader assumes).
func TestDecoderFromFile(t *testing.T) {
	c := llamaConfig()
	m := hfModel(c, 1)
	prompt := gguf.ByteTokens("zinf")
	const steps = 6
	hf := c
	hfW, _ := direct(t, hf, m, kernels.F32, false)
	ref := greedy(t, hf, hfW, prompt, steps)
	for _, typ := range []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0, kernels.Q4_0} {
		t.Run(typ.String(), func(t *testing.T) {
			ggufC := c
			ggufC.RoPEInterleaved = true
			w, byName := direct(t, ggufC, m, typ, true)
			path := writeLlama(t, c, byName)
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			model, err := f.Model()
			if err != nil {
				t.Fatal(err)
			}
			if model.Config != ggufC || model.Architecture != "llama" || model.ContextLength != 256 {
				t.Fatalf("model %+v, want config %+v", *model, ggufC)
			}
			mw, layers, err := f.Weights(model.Config, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := greedy(t, model.Config, weights{mw, layers}, prompt, steps)
			want := greedy(t, ggufC, w, prompt, steps)
			for s := range got {
				for i := range got[s] {
					if math.Float32bits(got[s][i]) != math.Float32bits(want[s][i]) {
						t.Fatalf("pass %d logit %d: %v from the file, %v from the same bytes in memory", s, i, got[s][i], want[s][i])
					}
				}
			}
			if typ != kernels.F32 {
				return
			}
			// Against Hugging Face's layout: the same tokens, logits within
			// float32 rounding of the sums' other order.
			for s := range got {
				var maxd, maxv float64
				for i := range got[s] {
					maxd = max(maxd, math.Abs(float64(got[s][i]-ref[s][i])))
					maxv = max(maxv, math.Abs(float64(ref[s][i])))
				}
				if maxd > 1e-4*max(1, maxv) {
					t.Fatalf("pass %d: logits differ from Hugging Face's layout by %g (largest logit %g)", s, maxd, maxv)
				}
				if a, b := slices.Index(got[s], slices.Max(got[s])), slices.Index(ref[s], slices.Max(ref[s])); a != b {
					t.Fatalf("pass %d: greedy token %d from the file, %d from Hugging Face's layout", s, a, b)
				}
			}
			tok, err := f.Tokenizer()
			if err != nil {
				t.Fatal(err)
			}
			if tok.Model != "llama" || len(tok.Tokens) != c.Vocab || tok.BOS != 1 || tok.EOS != 2 || !tok.AddBOS || tok.Piece(3+'z') != "z" || tok.Piece(300-1) != "[t299]" {
				t.Fatalf("tokenizer %s %d tokens bos %d eos %d add_bos %v piece %q %q", tok.Model, len(tok.Tokens), tok.BOS, tok.EOS, tok.AddBOS, tok.Piece(3+'z'), tok.Piece(299))
			}
		})
	}
}

// TestRoundTrip: metadata of every value type and tensors of every type
// the writer takes read back as written, data in place (Section reads the
// stored bytes; an f16 tensor is widened to f32 by Data; a k-quant is
// listed and refused).
func TestRoundTrip(t *testing.T) {
	w := gguf.NewWriter()
	kv := []struct {
		key string
		v   any
	}{
		{"general.alignment", uint32(64)}, {"u8", uint8(200)}, {"i8", int8(-3)}, {"u16", uint16(60000)}, {"i16", int16(-300)},
		{"u32", uint32(1 << 31)}, {"i32", int32(-1 << 30)}, {"f32", float32(1.5)}, {"b", true}, {"s", "héllo"},
		{"u64", uint64(1 << 63)}, {"i64", int64(-1 << 62)}, {"f64", 2.25}, {"arr.s", []string{"a", "", "ccc"}},
		{"arr.i32", []int32{1, -2, 3}}, {"arr.f32", []float32{0.5}}, {"arr.b", []bool{true, false}}, {"arr.u8", []uint8{}},
	}
	for _, e := range kv {
		if err := w.Set(e.key, e.v); err != nil {
			t.Fatal(err)
		}
	}
	vals := make([]float32, 3*64)
	for i := range vals {
		vals[i] = float32(i%17) - 8.25
	}
	f16 := make([]byte, 2*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint16(f16[2*i:], kernels.Float32ToHalf(v))
	}
	data := map[string][]byte{}
	for _, tc := range []struct {
		name string
		typ  gguf.Type
		b    []byte
	}{
		{"w.f32", gguf.F32, encode(t, kernels.F32, vals)}, {"w.bf16", gguf.BF16, encode(t, kernels.BF16, vals)},
		{"w.q8", gguf.Q8_0, encode(t, kernels.Q8_0, vals)}, {"w.q4", gguf.Q4_0, encode(t, kernels.Q4_0, vals)},
		{"w.f16", gguf.F16, f16}, {"w.q4k", gguf.Type(12), make([]byte, 144)},
	} {
		shape := []int{3, 64}
		if tc.typ == 12 {
			shape = []int{256}
		}
		if err := w.AddTensor(tc.name, tc.typ, shape, tc.b); err != nil {
			t.Fatal(err)
		}
		data[tc.name] = tc.b
	}
	path := filepath.Join(t.TempDir(), "rt.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(path); err == nil {
		t.Fatal("WriteFile overwrote an existing file")
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Version != 3 || f.Alignment != 64 || len(f.KV) != len(kv) || len(f.Tensors) != 6 {
		t.Fatalf("version %d alignment %d, %d keys, %d tensors", f.Version, f.Alignment, len(f.KV), len(f.Tensors))
	}
	for i, e := range kv {
		got := f.KV[i]
		if got.Key != e.key || !equalAny(got.Value.Any(), e.v) {
			t.Errorf("key %d: %s = %#v, want %s = %#v", i, got.Key, got.Value.Any(), e.key, e.v)
		}
	}
	for _, ti := range f.Tensors {
		if ti.Offset%64 != 0 {
			t.Errorf("tensor %s at %d, not aligned to 64", ti.Name, ti.Offset)
		}
		raw := make([]byte, ti.Bytes)
		if _, err := f.Section(&ti).ReadAt(raw, 0); err != nil {
			t.Fatal(err)
		}
		if string(raw) != string(data[ti.Name]) {
			t.Errorf("tensor %s: the stored bytes differ", ti.Name)
		}
	}
	d, err := f.Data("w.f16")
	if err != nil {
		t.Fatal(err)
	}
	if d.Type != gguf.F32 || len(d.Data) != 4*len(vals) {
		t.Fatalf("f16 data: type %v, %d bytes", d.Type, len(d.Data))
	}
	for i, v := range vals {
		if g := math.Float32frombits(binary.LittleEndian.Uint32(d.Data[4*i:])); g != v {
			t.Fatalf("f16 value %d widened to %v, want %v", i, g, v)
		}
	}
	if _, err := f.Data("w.q4k"); err == nil || !strings.Contains(err.Error(), "q4_k (allowed: f32, f16, bf16, q8_0, q4_0)") {
		t.Fatalf("a q4_k tensor's data: %v", err)
	}
}

func equalAny(a, b any) bool {
	switch x := b.(type) {
	case []string:
		y, ok := a.([]string)
		return ok && slices.Equal(x, y)
	case []int32:
		y, ok := a.([]int32)
		return ok && slices.Equal(x, y)
	case []float32:
		y, ok := a.([]float32)
		return ok && slices.Equal(x, y)
	case []bool:
		y, ok := a.([]bool)
		return ok && slices.Equal(x, y)
	case []uint8:
		y, ok := a.([]uint8)
		return ok && slices.Equal(x, y)
	}
	return a == b
}

// TestModelRefusals: metadata the decoder does not cover is refused
// naming the key.
func TestModelRefusals(t *testing.T) {
	c := llamaConfig()
	for _, tc := range []struct {
		name string
		edit func(w *gguf.Writer)
		want string
	}{
		{"arch", func(w *gguf.Writer) { w.Set("general.architecture", "gpt2") }, `general.architecture: "gpt2" (allowed: llama)`},
		{"rope scaling", func(w *gguf.Writer) {
			w.Set("general.architecture", "llama")
			w.Set("llama.rope.scaling.type", "yarn")
		}, `llama.rope.scaling.type: "yarn" (RoPE scaling is not covered`},
		{"kv heads", func(w *gguf.Writer) {
			w.Set("general.architecture", "llama")
			w.Set("llama.attention.head_count_kv", uint32(3))
		}, "llama.attention.head_count_kv: 3 does not divide head_count 4"},
		{"no eps", func(w *gguf.Writer) { w.Set("general.architecture", "llama") }, "llama.attention.layer_norm_rms_epsilon: absent (required)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := gguf.NewWriter()
			tc.edit(w)
			for _, kv := range []struct {
				k string
				v uint32
			}{{"llama.context_length", 64}, {"llama.embedding_length", 64}, {"llama.block_count", 2}, {"llama.feed_forward_length", 96}, {"llama.attention.head_count", 4}, {"llama.attention.head_count_kv", 2}} {
				w.Set(kv.k, kv.v)
			}
			if tc.name != "no eps" {
				w.Set("llama.attention.layer_norm_rms_epsilon", float32(1e-5))
			}
			w.AddTensor("token_embd.weight", gguf.F32, []int{c.Vocab, c.Dim}, make([]byte, 4*c.Vocab*c.Dim))
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := w.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Model(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Model: %v, want an error holding %q", err, tc.want)
			}
		})
	}
}

// TestReadsGGUFPy: a file written by llama.cpp's own Python writer
// (gguf-py) reads back with its metadata and tensors, and gguf-py's reader
// reads a file zinf wrote with the same offsets, types, shapes, metadata
// and dequantized values as zinf's kernels (the q8_0 and q4_0 layouts are
// the same on both sides). Skipped where
// gguf-py (LLAMA_CPP or /var/tmp/llamacpp, gguf-py/) or numpy is absent.
func TestReadsGGUFPy(t *testing.T) {
	dir := os.Getenv("LLAMA_CPP")
	if dir == "" {
		dir = "/var/tmp/llamacpp"
	}
	py := filepath.Join(dir, "gguf-py")
	if _, err := os.Stat(filepath.Join(py, "gguf", "gguf_writer.py")); err != nil {
		t.Skipf("llama.cpp's gguf-py is not at %s (set LLAMA_CPP): not checked against its writer", py)
	}
	// The first python3 that has numpy (gguf-py needs it): the one on
	// PATH, or the system's.
	python := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exe, err := exec.LookPath(p); err == nil && exec.Command(exe, "-c", "import numpy").Run() == nil {
			python = exe
			break
		}
	}
	if python == "" {
		t.Skip("no python3 with numpy: not checked against gguf-py")
	}
	path := filepath.Join(t.TempDir(), "py.gguf")
	script := `
import sys, numpy as np, gguf
from gguf import GGMLQuantizationType as Q
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_uint32("t.u32", 7)
w.add_float32("t.f32", 0.25)
w.add_string("t.s", "zinf")
w.add_bool("t.b", True)
w.add_array("t.as", ["a", "bc"])
w.add_array("t.ai", [1, -2, 3])
x = (np.arange(2 * 64, dtype=np.float32).reshape(2, 64) - 60) / 8
w.add_tensor("x.f32", x)
w.add_tensor("x.f16", x.astype(np.float16))
w.add_tensor("x.bf16", gguf.quants.quantize(x, Q.BF16), raw_dtype=Q.BF16)
w.add_tensor("x.q8", gguf.quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)
w.add_tensor("x.q4", gguf.quants.quantize(x, Q.Q4_0), raw_dtype=Q.Q4_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
`
	cmd := exec.Command(python, "-c", script, path)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+py)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gguf-py: %v\n%s", err, out)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for key, want := range map[string]any{"general.architecture": "llama", "t.u32": uint32(7), "t.f32": float32(0.25), "t.s": "zinf", "t.b": true,
		"t.as": []string{"a", "bc"}, "t.ai": []int32{1, -2, 3}} {
		v, ok := f.Get(key)
		if !ok || !equalAny(v.Any(), want) {
			t.Errorf("%s = %#v (present %v), want %#v", key, v.Any(), ok, want)
		}
	}
	x := make([]float32, 128)
	for i := range x {
		x[i] = (float32(i) - 60) / 8
	}

	// The other way: gguf-py's reader reads a file zinf wrote (its
	// offsets, types, shapes and metadata).
	zw := gguf.NewWriter()
	zw.Set("general.architecture", "llama")
	zw.Set("z.list", []string{"p", "qq"})
	zw.Set("z.f", float32(0.5))
	zw.AddTensor("z.f32", gguf.F32, []int{2, 64}, encode(t, kernels.F32, x))
	zw.AddTensor("z.q8", gguf.Q8_0, []int{2, 64}, encode(t, kernels.Q8_0, x))
	zw.AddTensor("z.q4", gguf.Q4_0, []int{2, 64}, encode(t, kernels.Q4_0, x))
	zpath := filepath.Join(t.TempDir(), "zinf.gguf")
	if err := zw.WriteFile(zpath); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(python, "-c", `
import sys, numpy as np, gguf
r = gguf.GGUFReader(sys.argv[1])
print(r.get_field("z.list").contents(), r.get_field("z.f").contents())
for t in r.tensors:
    d = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
    print(t.name, t.tensor_type.name, list(t.shape), "%.4f %.4f" % (d[0], d[127]))
`, zpath)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+py)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gguf-py's reader on zinf's file: %v\n%s", err, out)
	}
	// The first and last values as zinf's kernels dequantize them.
	want := "['p', 'qq'] 0.5\n"
	for _, z := range []struct {
		name, typ string
		t         kernels.DType
	}{{"z.f32", "F32", kernels.F32}, {"z.q8", "Q8_0", kernels.Q8_0}, {"z.q4", "Q4_0", kernels.Q4_0}} {
		b := encode(t, z.t, x)
		v := make([]float32, 64)
		kernels.Dequantize(v, z.t, b)
		first := v[0]
		kernels.Dequantize(v, z.t, b[len(b)/2:])
		want += fmt.Sprintf("%s %s [64, 2] %.4f %.4f\n", z.name, z.typ, first, v[63])
	}
	if string(out) != want {
		t.Fatalf("gguf-py read zinf's file as\n%s\nwant\n%s", out, want)
	}
	for _, tc := range []struct {
		name string
		typ  gguf.Type
		tol  float32
	}{{"x.f32", gguf.F32, 0}, {"x.f16", gguf.F16, 0}, {"x.bf16", gguf.BF16, 0}, {"x.q8", gguf.Q8_0, 0.05}, {"x.q4", gguf.Q4_0, 0.6}} {
		ti, ok := f.Tensor(tc.name)
		if !ok || ti.Type != tc.typ || !slices.Equal(ti.Shape(), []int{2, 64}) {
			t.Fatalf("tensor %s: %+v, want type %v shape [2 64]", tc.name, ti, tc.typ)
		}
		d, err := f.Data(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		dt, err := d.Type.DType()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 128)
		for r := range 2 {
			rb := len(d.Data) / 2
			if err := kernels.Dequantize(got[r*64:(r+1)*64], dt, d.Data[r*rb:]); err != nil {
				t.Fatal(err)
			}
		}
		for i := range x {
			if diff := got[i] - x[i]; diff > tc.tol || diff < -tc.tol {
				t.Fatalf("tensor %s value %d: %v, want %v within %v", tc.name, i, got[i], x[i], tc.tol)
			}
		}
	}
}

// TestDecoderFromF16File: a llama model whose matrices are stored in f16
// (the type most converted GGUF files use) runs on the decoder widened to
// f32 as it is read: the logits of the f16 values widened by hand, bit for
// bit.
func TestDecoderFromF16File(t *testing.T) {
	c := llamaConfig()
	c.RoPEInterleaved = true
	m := hfModel(c, 9)
	for _, layers := range m {
		for _, v := range layers {
			for i, f := range v {
				v[i] = kernels.HalfToFloat32(kernels.Float32ToHalf(f))
			}
		}
	}
	w, byName := direct(t, c, m, kernels.F32, false)
	gw := gguf.NewWriter()
	if err := errors.Join(gw.SetLlama("f16", gguf.ModelShape{Dim: c.Dim, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, FFNDim: c.FFNDim, RoPEBase: c.RoPEBase, NormEps: c.NormEps}, 64), gw.SetByteVocab(c.Vocab)); err != nil {
		t.Fatal(err)
	}
	names, _ := c.Names(decoder.GGUFNames, "")
	for _, n := range names {
		shape := c.Shape(n.Role)
		typ, data := gguf.F32, byName[n.Name].Data
		if len(shape) == 2 {
			typ = gguf.F16
			h := make([]byte, len(data)/2)
			for i := range len(data) / 4 {
				binary.LittleEndian.PutUint16(h[2*i:], kernels.Float32ToHalf(math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))))
			}
			data = h
		}
		if err := gw.AddTensor(n.Name, typ, shape, data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "f16.gguf")
	if err := gw.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	model, err := f.Model()
	if err != nil {
		t.Fatal(err)
	}
	mw, layers, err := f.Weights(model.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	if layers[0][decoder.Query].Type != kernels.F32 || len(layers[0][decoder.Query].Data) != 4*c.Heads*c.HeadDim*c.Dim {
		t.Fatalf("an f16 query matrix reads as %v of %d bytes, want f32", layers[0][decoder.Query].Type, len(layers[0][decoder.Query].Data))
	}
	prompt := gguf.ByteTokens("f16")
	got, want := greedy(t, model.Config, weights{mw, layers}, prompt, 3), greedy(t, c, w, prompt, 3)
	for s := range got {
		for i := range got[s] {
			if math.Float32bits(got[s][i]) != math.Float32bits(want[s][i]) {
				t.Fatalf("pass %d logit %d: %v from the f16 file, %v from its values in f32", s, i, got[s][i], want[s][i])
			}
		}
	}
}

// TestTokenizerRefusals: tokenizer metadata that does not fit the token
// list is refused naming the key.
func TestTokenizerRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   map[string]any
		want string
	}{
		{"no model", map[string]any{"tokenizer.ggml.tokens": []string{"a"}}, "tokenizer.ggml.model: absent"},
		{"no tokens", map[string]any{"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.tokens: absent"},
		{"scores", map[string]any{"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []string{"a", "b"}, "tokenizer.ggml.scores": []float32{0}}, "tokenizer.ggml.scores: [0] (want 2 float32 values"},
		{"types", map[string]any{"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []string{"a", "b"}, "tokenizer.ggml.token_type": []uint8{1, 1}}, "tokenizer.ggml.token_type: [1 1] (want 2 int32 values"},
		{"bos", map[string]any{"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []string{"a", "b"}, "tokenizer.ggml.bos_token_id": uint32(2)}, "tokenizer.ggml.bos_token_id: 2 (allowed: a token id 0..1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := gguf.NewWriter()
			keys := make([]string, 0, len(tc.kv))
			for k := range tc.kv {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				if err := w.Set(k, tc.kv[k]); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(t.TempDir(), "tok.gguf")
			if err := w.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Tokenizer(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Tokenizer: %v, want an error holding %q", err, tc.want)
			}
		})
	}
}

// TestTiedHead: a file without output.weight is a tied head (llama.cpp
// reads the head from token_embd then): Model says so and the decoder's
// logits are those of the same weights handed to it directly.
func TestTiedHead(t *testing.T) {
	c := llamaConfig()
	c.RoPEInterleaved, c.TiedHead = true, true
	w, byName := direct(t, c, hfModel(c, 11), kernels.BF16, false)
	f, err := gguf.Open(writeLlama(t, c, byName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	model, err := f.Model()
	if err != nil {
		t.Fatal(err)
	}
	if !model.Config.TiedHead {
		t.Fatal("no output.weight, and Model's Config is not TiedHead")
	}
	mw, layers, err := f.Weights(model.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	prompt := gguf.ByteTokens("tied")
	got, want := greedy(t, model.Config, weights{mw, layers}, prompt, 2), greedy(t, c, w, prompt, 2)
	for s := range got {
		if !slices.Equal(got[s], want[s]) {
			t.Fatalf("pass %d: the logits differ from the same weights in memory", s)
		}
	}
}
