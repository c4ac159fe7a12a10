package nativecheck_test

import (
	"context"
	"os"
	"runtime"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/ml/layers/activation"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/contrib/gomlx/nativecheck"
	"github.com/zinfio/zinf/decoder/kernels"
)

// TestNativeThroughput measures decoding tokens/s (all sequences, batch 1 and 4) of
// the native decoder and of GoMLX's generator (its KV cache, everything in memory) on one
// zoo model, interleaved in one process, and logs them: a measurement, not
// a check (no speed is asserted). It runs only with ZINF_NATIVE_BENCH=1.
// GoMLX's figure is the difference of two generations (112 and 16 new
// tokens) over 96 tokens, so its graph compilation cancels out.
func TestNativeThroughput(t *testing.T) {
	if os.Getenv("ZINF_NATIVE_BENCH") != "1" {
		t.Skip("set ZINF_NATIVE_BENCH=1 to measure")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	be, err := compute.NewWithConfig(os.Getenv("ZINF_NATIVE_BENCH_BACKEND")) // "" is GoMLX's default
	if err != nil {
		t.Fatal(err)
	}
	fn := func(root *model.Scope) *transformer.Model {
		return transformer.New(root.In("transformer")).
			WithVocabSize(1024).WithEmbedDim(512).WithNumLayers(8).WithNumHeads(8).WithNumKVHeads(8).WithHeadDim(64).
			WithFFNDim(2048).WithRoPE(10000).WithNormalization("rms").WithFinalNormalization("rms").
			WithActivation(activation.TypeSilu).WithBias(false).WithTransposedWeights(true).WithDType(dtypes.Float32)
	}
	store, m := randomStore(t, be, fn, 1)
	c, err := nativecheck.ZooConfig(m)
	if err != nil {
		t.Fatal(err)
	}
	mw, lw, err := nativecheck.StoreWeights(store, c, "/transformer")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kernels.NewPool(kernels.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, batch := range []int{1, 4} {
		prompts := testPrompts(batch, 8, c.Vocab, 0)
		const short, long = 16, 112
		var nat, gom []float64
		for round := range 3 {
			start := time.Now()
			native(t, c, &mw, lw, prompts, long, pool)
			nat = append(nat, float64(batch*long)/time.Since(start).Seconds())

			var d [2]time.Duration
			for i, n := range []int{short, long} {
				start := time.Now()
				if _, err := generate.InMemory(ctx, be, fn, generate.StoreWeights(store), prompts, generate.Sampling{MaxNewTokens: n}); err != nil {
					t.Fatal(err)
				}
				d[i] = time.Since(start)
			}
			gom = append(gom, float64(batch*(long-short))/(d[1]-d[0]).Seconds())
			t.Logf("batch %d round %d: native %.1f tokens/s (prefill of 8, %d steps), GoMLX %.1f tokens/s (%v for %d tokens, %v for %d)",
				batch, round, nat[round], long, gom[round], d[1], long, d[0], short)
		}
		med := func(v []float64) (float64, float64, float64) {
			s := slices.Clone(v)
			sort.Float64s(s)
			return s[len(s)/2], s[0], s[len(s)-1]
		}
		a, amin, amax := med(nat)
		b, bmin, bmax := med(gom)
		t.Logf("model: %d layers, dim %d, ffn %d, vocab %d, fp32, batch %d; GOMAXPROCS %d, kernel %s, backend %q",
			c.Layers, c.Dim, c.FFNDim, c.Vocab, batch, runtime.GOMAXPROCS(0), pool.Kernel(), be.Name())
		t.Logf("batch %d: native %.1f tokens/s (%.1f..%.1f); GoMLX generator %.1f (%.1f..%.1f); ratio %.1fx", batch, a, amin, amax, b, bmin, bmax, a/b)
	}
}
