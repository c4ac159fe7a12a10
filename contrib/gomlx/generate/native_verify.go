package generate

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/contrib/gomlx/nativecheck"
	"github.com/zinfio/zinf/decoder"
)

// NativeLogitTolerance bounds the native decoder's float32 logits against
// GoMLX's forward pass on the same tokens and weights: |native - GoMLX|
// ≤ NativeLogitTolerance × max(1, the largest |GoMLX logit| of the
// position). The two sum in different orders (GoMLX's blocked matrix
// products, the decoder's fixed kernel order), so their float32 roundings
// differ; on the zoo models of the tests the gap stays below 2e-5 of the
// scale, and this leaves room for deeper models.
const NativeLogitTolerance = 1e-4

// LogitCheck is the outcome of CheckNativeLogits.
type LogitCheck struct {
	// Positions is the number of positions compared (every sequence's
	// last prompt position and each of its generated tokens but the
	// last).
	Positions int
	// MaxError is the largest |native - GoMLX| / max(1, max |GoMLX|) of
	// any logit, and Seq and Step say where.
	MaxError           float64
	MaxErrSeq, MaxStep int
	// Flips are, per sequence that has one, the first position where the
	// generated token is not GoMLX's greedy choice on the same tokens.
	Flips []Flip
}

// Within reports whether every logit is within NativeLogitTolerance.
func (c *LogitCheck) Within() bool { return c.MaxError <= NativeLogitTolerance }

// Flip is a position where the generated token (zinf's) and GoMLX's
// greedy choice part: both tokens' logits on both paths. A near tie is a
// flip whose two GoMLX logits differ by no more than the tolerance allows
// the native ones to stray (NearTie).
type Flip struct {
	Seq, Step           int   // the sequence and the generated token's index
	Token, GoMLXToken   int32 // zinf's token, GoMLX's greedy choice
	Native, GoMLX       [2]float32
	NearTie             bool
	Scale               float64 // max(1, max |GoMLX logit|) at the position
	NativeTokenIsArgmax bool    // the native logits' greedy choice is Token
}

func (f Flip) String() string {
	tie := "not a near tie"
	if f.NearTie {
		tie = "a near tie within the tolerance"
	}
	return fmt.Sprintf("sequence %d, token %d: zinf chose %d (native logit %.7g, GoMLX %.7g), GoMLX %d (native logit %.7g, GoMLX %.7g): %s",
		f.Seq, f.Step, f.Token, f.Native[0], f.GoMLX[0], f.GoMLXToken, f.Native[1], f.GoMLX[1], tie)
}

// CheckNativeLogits holds the native decoder to GoMLX on a generation:
// for each sequence, the prompt followed by the tokens generated (by
// either path), it computes the logits of every position that chose a
// generated token twice, with the weights w in memory: by GoMLX's forward
// pass of the whole model (no KV cache), and by the native decoder (a
// prefill of the prompt, then a decoding step per generated token, its
// KV cache in memory), and compares them element by element. Where a
// generated token is not GoMLX's greedy choice it reports the first such
// position of the sequence with both tokens' logits on both paths.
func CheckNativeLogits(ctx context.Context, backend compute.Backend, fn ModelFn, w Weights, prompts, generated [][]int32) (*LogitCheck, error) {
	if len(prompts) != len(generated) {
		return nil, fmt.Errorf("zinf generate: %d prompts and %d generated sequences", len(prompts), len(generated))
	}
	store := model.NewStore()
	defer store.Finalize()
	var m *transformer.Model
	if err := catch(func() error { m = fn(store.RootScope()); return nil }); err != nil {
		return nil, fmt.Errorf("zinf generate: ModelFn: %w", err)
	}
	if err := checkModel(m); err != nil {
		return nil, err
	}
	vars, err := discover(backend, store, m)
	if err != nil {
		return nil, err
	}
	if err := loadWeights(ctx, w, store, vars); err != nil {
		return nil, err
	}
	cfg, err := nativecheck.ZooConfig(m)
	if err != nil {
		return nil, fmt.Errorf("zinf generate: the native decoder does not cover the model: %w", err)
	}
	mw, lw, err := nativecheck.StoreWeights(store, cfg, strings.TrimSuffix(m.Scope.Scope(), "/"))
	if err != nil {
		return nil, err
	}
	dec, err := decoder.New(cfg, nil)
	if err != nil {
		return nil, err
	}
	e, err := model.NewExec(backend, store, func(scope *model.Scope, tok *graph.Node) *graph.Node {
		m.Scope = m.Scope.ResetVisited()
		return m.Logits(tok, transformer.CallOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("zinf generate: building GoMLX's forward pass: %w", err)
	}
	defer e.Finalize()
	res := &LogitCheck{}
	for s := range prompts {
		P, G := len(prompts[s]), len(generated[s])
		if P == 0 || G == 0 {
			continue
		}
		seq := append(append([]int32(nil), prompts[s]...), generated[s][:G-1]...)
		ref, err := gomlxLogits(e, seq)
		if err != nil {
			return nil, err
		}
		nat, err := nativeLogits(ctx, dec, cfg, &mw, lw, prompts[s], generated[s][:G-1])
		if err != nil {
			return nil, err
		}
		flipped := false
		for k := range G {
			g, n := ref[P-1+k], nat[k]
			scale := 1.0
			for _, v := range g {
				scale = max(scale, math.Abs(float64(v)))
			}
			for i := range g {
				if e := math.Abs(float64(n[i])-float64(g[i])) / scale; e > res.MaxError || math.IsNaN(e) {
					res.MaxError, res.MaxErrSeq, res.MaxStep = e, s, k
				}
			}
			res.Positions++
			tok, best := generated[s][k], argmax(g)
			if flipped || int(tok) < 0 || int(tok) >= len(g) || tok == best {
				continue
			}
			flipped = true
			f := Flip{Seq: s, Step: k, Token: tok, GoMLXToken: best, Scale: scale,
				Native: [2]float32{n[tok], n[best]}, GoMLX: [2]float32{g[tok], g[best]}, NativeTokenIsArgmax: argmax(n) == tok}
			f.NearTie = float64(g[best]-g[tok]) <= 2*NativeLogitTolerance*scale
			res.Flips = append(res.Flips, f)
		}
	}
	return res, nil
}

// gomlxLogits runs GoMLX's forward pass on one sequence: the logits of
// every position.
func gomlxLogits(e *model.Exec, seq []int32) (out [][]float32, err error) {
	err = catch(func() error {
		r, err := e.Exec(tensors.FromValue([][]int32{seq}))
		if err != nil {
			return err
		}
		defer finalize(r[0])
		v, ok := r[0].Value().([][][]float32)
		if !ok || len(v) != 1 || len(v[0]) != len(seq) {
			return fmt.Errorf("GoMLX's logits have shape %s, want [1, %d, vocab]", r[0].Shape(), len(seq))
		}
		out = v[0]
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("zinf generate: GoMLX's forward pass: %w", err)
	}
	return out, nil
}

// nativeLogits runs the native decoder over a prompt (a prefill) and then
// a decoding step per token of next: the logits of the prompt's last
// position and of each step.
func nativeLogits(ctx context.Context, d *decoder.Decoder, c decoder.Config, mw *decoder.ModelWeights, lw []decoder.LayerWeights, prompt, next []int32) ([][]float32, error) {
	kvh := c.KVHeads
	if kvh == 0 {
		kvh = c.Heads
	}
	maxLen := len(prompt) + len(next)
	n := c.Layers * maxLen * kvh * c.HeadDim
	cache, err := decoder.NewKVCache(c, 1, maxLen, make([]float32, n), make([]float32, n))
	if err != nil {
		return nil, err
	}
	var out [][]float32
	in, pos := prompt, 0
	for k := 0; k <= len(next); k++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := d.Begin(cache, [][]int32{in}, []int{pos}, mw); err != nil {
			return nil, err
		}
		for l := range c.Layers {
			if err := d.Layer(l, &lw[l]); err != nil {
				return nil, err
			}
		}
		logits := make([]float32, c.Vocab)
		if err := d.Logits(mw, logits); err != nil {
			return nil, err
		}
		out = append(out, logits)
		pos += len(in)
		if k < len(next) {
			in = next[k : k+1]
		}
	}
	return out, nil
}

// argmax is the greedy choice: the first largest logit.
func argmax(l []float32) int32 {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return int32(best)
}
