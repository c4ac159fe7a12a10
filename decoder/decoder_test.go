package decoder_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// llama is a small Llama-shaped model: pre-norm RMSNorm, SwiGLU, GQA,
// RoPE, untied head; dimensions that are multiples of 32 so that every
// weight type fits.
func llama() decoder.Config {
	return decoder.Config{Vocab: 61, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96,
		Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm, NormEps: 1e-5,
		Activation: decoder.SiLU, Gated: true, RoPEBase: 10000}
}

// model is a model's weights as float32 values by role, and as Tensors of
// a type.
type model struct {
	c      decoder.Config
	vals   map[decoder.Name][]float32
	mw     decoder.ModelWeights
	layers []decoder.LayerWeights
}

// randomModel draws c's weights from seed: matrices N(0, 1/in), vectors
// near 1 (scales) or near 0 (offsets, biases).
func randomModel(t testing.TB, c decoder.Config, seed uint64) *model {
	t.Helper()
	names, err := c.Names(decoder.HFNames, "")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	m := &model{c: c, vals: map[decoder.Name][]float32{}}
	for _, n := range names {
		shape := c.Shape(n.Role)
		size, sd, mean := 1, 0.1, 0.0
		for _, d := range shape {
			size *= d
		}
		if len(shape) == 2 {
			sd = 1 / math.Sqrt(float64(shape[1]))
		} else if strings.HasSuffix(n.Name, "layernorm.weight") || strings.HasSuffix(n.Name, "norm.weight") {
			mean = 1
		}
		v := make([]float32, size)
		for i := range v {
			v[i] = float32(mean + sd*rng.NormFloat64())
		}
		m.vals[n] = v
	}
	return m
}

// as returns the model's weights with matrices in type typ (vectors f32).
// For a block type the values are first rounded to what the type holds,
// and the model's values replaced by the rounded ones.
func (m *model) as(t testing.TB, typ kernels.DType) *model {
	t.Helper()
	out := &model{c: m.c, vals: map[decoder.Name][]float32{}, layers: make([]decoder.LayerWeights, m.c.Layers)}
	for n, v := range m.vals {
		tt := decoder.Tensor{Type: kernels.F32}
		if len(m.c.Shape(n.Role)) == 2 {
			tt.Type = typ
		}
		rb, err := kernels.RowBytes(tt.Type, len(v))
		if err != nil {
			t.Fatal(err)
		}
		tt.Data = make([]byte, rb)
		switch tt.Type {
		case kernels.F32:
			for i, f := range v {
				binary.LittleEndian.PutUint32(tt.Data[4*i:], math.Float32bits(f))
			}
		case kernels.BF16:
			for i, f := range v {
				binary.LittleEndian.PutUint16(tt.Data[2*i:], kernels.Float32ToBF16(f))
			}
		case kernels.Q8_0:
			if _, err := kernels.QuantizeQ8_0(tt.Data, v); err != nil {
				t.Fatal(err)
			}
		case kernels.Q4_0:
			if _, err := kernels.QuantizeQ4_0(tt.Data, v); err != nil {
				t.Fatal(err)
			}
		}
		w := make([]float32, len(v))
		if err := kernels.Dequantize(w, tt.Type, tt.Data); err != nil {
			t.Fatal(err)
		}
		out.vals[n] = w
		if n.Layer >= 0 {
			out.layers[n.Layer][n.Role] = tt
		} else if err := out.mw.Set(n.Role, tt); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// run is a prefill of prompts then greedy steps; it returns every step's
// logits and the final cache.
func run(t testing.TB, m *model, prompts [][]int32, steps int, oneByOne bool, pool ...*kernels.Pool) ([][]float32, [2][]float32) {
	t.Helper()
	c := m.c
	var p *kernels.Pool
	if len(pool) > 0 {
		p = pool[0]
	}
	d, err := decoder.New(c, p)
	if err != nil {
		t.Fatal(err)
	}
	batch, maxLen := len(prompts), len(prompts[0])+steps
	kv := c.KVHeads
	if kv == 0 {
		kv = c.Heads
	}
	n := c.Layers * batch * maxLen * kv * c.HeadDim
	kc, vc := make([]float32, n), make([]float32, n)
	cache, err := decoder.NewKVCache(c, batch, maxLen, kc, vc)
	if err != nil {
		t.Fatal(err)
	}
	pos := make([]int, batch)
	pass := func(toks [][]int32) []float32 {
		if err := d.Begin(cache, toks, pos, &m.mw); err != nil {
			t.Fatal(err)
		}
		for l := range c.Layers {
			if err := d.Layer(l, &m.layers[l]); err != nil {
				t.Fatal(err)
			}
		}
		out := make([]float32, batch*c.Vocab)
		if err := d.Logits(&m.mw, out); err != nil {
			t.Fatal(err)
		}
		for b := range pos {
			pos[b] += len(toks[b])
		}
		return out
	}
	var all [][]float32
	var out []float32
	if oneByOne {
		for i := range prompts[0] {
			toks := make([][]int32, batch)
			for b := range toks {
				toks[b] = prompts[b][i : i+1]
			}
			out = pass(toks)
		}
	} else {
		out = pass(prompts)
	}
	all = append(all, out)
	for range steps {
		toks := make([][]int32, batch)
		for b := range toks {
			row := out[b*c.Vocab : (b+1)*c.Vocab]
			toks[b] = []int32{int32(slices.Index(row, slices.Max(row)))}
		}
		out = pass(toks)
		all = append(all, out)
	}
	return all, [2][]float32{kc, vc}
}

func prompts(batch, n, vocab int) [][]int32 {
	p := make([][]int32, batch)
	for b := range p {
		for j := range n {
			p[b] = append(p[b], int32((b*13+j*7+5)%vocab))
		}
	}
	return p
}

// inOutModel returns m's weights with every matrix but the embedding
// stored in features by out features (the zoo's layout: Layout and
// HeadLayout InOut), as typ.
func inOutModel(t testing.TB, m *model, typ kernels.DType) *model {
	t.Helper()
	c := m.c
	ci := c
	ci.Layout, ci.HeadLayout = decoder.InOut, decoder.InOut
	tr := &model{c: ci, vals: map[decoder.Name][]float32{}}
	for n, v := range m.vals {
		shape := c.Shape(n.Role)
		if len(shape) == 2 && n.Role != decoder.Embedding {
			rows, cols := shape[0], shape[1]
			w := make([]float32, len(v))
			for r := range rows {
				for k := range cols {
					w[k*rows+r] = v[r*cols+k]
				}
			}
			v = w
		}
		tr.vals[n] = v
	}
	return tr.as(t, typ)
}

// runOnPools runs m (run: prompts, then steps) on a new pool of each
// kernel named (nil: the machine's fastest only) and of each worker
// count, and requires the same logits' bits from all: what the first
// gave. label starts a failure's message.
func runOnPools(t testing.TB, label string, m *model, prompts [][]int32, steps int, kernelNames []string, workers ...int) [][]float32 {
	t.Helper()
	if kernelNames == nil {
		kernelNames = []string{""}
	}
	var first [][]float32
	var firstRun string
	for _, kn := range kernelNames {
		for _, w := range workers {
			pool, err := kernels.NewPool(kernels.Options{Workers: w, Kernel: kn})
			if err != nil {
				t.Fatal(err)
			}
			out, _ := run(t, m, prompts, steps, false, pool)
			pool.Close()
			name := fmt.Sprintf("kernel %s, %d workers", pool.Kernel(), w)
			if first == nil {
				first, firstRun = out, name
				continue
			}
			for s := range first {
				if !slices.Equal(first[s], out[s]) {
					t.Fatalf("%sstep %d: %s %v, %s %v", label, s, firstRun, first[s][:4], name, out[s][:4])
				}
			}
		}
	}
	return first
}

// requireClose requires each step's logits got within tol of want,
// relative to the step's largest |want| (at least 1). label starts a
// failure's message; what names got and want in it.
func requireClose(t testing.TB, label string, got, want [][]float32, tol float64, what [2]string) {
	t.Helper()
	for s := range want {
		scale := 1.0
		for _, v := range want[s] {
			scale = max(scale, math.Abs(float64(v)))
		}
		for i := range want[s] {
			if e := math.Abs(float64(got[s][i]-want[s][i])) / scale; e > tol {
				t.Fatalf("%sstep %d logit %d: %s %v, %s %v (relative error %.3g)", label, s, i, what[0], got[s][i], what[1], want[s][i], e)
			}
		}
	}
}

// TestPrefillEqualsSteps: a prefill (matrix products over the prompt's
// positions, causal attention among them) gives the logits and KV cache of
// feeding the prompt one token at a time, bit for bit: the kernels' sums
// do not depend on the batch (the block formats quantize each vector on
// its own), and each position's attention reads the same cache entries in
// the same order.
func TestPrefillEqualsSteps(t *testing.T) {
	for _, typ := range []kernels.DType{kernels.Q8_0, kernels.Q4_0} {
		c := llama()
		m := randomModel(t, c, 3).as(t, typ)
		ps := prompts(2, 11, c.Vocab)
		a, ca := run(t, m, ps, 4, false)
		b, cb := run(t, m, ps, 4, true)
		for s := range a {
			if !slices.Equal(a[s], b[s]) {
				t.Fatalf("%v: step %d: prefill logits %v, one by one %v", typ, s, a[s][:4], b[s][:4])
			}
		}
		if !slices.Equal(ca[0], cb[0]) || !slices.Equal(ca[1], cb[1]) {
			t.Fatalf("%v: the KV caches differ", typ)
		}
	}
	for _, c := range []decoder.Config{llama(), func() decoder.Config {
		c := llama()
		c.Block, c.Norm, c.FinalNorm, c.Gated, c.Activation = decoder.PostNorm, decoder.LayerNorm, decoder.LayerNorm, false, decoder.GELU
		c.QKVBias, c.OutBias, c.FFNBias, c.RoPEInterleaved, c.RoPEDims, c.KVHeads = true, true, true, true, 8, 1
		return c
	}()} {
		m := randomModel(t, c, 3).as(t, kernels.F32)
		ps := prompts(2, 11, c.Vocab) // 22 rows: several products of MaxBatch
		a, ca := run(t, m, ps, 4, false)
		b, cb := run(t, m, ps, 4, true)
		for s := range a {
			if !slices.Equal(a[s], b[s]) {
				t.Fatalf("%v: step %d: prefill logits %v, one by one %v", c.Block, s, a[s][:4], b[s][:4])
			}
		}
		if !slices.Equal(ca[0], cb[0]) || !slices.Equal(ca[1], cb[1]) {
			t.Fatalf("%v: the KV caches differ", c.Block)
		}
	}
}

// TestBatchEqualsSingle: each sequence of a batch gets the bits it gets
// alone.
func TestBatchEqualsSingle(t *testing.T) {
	c := llama()
	base := randomModel(t, c, 5)
	for _, typ := range []kernels.DType{kernels.F32, kernels.Q8_0, kernels.Q4_0} {
		m := base.as(t, typ)
		ps := prompts(3, 6, c.Vocab)
		all, _ := run(t, m, ps, 3, false)
		for b := range ps {
			one, _ := run(t, m, ps[b:b+1], 3, false)
			for s := range one {
				if !slices.Equal(one[s], all[s][b*c.Vocab:(b+1)*c.Vocab]) {
					t.Fatalf("%v: sequence %d step %d: alone %v, in the batch %v", typ, b, s, one[s][:4], all[s][b*c.Vocab:][:4])
				}
			}
		}
	}
}

// TestWorkersSameBits: attention split over several goroutines (a long
// prefill) gives the bits of one goroutine, as the products do.
func TestWorkersSameBits(t *testing.T) {
	c := llama()
	m := randomModel(t, c, 17).as(t, kernels.F32)
	runOnPools(t, "", m, prompts(2, 48, c.Vocab), 2, nil, 1, 3)
}

// quantTolerance bounds the logits of a model with Q8_0 or Q4_0
// matrices against the same model with those weights widened to f32
// (relative to the step's largest |logit|, at least 1): the block
// formats multiply the vectors quantized to 8-bit blocks, as llama.cpp
// does, which changes each product by up to about 0.4% of its block's
// largest input times its weights.
const quantTolerance = 0.05

// TestStoredTypesMatchTheirValues: a model with bf16 matrices gives, bit
// for bit, the logits of the same model with those weights widened to
// f32 (the decoder reads the stored type in the kernels, and the
// kernels' sums do not depend on it); a model with Q8_0 or Q4_0 matrices
// gives them within quantTolerance (its products take the vectors
// quantized to 8-bit blocks).
func TestStoredTypesMatchTheirValues(t *testing.T) {
	c := llama()
	base := randomModel(t, c, 9)
	ps, ps4 := prompts(2, 4, c.Vocab), prompts(4, 9, c.Vocab)
	for _, typ := range []kernels.DType{kernels.BF16, kernels.Q8_0, kernels.Q4_0} {
		q := base.as(t, typ)
		wide := (&model{c: c, vals: q.vals}).as(t, kernels.F32)
		got, _ := run(t, q, ps, 3, false)
		want, _ := run(t, wide, ps, 3, false)
		if typ == kernels.BF16 {
			for s := range got {
				if !slices.Equal(got[s], want[s]) {
					t.Fatalf("%v: step %d: logits %v, widened %v", typ, s, got[s][:4], want[s][:4])
				}
			}
			continue
		}
		// The prompts' last logits only: greedy tokens fed back may
		// flip at a near tie, and the sequences part.
		got, _ = run(t, q, ps4, 0, false)
		want, _ = run(t, wide, ps4, 0, false)
		worst := 0.0
		for s := range got {
			scale := 1.0
			for _, v := range want[s] {
				scale = max(scale, math.Abs(float64(v)))
			}
			for i := range want[s] {
				worst = max(worst, math.Abs(float64(got[s][i]-want[s][i]))/scale)
			}
		}
		t.Logf("%v: worst relative logit error against the widened weights %.3g", typ, worst)
		requireClose(t, typ.String()+": ", got, want, quantTolerance, [2]string{"logit", "widened"})
		if worst == 0 {
			t.Fatalf("%v: the logits equal the widened model's: the vectors were not quantized", typ)
		}
	}
}

// TestAgainstFloat64 holds a decoding step of a Sandwich (Gemma-like)
// model with a tied head to a plain float64 forward written out here, as
// the package documentation defines it.
func TestAgainstFloat64(t *testing.T) {
	c := llama()
	c.Block, c.NormScaleOffset, c.EmbedScale, c.TiedHead, c.Activation = decoder.Sandwich, 1, true, true, decoder.GELUTanh
	m := randomModel(t, c, 13).as(t, kernels.F32)
	ps := prompts(1, 5, c.Vocab)
	got, _ := run(t, m, ps, 0, false)
	want := float64Forward(m, ps[0])
	scale := 1.0
	for _, v := range want {
		scale = max(scale, math.Abs(v))
	}
	for i := range want {
		if e := math.Abs(float64(got[0][i])-want[i]) / scale; e > 1e-5 {
			t.Fatalf("logit %d: %v, float64 %v (relative error %.3g)", i, got[0][i], want[i], e)
		}
	}
}

// float64Forward is a Sandwich model with a tied head and a GELU-tanh
// gated FFN in float64, over the whole sequence, last position's logits.
func float64Forward(m *model, toks []int32) []float64 {
	c := m.c
	get := func(r decoder.Role, layer int) []float64 {
		for n, v := range m.vals {
			if n.Role == r && n.Layer == layer {
				out := make([]float64, len(v))
				for i, f := range v {
					out[i] = float64(f)
				}
				return out
			}
		}
		return nil
	}
	mat := func(w []float64, rows, cols int, x []float64) []float64 {
		y := make([]float64, rows)
		for r := range rows {
			for k := range cols {
				y[r] += w[r*cols+k] * x[k]
			}
		}
		return y
	}
	rms := func(x, g []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		d := math.Sqrt(ss/float64(len(x)) + c.NormEps)
		y := make([]float64, len(x))
		for i := range x {
			y[i] = x[i] / d * (g[i] + c.NormScaleOffset)
		}
		return y
	}
	T, hd, kvh := len(toks), c.HeadDim, c.KVHeads
	emb := get(decoder.Embedding, -1)
	xs := make([][]float64, T)
	for t, tok := range toks {
		xs[t] = slices.Clone(emb[int(tok)*c.Dim : (int(tok)+1)*c.Dim])
		for i := range xs[t] {
			xs[t][i] *= math.Sqrt(float64(c.Dim))
		}
	}
	rope := func(v []float64, heads, p int) {
		for h := range heads {
			for i := range hd / 2 {
				f := math.Pow(c.RoPEBase, -2*float64(i)/float64(hd))
				cs, sn := math.Cos(float64(p)*f), math.Sin(float64(p)*f)
				a, b := v[h*hd+i], v[h*hd+i+hd/2]
				v[h*hd+i], v[h*hd+i+hd/2] = a*cs-b*sn, a*sn+b*cs
			}
		}
	}
	for l := range c.Layers {
		qs, ks, vs := make([][]float64, T), make([][]float64, T), make([][]float64, T)
		for t := range T {
			h := rms(xs[t], get(decoder.AttnNorm, l))
			qs[t] = mat(get(decoder.Query, l), c.Heads*hd, c.Dim, h)
			ks[t] = mat(get(decoder.Key, l), kvh*hd, c.Dim, h)
			vs[t] = mat(get(decoder.Value, l), kvh*hd, c.Dim, h)
			rope(qs[t], c.Heads, t)
			rope(ks[t], kvh, t)
		}
		for t := range T {
			o := make([]float64, c.Heads*hd)
			for h := range c.Heads {
				g := h / (c.Heads / kvh)
				s := make([]float64, t+1)
				var mx = math.Inf(-1)
				for j := range s {
					for i := range hd {
						s[j] += qs[t][h*hd+i] * ks[j][g*hd+i]
					}
					s[j] /= math.Sqrt(float64(hd))
					mx = max(mx, s[j])
				}
				var sum float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				for j := range s {
					for i := range hd {
						o[h*hd+i] += s[j] / sum * vs[j][g*hd+i]
					}
				}
			}
			a := rms(mat(get(decoder.Out, l), c.Dim, c.Heads*hd, o), get(decoder.PostAttnNorm, l))
			for i := range xs[t] {
				xs[t][i] += a[i]
			}
			h := rms(xs[t], get(decoder.FFNNorm, l))
			gt := mat(get(decoder.Gate, l), c.FFNDim, c.Dim, h)
			up := mat(get(decoder.Up, l), c.FFNDim, c.Dim, h)
			for i := range gt {
				x := gt[i]
				gt[i] = 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x))) * up[i]
			}
			f := rms(mat(get(decoder.Down, l), c.Dim, c.FFNDim, gt), get(decoder.PostFFNNorm, l))
			for i := range xs[t] {
				xs[t][i] += f[i]
			}
		}
	}
	h := rms(xs[T-1], get(decoder.FinalNormScale, -1))
	return mat(emb, c.Vocab, c.Dim, h)
}

// TestConfigErrors: each bad field is named with its value and what is
// allowed.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		edit func(*decoder.Config)
		want string
	}{
		{func(c *decoder.Config) { c.Dim = 0 }, "Config.Dim 0 is outside 1.."},
		{func(c *decoder.Config) { c.KVHeads = 3 }, "Config.KVHeads 3 does not divide Heads 4"},
		{func(c *decoder.Config) { c.KVHeads = -1 }, "Config.KVHeads -1 is outside 0.."},
		{func(c *decoder.Config) { c.Block = 0 }, "Config.Block Block(0) (allowed: PostNorm, PreNorm, Sandwich)"},
		{func(c *decoder.Config) { c.Norm = decoder.NoNorm }, "Config.Norm none with Block pre-norm"},
		{func(c *decoder.Config) { c.NormEps = math.NaN() }, "Config.NormEps NaN is outside 0..1"},
		{func(c *decoder.Config) { c.Activation = 9 }, "Config.Activation Activation(9) (allowed: SiLU, GELU, GELUTanh, ReLU)"},
		{func(c *decoder.Config) { c.Gated, c.FusedGateUp = false, true }, "Config.FusedGateUp true with Gated false"},
		{func(c *decoder.Config) { c.RoPEBase = 0.5 }, "Config.RoPEBase 0.5"},
		{func(c *decoder.Config) { c.RoPEDims = 7 }, "Config.RoPEDims 7 (allowed: 0 for the whole head, or an even count up to HeadDim 16)"},
		{func(c *decoder.Config) { c.HeadDim = 15 }, "Config.HeadDim 15 is odd with RoPE over the whole head"},
		{func(c *decoder.Config) { c.TiedHead, c.HeadLayout = true, decoder.InOut }, "Config.HeadLayout in-out with TiedHead"},
	} {
		c := llama()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
		if _, err := decoder.New(c, nil); err == nil {
			t.Errorf("New accepted the config that Validate refuses (%s)", tc.want)
		}
	}
	if c := llama(); c.Validate() != nil {
		t.Fatal(c.Validate())
	}
}

// TestPassErrors: misuse and bad weights return errors naming the
// problem, never panic, and leave the decoder usable.
func TestPassErrors(t *testing.T) {
	c := llama()
	m := randomModel(t, c, 1).as(t, kernels.F32)
	d, err := decoder.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := c.Layers * 1 * 8 * c.KVHeads * c.HeadDim
	if _, err := decoder.NewKVCache(c, 1, 8, make([]float32, n-1), make([]float32, n)); err == nil || !strings.Contains(err.Error(), "want layers 2 x batch 1 x length 8") {
		t.Errorf("short cache: %v", err)
	}
	big := c
	big.Layers, big.Heads, big.KVHeads, big.HeadDim = 1<<24, 1<<12, 1<<12, 1<<12
	if _, err := decoder.NewKVCache(big, 1<<24, decoder.MaxCacheLen, nil, nil); err == nil || !strings.Contains(err.Error(), "values is above") {
		t.Errorf("a KV cache whose size overflows: %v", err)
	}
	cache, err := decoder.NewKVCache(c, 1, 8, make([]float32, n), make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	tok := [][]int32{{1, 2}}
	check := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error containing %q", what, err, want)
		}
	}
	check("layer before Begin", d.Layer(0, &m.layers[0]), "call Begin first")
	check("token out of vocab", d.Begin(cache, [][]int32{{int32(c.Vocab)}}, []int{0}, &m.mw), "token 61 is outside 0..60")
	check("past the cache", d.Begin(cache, tok, []int{7}, &m.mw), "do not fit a KV cache of 8 positions")
	check("two positions", d.Begin(cache, tok, []int{0, 0}, &m.mw), "for a KV cache of batch 1")
	short := m.mw
	short.Embedding.Data = short.Embedding.Data[:10]
	check("short embedding", d.Begin(cache, tok, []int{0}, &short), "weight Embedding: 10 bytes")
	if err := d.Begin(cache, tok, []int{0}, &m.mw); err != nil {
		t.Fatal(err)
	}
	check("layer out of order", d.Layer(1, &m.layers[1]), "Layer 1, want layer 0 next")
	check("logits early", d.Logits(&m.mw, make([]float32, c.Vocab)), "before the pass ran its 2 layers")
	bad := m.layers[0]
	bad[decoder.Key].Data = bad[decoder.Key].Data[:len(bad[decoder.Key].Data)-4]
	check("short key", d.Layer(0, &bad), "layer 0: weight Key")
	bad = m.layers[0]
	bad[decoder.AttnNorm].Type = kernels.Q8_0
	if err := d.Begin(cache, tok, []int{0}, &m.mw); err != nil {
		t.Fatal(err)
	}
	check("quantized norm", d.Layer(0, &bad), "weight AttnNorm scale: type q8_0 (allowed for vectors: f32, bf16)")
	// The decoder still works after the errors.
	if err := d.Begin(cache, tok, []int{0}, &m.mw); err != nil {
		t.Fatal(err)
	}
	for l := range c.Layers {
		if err := d.Layer(l, &m.layers[l]); err != nil {
			t.Fatal(err)
		}
	}
	check("logits length", d.Logits(&m.mw, make([]float32, 3)), "out has 3 values, want batch 1 x vocab 61")

	// A bias the configuration asks for and the weights lack is an error,
	// not a silent zero.
	cb := c
	cb.QKVBias = true
	db, err := decoder.New(cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Begin(cache, tok, []int{0}, &m.mw); err != nil {
		t.Fatal(err)
	}
	check("missing bias", db.Layer(0, &m.layers[0]), "layer 0: weight Query bias is missing (want 64 f32 or bf16 values)")
	bad = m.layers[0]
	bad[decoder.Value] = decoder.Tensor{}
	if err := d.Begin(cache, tok, []int{0}, &m.mw); err != nil {
		t.Fatal(err)
	}
	check("missing matrix", d.Layer(0, &bad), "layer 0: weight Value is missing (want 32 x 64 values)")
}

// TestNames: the Hugging Face and zoo names of a Llama-shaped and a
// zoo-shaped model.
func TestNames(t *testing.T) {
	c := llama()
	names, err := c.Names(decoder.HFNames, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range names {
		if n.Layer <= 0 {
			got = append(got, n.Name)
		}
	}
	want := []string{"model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
		"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
		"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
		"model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
	if !slices.Equal(got, want) {
		t.Errorf("HF names\n%q\nwant\n%q", got, want)
	}
	c.Block, c.Norm, c.FusedGateUp, c.QKVBias = decoder.PostNorm, decoder.LayerNorm, true, true
	names, err = c.Names(decoder.ZooNames, "/transformer")
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, n := range names {
		if n.Layer == 1 {
			got = append(got, n.Name)
		}
	}
	want = []string{"/transformer/layer_1/norm1/layer_normalization/gain", "/transformer/layer_1/norm1/layer_normalization/offset",
		"/transformer/layer_1/norm2/layer_normalization/gain", "/transformer/layer_1/norm2/layer_normalization/offset",
		"/transformer/layer_1/attn/MultiHeadAttention/query/dense/weights", "/transformer/layer_1/attn/MultiHeadAttention/query/dense/biases",
		"/transformer/layer_1/attn/MultiHeadAttention/key/dense/weights", "/transformer/layer_1/attn/MultiHeadAttention/key/dense/biases",
		"/transformer/layer_1/attn/MultiHeadAttention/value/dense/weights", "/transformer/layer_1/attn/MultiHeadAttention/value/dense/biases",
		"/transformer/layer_1/attn/MultiHeadAttention/output/dense/weights",
		"/transformer/layer_1/ff1/dense/weights", "/transformer/layer_1/ff2/dense/weights"}
	if !slices.Equal(got, want) {
		t.Errorf("zoo names\n%q\nwant\n%q", got, want)
	}
}

// TestInOutLayout: weights stored in features by out features (the zoo's
// default) give the logits of the same weights stored out by in, within
// float32 rounding (the sums run in another order), and the same bits on
// one worker or three.
func TestInOutLayout(t *testing.T) {
	c := llama()
	c.Vocab, c.Dim, c.FFNDim, c.HeadDim = 600, 128, 512, 32
	m := randomModel(t, c, 19).as(t, kernels.F32)
	tr := inOutModel(t, m, kernels.F32)
	ps := prompts(2, 5, c.Vocab)
	want, _ := run(t, m, ps, 3, false)
	got := runOnPools(t, "", tr, ps, 3, nil, 1, 3)
	requireClose(t, "", got, want, 1e-5, [2]string{"in-out", "out-in"})
}

// TestEveryWeightChecked: a weight one byte short, or of a type its place
// does not take, is an error naming it, whichever weight it is; nothing
// panics.
func TestEveryWeightChecked(t *testing.T) {
	for _, c := range []decoder.Config{llama(), func() decoder.Config {
		c := llama()
		c.Block, c.Norm, c.FinalNorm, c.EmbedNorm, c.FusedGateUp = decoder.Sandwich, decoder.LayerNorm, decoder.LayerNorm, decoder.RMSNorm, true
		c.QKVBias, c.OutBias, c.FFNBias, c.Layout, c.HeadLayout = true, true, true, decoder.InOut, decoder.InOut
		return c
	}()} {
		m := randomModel(t, c, 2).as(t, kernels.F32)
		names, err := c.Names(decoder.HFNames, "")
		if err != nil {
			t.Fatal(err)
		}
		d, err := decoder.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := c.Layers * 8 * c.KVHeads * c.HeadDim
		cache, err := decoder.NewKVCache(c, 1, 8, make([]float32, n), make([]float32, n))
		if err != nil {
			t.Fatal(err)
		}
		for _, nm := range names {
			for _, mode := range []string{"short", "q4_0"} {
				mw, layers := m.mw, slices.Clone(m.layers)
				var tt *decoder.Tensor
				if nm.Layer >= 0 {
					tt = &layers[nm.Layer][nm.Role]
				} else {
					switch nm.Role {
					case decoder.Embedding:
						tt = &mw.Embedding
					case decoder.EmbedNormScale:
						tt = &mw.EmbedNormScale
					case decoder.EmbedNormOffset:
						tt = &mw.EmbedNormOffset
					case decoder.FinalNormScale:
						tt = &mw.FinalNormScale
					case decoder.FinalNormOffset:
						tt = &mw.FinalNormOffset
					case decoder.Head:
						tt = &mw.Head
					}
				}
				if mode == "short" {
					tt.Data = tt.Data[:len(tt.Data)-1]
				} else {
					tt.Type = kernels.Q4_0
					if nm.Role == decoder.Embedding {
						continue // a Q4_0 embedding of these bytes is a valid (other) table when the length fits
					}
				}
				err := d.Begin(cache, [][]int32{{1, 2}}, []int{0}, &mw)
				for l := 0; err == nil && l < c.Layers; l++ {
					err = d.Layer(l, &layers[l])
				}
				if err == nil {
					err = d.Logits(&mw, make([]float32, c.Vocab))
				}
				if err == nil {
					t.Errorf("%v %s (%s): no error", c.Block, nm.Name, mode)
				}
			}
		}
	}
}

// TestBinding: a model bound by Hugging Face name, a layer at a time, as
// a streaming caller binds views of its buffers, gives the logits of the
// model built by role; a name the views lack is an error naming it.
func TestBinding(t *testing.T) {
	c := llama()
	m := randomModel(t, c, 23).as(t, kernels.F32)
	byName := map[string]decoder.Tensor{}
	for n := range m.vals {
		if n.Layer >= 0 {
			byName[n.Name] = m.layers[n.Layer][n.Role]
		}
	}
	byName["model.embed_tokens.weight"] = m.mw.Embedding
	byName["model.norm.weight"] = m.mw.FinalNormScale
	byName["lm_head.weight"] = m.mw.Head
	view := func(name string) (decoder.Tensor, error) {
		t, ok := byName[name]
		if !ok {
			return t, errors.New("no such tensor")
		}
		return t, nil
	}
	b, err := c.Binding(decoder.HFNames, "")
	if err != nil {
		t.Fatal(err)
	}
	bound := &model{c: c, layers: make([]decoder.LayerWeights, c.Layers)}
	if err := b.Model(view, &bound.mw); err != nil {
		t.Fatal(err)
	}
	for l := range c.Layers {
		if err := b.Layer(l, view, &bound.layers[l]); err != nil {
			t.Fatal(err)
		}
	}
	ps := prompts(1, 4, c.Vocab)
	want, _ := run(t, m, ps, 2, false)
	got, _ := run(t, bound, ps, 2, false)
	for s := range want {
		if !slices.Equal(got[s], want[s]) {
			t.Fatalf("step %d: bound %v, by role %v", s, got[s][:4], want[s][:4])
		}
	}
	delete(byName, "model.layers.1.mlp.up_proj.weight")
	var lw decoder.LayerWeights
	if err := b.Layer(1, view, &lw); err == nil || !strings.Contains(err.Error(), `weight "model.layers.1.mlp.up_proj.weight": no such tensor`) {
		t.Errorf("a missing tensor: %v", err)
	}
	if err := b.Layer(2, view, &lw); err == nil || !strings.Contains(err.Error(), "layer 2 is outside 0..1") {
		t.Errorf("layer 2 of 2: %v", err)
	}
}
