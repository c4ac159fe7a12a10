package generate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/zinfio/zinf/plan"
)

// WeightBytes is what one decoding pass reads of the streamed weights:
// every weight in the runtime's parameter dtype, but of a token embedding
// read by rows (a large one moves in pieces) only the pieces of the rows
// it needs, counted here as none, and none of the weights the runtime
// holds in pinned memory (CachedBytes).
func (g *Generator) WeightBytes() int64 {
	if ms, ok := g.src.(*mappedSource); ok {
		return ms.weightBytes(g.vars, g.rowsOf)
	}
	var n int64
	for i, v := range g.vars {
		if g.rowsOf != nil && &g.vars[i] == g.rowsOf && g.rt.Streamed(v.Name) || g.cached(v) {
			continue
		}
		n += g.paramBytes(v)
	}
	return n
}

// CachedBytes is the weights the runtime keeps in pinned host memory in
// front of NVMe (offload_param.max_in_cpu, as far as the pinned budget
// holds it), and how many: read from NVMe or their files once, when the
// Generator opens, and by no decoding pass. A mapped model has none.
func (g *Generator) CachedBytes() (tensors int, bytes int64) {
	if g.rt == nil {
		return 0, 0
	}
	for _, v := range g.vars {
		if g.cached(v) {
			tensors++
			bytes += g.paramBytes(v)
		}
	}
	return tensors, bytes
}

// cached reports whether the runtime holds v in pinned memory for good
// (its max_in_cpu cache: zinf.Runtime.CacheKeeps).
func (g *Generator) cached(v Var) bool {
	return g.rt != nil && g.rt.CacheKeeps(v.Name)
}

func (g *Generator) paramBytes(v Var) int64 {
	return int64(v.Numel()) * int64(plan.ParamDType(g.rt.Config).Size())
}

// KVBytesPerSequence is one layer's KV cache entry for one sequence that
// reaches total positions (keys and values, bucketed as GoMLX's kvcache
// does).
func (g *Generator) KVBytesPerSequence(total int) int64 {
	var most int64
	for l := range g.m.NumLayers {
		most = max(most, 2*g.kvShape(1, g.kvLen(l, total)).ByteSize())
	}
	return most
}

// PlanBatch picks the batch for sequences of promptLen + maxNew tokens
// (at most maxBatch of them) with plan.ForGeneration: the largest the KV
// cache budget allows, its step and tokens per second predicted from the
// runtime's NVMe bandwidth and compute measured here, on decoding steps
// at the sequences' mean length (batch 1 and batch 4, or maxBatch if
// smaller; over a KV cache of that length, not prefilled: a step's
// arithmetic does not depend on the cache's values) whose compute (their
// time less their waits for weights) gives a fixed and a per-sequence
// part. A prompt whose prefill needs more memory than
// Options.PrefillBytes (PrefillBytes) is refused here, with the figures,
// and the batch is no larger than the prefill's memory allows.
func (g *Generator) PlanBatch(ctx context.Context, promptLen, maxNew, maxBatch int) (plan.Generation, error) {
	if g.rt == nil {
		return plan.Generation{}, errors.New("zinf generate: plan: a mapped model (OpenMapped) has no zinf runtime to plan with")
	}
	if promptLen <= 0 || maxNew <= 0 || maxBatch <= 0 {
		return plan.Generation{}, fmt.Errorf("zinf generate: plan: prompt length %d, new tokens %d, batch %d (allowed: > 0)", promptLen, maxNew, maxBatch)
	}
	if need := g.PrefillBytes(1, promptLen); need > g.prefillBytes {
		return plan.Generation{}, g.prefillError(1, promptLen, need)
	}
	// The largest batch whose prefill fits (PrefillBytes grows with it).
	fit := sort.Search(maxBatch, func(b int) bool { return g.PrefillBytes(b+1, promptLen) > g.prefillBytes })
	measure := func(b int) (time.Duration, error) {
		// At the sequences' mean length: attention and the KV cache grow
		// with it.
		steps, err := g.decodeSteps(ctx, b, min(promptLen+maxNew/2, 4096), 8)
		if err != nil {
			return 0, err
		}
		slices.Sort(steps)
		return steps[len(steps)/2], nil
	}
	c1, err := measure(1)
	if err != nil {
		return plan.Generation{}, err
	}
	k := min(4, fit)
	per, fixed := time.Duration(0), c1
	if k > 1 {
		ck, err := measure(k)
		if err != nil {
			return plan.Generation{}, err
		}
		per = max(0, (ck-c1)/time.Duration(k-1))
		fixed = max(0, c1-per)
	}
	p, err := plan.ForGeneration(g.rt.Config, g.rt.Bandwidth(), plan.GenerationInput{Layers: g.m.NumLayers, WeightBytes: g.WeightBytes(),
		KVBytesPerSequence: g.KVBytesPerSequence(promptLen + maxNew), ComputeFixed: fixed, ComputePerSequence: per, MaxBatch: fit})
	if err == nil && fit < maxBatch && p.Batch == fit {
		p.Limit = fmt.Sprintf("the prefill's memory: %s for %d prompts of %d tokens within Options.PrefillBytes %s", mib(g.PrefillBytes(fit, promptLen)), fit, promptLen, mib(g.prefillBytes))
	}
	return p, err
}

// decodeSteps runs steps greedy decoding passes of batch sequences from
// position n over a KV cache of n positions that no prefill filled (zeros:
// the passes' arithmetic is that of any cache of that length), and returns
// each pass's compute (its time less its waits for weights).
func (g *Generator) decodeSteps(ctx context.Context, batch, n, steps int) ([]time.Duration, error) {
	if g.closed {
		return nil, errors.New("zinf generate: the Generator is closed")
	}
	n = max(n, 1)
	kv, err := g.openKV(batch, n, n+steps)
	if err != nil {
		return nil, err
	}
	defer kv.free()
	defer g.src.endPasses()
	headEx := g.headExec(Sampling{})
	in := make([][]int32, batch)
	for i := range in {
		in[i] = []int32{0}
	}
	var out []time.Duration
	for s := range steps {
		t0, w0 := time.Now(), g.src.ioWait()
		if _, err := g.pass(ctx, in, n+s, kv, headEx, s < steps-1); err != nil {
			return nil, fmt.Errorf("zinf generate: plan: decoding step at position %d: %w", n+s, err)
		}
		out = append(out, time.Since(t0)-(g.src.ioWait()-w0))
	}
	return out, nil
}

// A prefill runs each transformer layer over its positions in chunks
// (Generator.layer): at most maxPrefillChunk positions, fewer where one
// chunk's widest intermediate (the attention scores of every head over the
// KV cache, the FFN's hidden layer) would pass prefillChunkBytes or its
// arithmetic prefillChunkFlops, so that a chunk's graph, its memory and
// its time (the wait for a cancel) stay bounded whatever the prompt.
const (
	maxPrefillChunk   = 64
	prefillChunkBytes = 8 << 20
	prefillChunkFlops = 1 << 30
	// prefillGarbage is what a prefill's chunks may allocate between two
	// collections (gcPacer).
	prefillGarbage = 64 << 20
)

// prefillChunk is the positions of one chunk of a prefill of batch
// sequences over a KV cache of n positions: a power of two.
func (g *Generator) prefillChunk(batch, n int) int {
	m := g.m
	widest := int64(max(m.NumHeads*n, 2*m.FFNDim, m.EmbedDim))
	perPos := int64(batch) * widest * 4 // float32 or narrower
	var params int64                    // one transformer layer's weights
	for _, v := range g.vars {
		if v.Layer == 1 {
			params += int64(v.Numel())
		}
	}
	flops := int64(batch) * (2*params + 4*int64(m.NumHeads)*int64(m.HeadDim)*int64(n))
	c := maxPrefillChunk
	for c > 1 && (int64(c)*perPos > prefillChunkBytes || int64(c)*flops > prefillChunkFlops) {
		c /= 2
	}
	return c
}

// PrefillBytes is the memory a prefill of batch prompts of n tokens takes
// beyond the pinned pool and the KV cache: its activations (a layer's input
// and output, and a copy of each, for every position: they grow with the
// prompt), one chunk's intermediates (bounded, see prefillChunk), the
// garbage the chunks leave between two collections (gcPacer) and one
// layer's KV cache entry read out of the cache. Generate and PlanBatch
// refuse a prefill that needs more than Options.PrefillBytes.
func (g *Generator) PrefillBytes(batch, n int) int64 {
	act := int64(batch) * int64(n) * int64(g.m.EmbedDim) * int64(g.m.DType.Size())
	return 4*act + 8*prefillChunkBytes + prefillGarbage + int64(batch)*g.KVBytesPerSequence(n)
}

// PrefillBound is Options.PrefillBytes (or its default).
func (g *Generator) PrefillBound() int64 { return g.prefillBytes }

// prefillError refuses a prefill of batch prompts of n tokens that needs
// need bytes, with the figures.
func (g *Generator) prefillError(batch, n int, need int64) error {
	act := int64(batch) * int64(n) * int64(g.m.EmbedDim) * int64(g.m.DType.Size())
	return fmt.Errorf("zinf generate: a prefill of %d prompt(s) of %d tokens needs %s (4 x %s of activations: %d x %d positions x %d dims of %s; and %s for one chunk, its garbage and one layer's KV cache), over the bound of %s (Options.PrefillBytes, zinf-generate --prefill-bytes): shorten the prompts, prefill fewer at once, or raise the bound",
		batch, n, mib(need), mib(act), batch, n, g.m.EmbedDim, g.m.DType, mib(need-4*act), mib(g.prefillBytes))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
