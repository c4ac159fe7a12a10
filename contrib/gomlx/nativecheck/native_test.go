package nativecheck_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend" // the pure-Go backend
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers/activation"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/contrib/gomlx/nativecheck"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// tolerance is the per-element bound on the native decoder's fp32 logits
// against GoMLX's: |native - gomlx| <= tolerance * max(1, max |gomlx| of
// the row). Both compute in float32 with different summation orders,
// exp, erf and cos implementations; the measured worst case is printed.
const tolerance = 2e-5

// quantTolerance is the same bound for a model whose matrices are Q8_0
// or Q4_0 blocks, against GoMLX on the dequantized weights: the native
// decoder multiplies them with the activations quantized to 8-bit blocks
// (as llama.cpp does; decoder/kernels' documentation), which moves a
// product by up to about 0.4% of its block's largest input times its
// weights. The greedy tokens may then part at a near tie: the first
// position where they do must be one where GoMLX's logits of the two
// tokens lie within quantTolerance of each other.
const quantTolerance = 0.05

func backend(t testing.TB) compute.Backend {
	t.Helper()
	b, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// nativeCase is one zoo model shape.
type nativeCase struct {
	name string
	fn   generate.ModelFn
}

func zoo(vocab, dim, layers, heads, kv, hd, ffn int, opts func(m *transformer.Model) *transformer.Model) generate.ModelFn {
	return func(root *model.Scope) *transformer.Model {
		m := transformer.New(root.In("transformer")).
			WithVocabSize(vocab).WithEmbedDim(dim).WithNumLayers(layers).WithNumHeads(heads).WithNumKVHeads(kv).WithHeadDim(hd).
			WithFFNDim(ffn).WithRoPE(10000).WithDType(dtypes.Float32)
		return opts(m)
	}
}

func nativeCases() []nativeCase {
	return []nativeCase{
		{"rms-silu-gqa-transposed", zoo(97, 32, 2, 4, 2, 8, 48, func(m *transformer.Model) *transformer.Model {
			return m.WithNormalization("rms").WithFinalNormalization("rms").WithActivation(activation.TypeSilu).WithBias(false).WithTransposedWeights(true)
		})},
		{"layernorm-gelu-bias-odd-inout", zoo(101, 27, 2, 3, 3, 6, 45, func(m *transformer.Model) *transformer.Model {
			return m.WithNormalization("layer").WithFinalNormalization("layer").WithActivation(activation.TypeGelu).WithBias(true)
		})},
		{"swiglu-mqa-bias-odd-transposed", zoo(89, 36, 3, 6, 1, 6, 38, func(m *transformer.Model) *transformer.Model {
			return m.WithNormalization("rms").WithEmbedNormalization("rms").WithFinalNormalization("rms").
				WithActivation(activation.TypeSwiGLU).WithBias(true).WithTransposedWeights(true).WithNormEpsilon(1e-6)
		})},
		{"gemma-geglu-gqa-transposed", zoo(103, 48, 2, 4, 2, 12, 64, func(m *transformer.Model) *transformer.Model {
			return m.WithArchitecture(transformer.ArchitectureGemma).WithNormalization("rms").WithFinalNormalization("rms").
				WithActivation(activation.TypeGeluApprox).WithBias(false).WithTransposedWeights(true).WithNormEpsilon(1e-6)
		})},
	}
}

// randomStore is fn's model with GoMLX's initial weights, the vectors (norm
// scales, offsets, biases) then moved off their initial ones and zeros, so
// that a misplaced bias or scale shows.
func randomStore(t *testing.T, be compute.Backend, fn generate.ModelFn, seed int64) (*model.Store, *transformer.Model) {
	t.Helper()
	store, err := generate.InitStore(be, fn, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Finalize)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	for v := range store.IterVariables() {
		if v.Name() == model.RNGStateVariableName || v.Shape().Rank() != 1 {
			continue
		}
		val, err := v.Value()
		if err != nil {
			t.Fatal(err)
		}
		data := tensors.MustCopyFlatData[float32](val)
		for i := range data {
			data[i] += float32(0.2 * rng.NormFloat64())
		}
		if err := v.SetValue(tensors.FromFlatDataAndDimensions(data, v.Shape().Dimensions...)); err != nil {
			t.Fatal(err)
		}
	}
	return store, fn(model.NewStore().RootScope())
}

// gomlxLogits is GoMLX's forward pass of the whole model on tokens (one
// length), without a KV cache: the logits of every position.
func gomlxLogits(t *testing.T, be compute.Backend, store *model.Store, fn generate.ModelFn, tokens [][]int32) [][][]float32 {
	t.Helper()
	e, err := model.NewExec(be, store, func(scope *model.Scope, tok *graph.Node) *graph.Node {
		m := fn(scope)
		return m.Logits(tok, transformer.CallOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Finalize()
	out, err := e.Exec(tensors.FromValue(tokens))
	if err != nil {
		t.Fatal(err)
	}
	return out[0].Value().([][][]float32)
}

// native runs the decoder over the prompts (a prefill) and then greedy
// decoding steps: the generated tokens and the logits of each step (the
// prefill's last position first).
func native(t *testing.T, c decoder.Config, mw *decoder.ModelWeights, lw []decoder.LayerWeights, prompts [][]int32, steps int, pool *kernels.Pool) ([][]int32, [][][]float32) {
	t.Helper()
	d, err := decoder.New(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	batch, P := len(prompts), len(prompts[0])
	maxLen := P + steps
	kvDim := c.HeadDim * max(c.KVHeads, 1)
	if c.KVHeads == 0 {
		kvDim = c.HeadDim * c.Heads
	}
	n := c.Layers * batch * maxLen * kvDim
	cache, err := decoder.NewKVCache(c, batch, maxLen, make([]float32, n), make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	gen := make([][]int32, batch)
	var logits [][][]float32
	in := prompts
	pos := make([]int, batch)
	for s := range steps {
		if err := d.Begin(cache, in, pos, mw); err != nil {
			t.Fatal(err)
		}
		for l := range c.Layers {
			if err := d.Layer(l, &lw[l]); err != nil {
				t.Fatal(err)
			}
		}
		out := make([]float32, batch*c.Vocab)
		if err := d.Logits(mw, out); err != nil {
			t.Fatal(err)
		}
		step := make([][]float32, batch)
		next := make([][]int32, batch)
		for b := range batch {
			step[b] = out[b*c.Vocab : (b+1)*c.Vocab]
			best := 0
			for i, v := range step[b] {
				if v > step[b][best] {
					best = i
				}
			}
			gen[b] = append(gen[b], int32(best))
			next[b] = []int32{int32(best)}
			pos[b] += len(in[b])
		}
		logits = append(logits, step)
		in = next
		_ = s
	}
	return gen, logits
}

func testPrompts(batch, n, vocab, seed int) [][]int32 {
	out := make([][]int32, batch)
	for i := range out {
		for j := range n {
			out[i] = append(out[i], int32((seed*31+i*17+j*7+3)%vocab))
		}
	}
	return out
}

// TestNativeDecoderMatchesGoMLX holds the native decoder to GoMLX on the
// zoo transformer with the same random weights, for several shapes
// (kv-heads below heads, odd dimensions, biases, RMS and layer norms,
// plain, gated and fused-gated FFNs, the zoo's in-out and transposed
// layouts): a prefill of a 5-token prompt then 6 greedy decoding steps for
// 2 sequences; every step's logits within the tolerance of GoMLX's whole
// forward pass on the same tokens, and the greedy tokens equal to GoMLX's
// own generator with its KV cache (generate.InMemory).
func TestNativeDecoderMatchesGoMLX(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	be := backend(t)
	pool, err := kernels.NewPool(kernels.Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for i, tc := range nativeCases() {
		t.Run(tc.name, func(t *testing.T) {
			store, m := randomStore(t, be, tc.fn, int64(11+i))
			c, err := nativecheck.ZooConfig(m)
			if err != nil {
				t.Fatal(err)
			}
			mw, lw, err := nativecheck.StoreWeights(store, c, "/transformer")
			if err != nil {
				t.Fatal(err)
			}
			compareWithGoMLX(ctx, t, be, pool, store, tc.fn, c, &mw, lw, i, tolerance)
		})
	}
}

// TestNativeZooConfigRefuses: zoo features the decoder does not cover are
// refused with a message naming them.
func TestNativeZooConfigRefuses(t *testing.T) {
	m := transformer.New(model.NewStore().RootScope().In("transformer")).
		WithVocabSize(10).WithEmbedDim(8).WithNumLayers(1).WithNumHeads(2).WithHeadDim(4).
		WithArchitecture(transformer.ArchitectureGemma3).WithFinalLogitSoftCap(30)
	_, err := nativecheck.ZooConfig(m)
	if err == nil {
		t.Fatal("a Gemma3 model with a logit soft cap and no RoPE was accepted")
	}
	for _, want := range []string{"architecture Gemma3", "soft caps", "without RoPE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// compareWithGoMLX runs the native decoder on mw and lw (a prefill of a
// 5-token prompt, then greedy steps, 2 sequences) and holds every step's
// logits to GoMLX's forward pass of the model in store on the same tokens,
// and the greedy tokens to GoMLX's generator.
func compareWithGoMLX(ctx context.Context, t *testing.T, be compute.Backend, pool *kernels.Pool, store *model.Store, fn generate.ModelFn, c decoder.Config, mw *decoder.ModelWeights, lw []decoder.LayerWeights, i int, tol float64) {
	t.Helper()
	const P, S = 5, 6
	prompts := testPrompts(2, P, c.Vocab, i)
	gen, logits := native(t, c, mw, lw, prompts, S, pool)

	// GoMLX's forward on prompt + generated tokens (the last
	// generated token is not fed back, as in generation).
	full := make([][]int32, len(prompts))
	for b := range prompts {
		full[b] = append(append([]int32(nil), prompts[b]...), gen[b][:S-1]...)
	}
	want := gomlxLogits(t, be, store, fn, full)
	worst := 0.0
	for s := range S {
		for b := range prompts {
			w, g := want[b][P-1+s], logits[s][b]
			scale := 1.0
			for _, v := range w {
				scale = max(scale, math.Abs(float64(v)))
			}
			for k := range w {
				e := math.Abs(float64(g[k])-float64(w[k])) / scale
				worst = max(worst, e)
				if e > tol {
					t.Fatalf("step %d sequence %d logit %d: native %v, GoMLX %v (relative error %.3g > %g)", s, b, k, g[k], w[k], e, tol)
				}
			}
		}
	}
	t.Logf("%+v: worst relative logit error %.3g", c, worst)

	ref, err := generate.InMemory(ctx, be, fn, generate.StoreWeights(store), prompts, generate.Sampling{MaxNewTokens: S})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ref) != fmt.Sprint(gen) {
		if tol == tolerance {
			t.Fatalf("greedy tokens: native %v, GoMLX's generator %v", gen, ref)
		}
		// Quantized activations: the sequences may part where GoMLX's
		// logits of the two tokens nearly tie (same prefix until then,
		// so want holds GoMLX's logits of that position).
		for b := range gen {
			for s := range gen[b] {
				if gen[b][s] == ref[b][s] {
					continue
				}
				w := want[b][P-1+s]
				scale := 1.0
				for _, v := range w {
					scale = max(scale, math.Abs(float64(v)))
				}
				gap := math.Abs(float64(w[gen[b][s]]-w[ref[b][s]])) / scale
				if gap > tol {
					t.Fatalf("greedy tokens: native %v, GoMLX's generator %v: sequence %d parts at step %d, GoMLX's logits %v (token %d) and %v (token %d) %.3g apart, not a near tie", gen, ref, b, s, w[gen[b][s]], gen[b][s], w[ref[b][s]], ref[b][s], gap)
				}
				t.Logf("sequence %d parts at step %d at a near tie: GoMLX's logits %v (native's token %d), %v (its token %d)", b, s, w[gen[b][s]], gen[b][s], w[ref[b][s]], ref[b][s])
				break
			}
		}
	}
	distinct := map[int32]bool{}
	for _, g := range gen {
		for _, v := range g {
			distinct[v] = true
		}
	}
	if len(distinct) < 3 {
		t.Fatalf("degenerate generation %v: the comparison shows little", gen)
	}
}

// TestNativeQuantizedMatchesGoMLX: a model whose matrices and embedding
// the native decoder reads as Q8_0 or Q4_0 blocks gives GoMLX's logits
// (within quantTolerance) and greedy tokens (or ones that part at a near
// tie) on the same model with those weights dequantized (the zoo's output
// head, stored in-out, stays f32).
func TestNativeQuantizedMatchesGoMLX(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	be := backend(t)
	pool, err := kernels.NewPool(kernels.Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	fn := zoo(97, 64, 2, 4, 2, 16, 96, func(m *transformer.Model) *transformer.Model {
		return m.WithNormalization("rms").WithFinalNormalization("rms").WithActivation(activation.TypeSwiGLU).
			WithBias(true).WithTransposedWeights(true)
	})
	for i, typ := range []kernels.DType{kernels.Q8_0, kernels.Q4_0} {
		t.Run(typ.String(), func(t *testing.T) {
			store, m := randomStore(t, be, fn, int64(21+i))
			c, err := nativecheck.ZooConfig(m)
			if err != nil {
				t.Fatal(err)
			}
			mw, lw, err := nativecheck.StoreWeights(store, c, "/transformer")
			if err != nil {
				t.Fatal(err)
			}
			names, err := c.Names(decoder.ZooNames, "/transformer")
			if err != nil {
				t.Fatal(err)
			}
			quantized := 0
			for _, n := range names {
				if len(c.Shape(n.Role)) != 2 || n.Role == decoder.Head {
					continue
				}
				tt := &mw.Embedding
				if n.Layer >= 0 {
					tt = &lw[n.Layer][n.Role]
				}
				vals := make([]float32, len(tt.Data)/4)
				if err := kernels.Dequantize(vals, kernels.F32, tt.Data); err != nil {
					t.Fatal(err)
				}
				rb, err := kernels.RowBytes(typ, len(vals))
				if err != nil {
					t.Fatal(err)
				}
				q := make([]byte, rb)
				if typ == kernels.Q8_0 {
					_, err = kernels.QuantizeQ8_0(q, vals)
				} else {
					_, err = kernels.QuantizeQ4_0(q, vals)
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := kernels.Dequantize(vals, typ, q); err != nil {
					t.Fatal(err)
				}
				*tt = decoder.Tensor{Type: typ, Data: q}
				v := store.GetVariable(n.Name)
				if err := v.SetValue(tensors.FromFlatDataAndDimensions(vals, v.Shape().Dimensions...)); err != nil {
					t.Fatal(err)
				}
				quantized++
			}
			if want := 1 + c.Layers*6; quantized != want {
				t.Fatalf("%d matrices quantized, want %d", quantized, want)
			}
			compareWithGoMLX(ctx, t, be, pool, store, fn, c, &mw, lw, i, quantTolerance)
		})
	}
}
