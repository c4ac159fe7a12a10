package generate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend" // the pure-Go backend
	"github.com/gomlx/gomlx/ml/layers/activation"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"
	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/plan"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func backend(t testing.TB) compute.Backend {
	t.Helper()
	b, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// watchdog ends the test's context after d and fails the test with every
// goroutine's stack.
func watchdog(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				buf := make([]byte, 1<<20)
				t.Errorf("watchdog: the test ran past %s; goroutines:\n%s", d, buf[:runtime.Stack(buf, true)])
			}
		case <-done:
		}
	}()
	t.Cleanup(func() {
		close(done)
		<-finished
		cancel()
	})
	return ctx
}

// tiny is a small zoo transformer: RoPE, RMS norms, grouped-query
// attention, SiLU gated... standard architecture, no biases.
func tiny(dtype dtypes.DType, layers int) generate.ModelFn {
	return func(root *model.Scope) *transformer.Model {
		return transformer.New(root.In("transformer")).
			WithVocabSize(97).WithEmbedDim(32).WithNumLayers(layers).WithNumHeads(4).WithNumKVHeads(2).WithHeadDim(8).
			WithFFNDim(48).WithRoPE(10000).WithNormalization("rms").WithFinalNormalization("rms").
			WithActivation(activation.TypeSilu).WithBias(false).WithDType(dtype)
	}
}

// nvmeConfig puts every weight on NVMe (swap files in a temp dir, no
// max_in_cpu cache) with a pinned pool of pinned bytes.
func nvmeConfig(t testing.TB, pinned int64, bf16 bool) *config.Config {
	t.Helper()
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = config.Size(pinned)
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.BF16 = bf16
	return c
}

func prompts(batch, n, vocab int, seed int) [][]int32 {
	out := make([][]int32, batch)
	for i := range out {
		for j := range n {
			out[i] = append(out[i], int32((seed*31+i*17+j*7+3)%vocab))
		}
	}
	return out
}

// seededWeights are fn's variables initialised with seed in a fresh store.
func seededWeights(t testing.TB, be compute.Backend, fn generate.ModelFn, seed int64) generate.Weights {
	t.Helper()
	store, err := generate.InitStore(be, fn, seed)
	if err != nil {
		t.Fatal(err)
	}
	return generate.StoreWeights(store)
}

// openGenerator opens a generator of fn over w on cfg with o, quiet and
// without the bandwidth probe; it is closed when the test ends.
func openGenerator(ctx context.Context, t testing.TB, be compute.Backend, cfg *config.Config, fn generate.ModelFn, w generate.Weights, o generate.Options) *generate.Generator {
	t.Helper()
	o.Logger, o.NoBandwidthProbe = quiet, true
	g, err := generate.Open(ctx, be, cfg, fn, w, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// reference is GoMLX's in-memory generation of ps over w: the tokens zinf
// must equal. A degenerate one (fewer than 3 distinct tokens) would show
// nothing, so it fails the test.
func reference(ctx context.Context, t testing.TB, be compute.Backend, fn generate.ModelFn, w generate.Weights, ps [][]int32, s generate.Sampling) [][]int32 {
	t.Helper()
	want, err := generate.InMemory(ctx, be, fn, w, ps, s)
	if err != nil {
		t.Fatal(err)
	}
	if distinct(want) < 3 {
		t.Fatalf("degenerate generation %v: the comparison shows nothing", want)
	}
	return want
}

// TestGreedyEqualsInMemory: greedy generation through zinf (weights on
// NVMe, streamed layer by layer) gives GoMLX's in-memory generate.Generator
// tokens, token for token, in fp32 and bf16. Only the first pass waits
// for a layer fetched on demand: each pass prefetches the next one's
// first layers but the last, which prefetches nothing unused, and
// nothing stays resident when Generate returns.
func TestGreedyEqualsInMemory(t *testing.T) {
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := watchdog(t, 4*time.Minute)
			if dt == dtypes.BFloat16 {
				t.Setenv("GOMLX_FUSION", "false")
			}
			be := backend(t)
			fn := tiny(dt, 3)
			w := seededWeights(t, be, fn, 42)
			s := generate.Sampling{MaxNewTokens: 20}
			ps := prompts(3, 5, 97, 1)
			want, err := generate.InMemory(ctx, be, fn, w, ps, s)
			if err != nil {
				t.Fatal(err)
			}
			g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, dt == dtypes.BFloat16), fn, w, generate.Options{})
			rt := g.Runtime()
			if d := rt.Placement().PrefetchDepth; d < 1 {
				t.Fatalf("prefetch depth %d: the test shows nothing of prefetching across passes", d)
			}
			var firstMisses int64 = -1
			res, err := g.Generate(ctx, ps, s, func(si generate.StepInfo) {
				if si.Step == 0 {
					firstMisses = rt.Metrics().Schedule.DemandMisses
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
				t.Fatalf("through zinf:\n%v\nin memory:\n%v", res.Tokens, want)
			}
			// Each pass prefetched the next one's first layers: the
			// passes after the first start on a hit.
			if m := rt.Metrics().Schedule.DemandMisses; firstMisses < 1 || m != firstMisses {
				t.Fatalf("%d demand misses in the first pass, %d after %d passes: the later passes missed", firstMisses, m, res.Steps)
			}
			// The last pass knew it was the last: nothing prefetched went
			// unused.
			if st := rt.Metrics().Schedule; st.Prefetches != st.Hits {
				t.Fatalf("%d layers prefetched, %d of them used", st.Prefetches, st.Hits)
			}
			if r := rt.Metrics().Params.ResidentBytes; r != 0 {
				t.Fatalf("after Generate %d bytes of weights stay resident (the last pass's prefetches)", r)
			}
			if distinct(res.Tokens) < 3 {
				t.Fatalf("degenerate generation %v: the comparison shows nothing", res.Tokens)
			}
			if res.BytesRead == 0 {
				t.Fatal("no bytes read from NVMe: the weights were not streamed")
			}
			if res.Steps != s.MaxNewTokens {
				t.Fatalf("%d passes for %d tokens", res.Steps, s.MaxNewTokens)
			}
		})
	}
}

func distinct(ts [][]int32) int {
	m := map[int32]bool{}
	for _, s := range ts {
		for _, t := range s {
			m[t] = true
		}
	}
	return len(m)
}

// TestSamplingEqualsInMemory: temperature, top-k and top-p sampling from a
// fixed seed draw GoMLX's in-memory generator's tokens; another seed draws
// others.
func TestSamplingEqualsInMemory(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	w := seededWeights(t, be, fn, 7)
	g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{})
	ps := prompts(2, 4, 97, 3)
	for _, s := range []generate.Sampling{
		{Strategy: sample.StrategyTemperature, Temperature: 1.5, Seed: 11, MaxNewTokens: 12},
		{Strategy: sample.StrategyTopK, TopK: 5, Temperature: 2, Seed: 12, MaxNewTokens: 12},
		{Strategy: sample.StrategyTopP, TopP: 0.8, Temperature: 2, Seed: 13, MaxNewTokens: 12},
	} {
		t.Run(s.Strategy.String(), func(t *testing.T) {
			want, err := generate.InMemory(ctx, be, fn, w, ps, s)
			if err != nil {
				t.Fatal(err)
			}
			res, err := g.Generate(ctx, ps, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
				t.Fatalf("through zinf:\n%v\nin memory:\n%v", res.Tokens, want)
			}
			s2 := s
			s2.Seed += 1000
			other, err := g.Generate(ctx, ps, s2, nil)
			if err != nil {
				t.Fatal(err)
			}
			if slices.EqualFunc(other.Tokens, want, slices.Equal) {
				t.Fatalf("seed %d and %d drew the same tokens %v: the seed is not used", s.Seed, s2.Seed, want)
			}
		})
	}
}

// TestStopTokens: a sequence ends at its first EOS or stop token (kept
// as its last), the others run on; generation ends when all have ended.
func TestStopTokens(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	w := seededWeights(t, be, fn, 42)
	g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{})
	ps := prompts(2, 4, 97, 5)
	full, err := g.Generate(ctx, ps, generate.Sampling{MaxNewTokens: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The third token of sequence 0 as EOS, the fifth of sequence 1 as a stop token.
	eos, stop := full.Tokens[0][2], full.Tokens[1][4]
	cut := func(seq []int32) []int32 {
		for j, t := range seq {
			if t == eos || t == stop {
				return seq[:j+1]
			}
		}
		return seq
	}
	res, err := g.Generate(ctx, ps, generate.Sampling{MaxNewTokens: 16, EOS: []int{int(eos)}, Stop: []int{int(stop)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		if want := cut(full.Tokens[i]); !slices.Equal(res.Tokens[i], want) {
			t.Fatalf("sequence %d: %v, want %v (the full run %v, eos %d stop %d)", i, res.Tokens[i], want, full.Tokens[i], eos, stop)
		}
	}
	longest := max(len(res.Tokens[0]), len(res.Tokens[1]))
	if res.Steps != longest {
		t.Fatalf("%d passes; the longest sequence ended after %d tokens", res.Steps, longest)
	}
	ref, err := generate.InMemory(ctx, be, fn, w, ps, generate.Sampling{MaxNewTokens: 16, EOS: []int{int(eos)}, Stop: []int{int(stop)}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, ref, slices.Equal) {
		t.Fatalf("through zinf %v, in memory %v", res.Tokens, ref)
	}
}

// TestPromptsOfDifferentLengths: a batch of prompts of several lengths
// generates, for each, the tokens the prompt generates alone.
func TestPromptsOfDifferentLengths(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	w := seededWeights(t, be, fn, 3)
	g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{})
	ps := [][]int32{{5, 9, 11}, {1, 2, 3, 4, 5, 6, 7}, {40, 41, 42, 43, 44}}
	s := generate.Sampling{MaxNewTokens: 10}
	res, err := g.Generate(ctx, ps, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range ps {
		want, err := generate.InMemory(ctx, be, fn, w, [][]int32{p}, s)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Tokens[i], want[0]) {
			t.Fatalf("prompt %d in the batch: %v; alone in memory: %v", i, res.Tokens[i], want[0])
		}
	}
	if want := 7 + 10 - 3; res.Steps != want {
		t.Fatalf("%d passes, want %d (prefill of 3, then one per position to 7+10)", res.Steps, want)
	}
}

// TestBadInput: bad sampling options and prompts are refused, naming the
// value and what is allowed.
func TestBadInput(t *testing.T) {
	ctx := watchdog(t, 2*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 1)
	store, err := generate.InitStore(be, fn, 3)
	if err != nil {
		t.Fatal(err)
	}
	g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, false), fn, generate.StoreWeights(store), generate.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, c := range []struct {
		ps   [][]int32
		s    generate.Sampling
		want string
	}{
		{[][]int32{{1}}, generate.Sampling{}, "max new tokens 0 (allowed: > 0)"},
		{[][]int32{{1}}, generate.Sampling{MaxNewTokens: 2, Strategy: sample.StrategyBeamSearch}, "(allowed: greedy, temperature, top_k, top_p)"},
		{[][]int32{{1}}, generate.Sampling{MaxNewTokens: 2, Strategy: sample.StrategyTopP, TopP: 1.5}, "top-p 1.5"},
		{[][]int32{{1}}, generate.Sampling{MaxNewTokens: 2, EOS: []int{97}}, "EOS/stop token 97 (allowed: 0..96)"},
		{[][]int32{{1, 200}}, generate.Sampling{MaxNewTokens: 2}, "prompt 0: token 200 (allowed: 0..96)"},
		{[][]int32{{}}, generate.Sampling{MaxNewTokens: 2}, "prompt 0 is empty"},
		{nil, generate.Sampling{MaxNewTokens: 2}, "no prompts"},
	} {
		_, err := g.Generate(ctx, c.ps, c.s, nil)
		if err == nil || !contains(err.Error(), c.want) {
			t.Errorf("%v %+v: error %v, want one saying %q", c.ps, c.s, err, c.want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

var _ = fmt.Sprint

// TestKVCacheTiers: the KV cache in memory, in pinned memory and on NVMe
// (read back for its layer ahead of use) gives the same tokens as GoMLX's
// in-memory generator; a budget too small is refused with the bytes
// needed.
func TestKVCacheTiers(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 5) // more layers than the NVMe tier's 3 staging buffers
	w := seededWeights(t, be, fn, 5)
	ps := prompts(2, 6, 97, 9)
	s := generate.Sampling{MaxNewTokens: 40} // past the first bucket of 32 positions
	want, err := generate.InMemory(ctx, be, fn, w, ps, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []config.KVCacheDevice{config.KVCacheMemory, config.KVCacheCPU, config.KVCacheNVMe} {
		t.Run(string(dev), func(t *testing.T) {
			c := nvmeConfig(t, 4<<20, false)
			c.Zinf.KVCache = config.KVCache{Device: dev}
			// The GoMLX path's cache, in its layout, on each tier.
			g, err := generate.Open(ctx, be, c, fn, w, generate.Options{Logger: quiet, NoBandwidthProbe: true, Decoder: generate.DecoderGoMLX})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			res, err := g.Generate(ctx, ps, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
				t.Fatalf("KV cache on %s:\n%v\nin memory:\n%v", dev, res.Tokens, want)
			}
			if res.KVCache.Device != dev {
				t.Fatalf("KV cache planned on %s, want %s", res.KVCache.Device, dev)
			}
			if dev == config.KVCacheNVMe && (res.KVStats.BytesRead == 0 || res.KVStats.Prefetched == 0) {
				t.Fatalf("NVMe KV cache never read back ahead of use: %+v", res.KVStats)
			}
			// A budget of one byte less than the need is refused, naming it.
			c.Zinf.KVCache.Bytes = config.Size(res.KVCache.CacheBytes)
			if dev != config.KVCacheMemory {
				c.Zinf.KVCache.Bytes = config.Size(res.KVCache.PinnedBytes)
			}
			need := int64(c.Zinf.KVCache.Bytes)
			c.Zinf.KVCache.Bytes--
			_, err = g.Generate(ctx, ps, s, nil)
			var e *plan.KVCacheTooSmallError
			if !errors.As(err, &e) || e.Need != need || !strings.Contains(err.Error(), fmt.Sprintf("(%d bytes)", need)) {
				t.Fatalf("budget %d below the need %d: %v", need-1, need, err)
			}
		})
	}
}

// TestPlanBatch: the batch is the largest the KV cache budget allows,
// with a prediction from measured compute and the runtime's bandwidth.
func TestPlanBatch(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	store, err := generate.InitStore(be, fn, 5)
	if err != nil {
		t.Fatal(err)
	}
	c := nvmeConfig(t, 4<<20, false)
	g, err := generate.Open(ctx, be, c, fn, generate.StoreWeights(store), generate.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	per := g.KVBytesPerSequence(6 + 10)
	if want := int64(2 * 2 * 32 * 8 * 4); per != want { // keys and values, 2 kv heads, 32 positions, head dim 8, fp32
		t.Fatalf("KV bytes per sequence %d, want %d", per, want)
	}
	c.Zinf.KVCache = config.KVCache{Device: config.KVCacheMemory, Bytes: config.Size(2 * 5 * per)} // 2 layers, 5 sequences
	p, err := g.PlanBatch(ctx, 6, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if p.Batch != 5 || p.Limit != "zinf.kv_cache.bytes" || p.Compute <= 0 || p.WeightIO <= 0 || p.TokensPerSecond <= 0 {
		t.Fatalf("plan %+v: want a batch of 5 set by the budget, with a prediction", p)
	}
	if p.WeightIO != time.Duration(float64(g.WeightBytes())/p.ReadBps*1e9) {
		t.Fatalf("weight I/O %v for %d bytes at %.0f B/s", p.WeightIO, g.WeightBytes(), p.ReadBps)
	}
}

// TestRootScopeModel: a model at the Store's root scope (as make demo-llm
// builds it: layer norms, biases, GELU, a final RMS norm, MHA) generates
// what it does in memory.
func TestRootScopeModel(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	fn := func(root *model.Scope) *transformer.Model {
		return transformer.New(root).WithVocabSize(97).WithEmbedDim(32).WithNumLayers(2).WithNumHeads(4).WithHeadDim(8).
			WithFFNDim(128).WithRoPE(10000).WithFinalNormalization("rms")
	}
	w := seededWeights(t, be, fn, 17)
	g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{})
	if v := g.Vars()[0]; v.Name != "/token_embed/embeddings" || v.Layer != 0 {
		t.Fatalf("first variable %+v", v)
	}
	ps, s := prompts(2, 5, 97, 2), generate.Sampling{MaxNewTokens: 12}
	res, err := g.Generate(ctx, ps, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate.InMemory(ctx, be, fn, w, ps, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, want, slices.Equal) || distinct(want) < 3 {
		t.Fatalf("through zinf %v, in memory %v", res.Tokens, want)
	}
}

// TestCancel: a cancelled context ends generation with its error, and the
// generator generates again afterwards.
func TestCancel(t *testing.T) {
	ctx := watchdog(t, 2*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	store, err := generate.InitStore(be, fn, 5)
	if err != nil {
		t.Fatal(err)
	}
	g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, false), fn, generate.StoreWeights(store), generate.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	cctx, cancel := context.WithCancel(ctx)
	ps := prompts(2, 4, 97, 1)
	_, err = g.Generate(cctx, ps, generate.Sampling{MaxNewTokens: 50}, func(s generate.StepInfo) {
		if s.Step == 3 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled at step 3: %v", err)
	}
	res, err := g.Generate(ctx, ps, generate.Sampling{MaxNewTokens: 5}, nil)
	if err != nil || res.Generated() != 10 {
		t.Fatalf("after a cancel: %v, %+v", err, res)
	}
}

// TestEmbeddingRows: a large token embedding, moved in pieces, is read by
// the rows of the batch's tokens only, and the tokens are the in-memory
// generator's.
func TestEmbeddingRows(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	const vocab, dim = 20000, 32
	fn := func(root *model.Scope) *transformer.Model {
		return transformer.New(root.In("transformer")).WithVocabSize(vocab).WithEmbedDim(dim).WithNumLayers(2).WithNumHeads(4).
			WithHeadDim(8).WithFFNDim(64).WithRoPE(10000).WithNormalization("rms").WithFinalNormalization("rms").WithBias(false)
	}
	w := seededWeights(t, be, fn, 4)
	g := openGenerator(ctx, t, be, nvmeConfig(t, 8<<20, false), fn, w, generate.Options{PieceBytes: 256 << 10})
	if !g.Runtime().Streamed("/transformer/token_embed/embeddings") {
		t.Fatal("the 2.4 MiB embedding is not moved in pieces of 256 KiB")
	}
	ps, s := prompts(2, 5, vocab, 3), generate.Sampling{MaxNewTokens: 8}
	res, err := g.Generate(ctx, ps, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate.InMemory(ctx, be, fn, w, ps, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
		t.Fatalf("through zinf %v, in memory %v", res.Tokens, want)
	}
	embed, all := int64(vocab*dim*4), int64(0)
	for _, v := range g.Vars() {
		all += int64(v.Numel() * 4)
	}
	if perPass := res.BytesRead / int64(res.Steps); perPass > all-embed/2 {
		t.Fatalf("%d bytes read per pass of %d bytes of weights: the %d-byte embedding was read whole", perPass, all, embed)
	}
	if g.WeightBytes() != all-embed {
		t.Fatalf("WeightBytes %d, want %d: the weights less the embedding read by rows", g.WeightBytes(), all-embed)
	}
}

// TestMaxInCPUCacheSpread: with offload_param.max_in_cpu in a pool that
// holds it, the weights the runtime keeps in pinned memory (CachedBytes)
// are spread over the transformer layers, within the budget, read by no
// decoding step once the cache holds them (a step reads exactly the
// streamed weights, WeightBytes, and what it reads without the cache less
// the cached bytes), and the tokens are GoMLX's in-memory ones.
func TestMaxInCPUCacheSpread(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	const layers = 6
	fn := tiny(dtypes.Float32, layers)
	w := seededWeights(t, be, fn, 42)
	s := generate.Sampling{MaxNewTokens: 10}
	ps := prompts(3, 5, 97, 1)
	want := reference(ctx, t, be, fn, w, ps, s)

	// gen generates and returns the NVMe bytes each decoding step read.
	gen := func(g *generate.Generator) []int64 {
		t.Helper()
		rt := g.Runtime()
		var steps []int64
		last := rt.Metrics().BytesRead
		res, err := g.Generate(ctx, ps, s, func(si generate.StepInfo) {
			now := rt.Metrics().BytesRead
			if si.Step > 0 {
				steps = append(steps, now-last)
			}
			last = now
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
			t.Fatalf("through zinf:\n%v\nin memory:\n%v", res.Tokens, want)
		}
		return steps
	}
	plain := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{})
	var total int64
	for _, v := range plain.Vars() {
		total += int64(v.Numel()) * 4
	}
	if n, b := plain.CachedBytes(); n != 0 || b != 0 || plain.WeightBytes() != total {
		t.Fatalf("no max_in_cpu: %d tensors (%d bytes) cached, %d of %d bytes streamed", n, b, plain.WeightBytes(), total)
	}
	stepsPlain := gen(plain)

	cfg := nvmeConfig(t, 4<<20+total, false)
	budget := total / 2
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = budget / 4 // elements
	g := openGenerator(ctx, t, be, cfg, fn, w, generate.Options{})
	n, cached := g.CachedBytes()
	if n == 0 || cached > budget || cached < budget/2 {
		t.Fatalf("%d tensors, %d bytes cached of a %d-byte max_in_cpu (weights %d)", n, cached, budget, total)
	}
	if g.WeightBytes()+cached != total {
		t.Fatalf("streamed %d + cached %d != the weights' %d bytes", g.WeightBytes(), cached, total)
	}
	perLayer := map[int]int{}
	for _, v := range g.Vars() {
		if g.Runtime().CacheKeeps(v.Name) {
			perLayer[v.Layer]++
		}
	}
	for l := 1; l <= layers; l++ {
		if perLayer[l] == 0 {
			t.Fatalf("no weight of transformer layer %d cached (per layer: %v): the cache is not spread", l, perLayer)
		}
	}
	steps := gen(g)
	// The cache fills as the first passes release their weights; after
	// it, a decoding step reads the streamed weights only. Each pass
	// prefetches the next one's first layer, so a step's count is off by
	// what the two prefetches differ: sums over the steps after the first
	// two are within two layers (and the embedding's rows) of exact.
	var slack int64
	layerBytes := map[int]int64{}
	for _, v := range g.Vars() {
		layerBytes[v.Layer] += int64(v.Numel()) * 4
		slack = max(slack, 2*layerBytes[v.Layer])
	}
	sum := func(xs []int64) (n int64) {
		for _, x := range xs[2:] {
			n += x
		}
		return n
	}
	k := int64(len(steps) - 2)
	if got, want := sum(steps), k*g.WeightBytes(); got < want-slack || got > want+slack {
		t.Fatalf("decoding steps 3.. read %d bytes, %d steps of the %d streamed = %d (slack %d); steps %v", got, k, g.WeightBytes(), want, slack, steps)
	}
	if got, want := sum(stepsPlain)-sum(steps), k*cached; got < want-slack || got > want+slack {
		t.Fatalf("decoding steps 3.. read %d bytes fewer than without the cache: want %d steps x %d cached = %d (slack %d); steps %v, without the cache %v",
			got, k, cached, want, slack, steps, stepsPlain)
	}
}
