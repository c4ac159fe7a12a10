package generate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/zinfio/zinf"
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
// (at most maxBatch of them) with zinf.PlanGeneration: the largest the KV
// cache budget allows, its step and tokens per second predicted from the
// runtime's NVMe bandwidth and compute measured here, on two short
// generations at the sequences' mean length (batch 1 and batch 4, or
// maxBatch if smaller) whose decoding
// steps' compute (their time less their waits for weights) gives a fixed
// and a per-sequence part.
func (g *Generator) PlanBatch(ctx context.Context, promptLen, maxNew, maxBatch int) (zinf.GenerationPlan, error) {
	if g.rt == nil {
		return zinf.GenerationPlan{}, errors.New("zinf generate: plan: a mapped model (OpenMapped) has no zinf runtime to plan with")
	}
	if promptLen <= 0 || maxNew <= 0 || maxBatch <= 0 {
		return zinf.GenerationPlan{}, fmt.Errorf("zinf generate: plan: prompt length %d, new tokens %d, batch %d (allowed: > 0)", promptLen, maxNew, maxBatch)
	}
	measure := func(b int) (time.Duration, error) {
		ps := make([][]int32, b)
		for i := range ps {
			// At the sequences' mean length: attention and the KV cache grow with it.
			ps[i] = make([]int32, min(promptLen+maxNew/2, 4096))
		}
		var steps []time.Duration
		_, err := g.Generate(ctx, ps, Sampling{MaxNewTokens: 8}, func(s StepInfo) {
			if s.Step > 0 {
				steps = append(steps, s.Time-s.IOWait)
			}
		})
		if err != nil || len(steps) == 0 {
			return 0, err
		}
		slices.Sort(steps)
		return steps[len(steps)/2], nil
	}
	c1, err := measure(1)
	if err != nil {
		return zinf.GenerationPlan{}, err
	}
	k := min(4, maxBatch)
	per, fixed := time.Duration(0), c1
	if k > 1 {
		ck, err := measure(k)
		if err != nil {
			return zinf.GenerationPlan{}, err
		}
		per = max(0, (ck-c1)/time.Duration(k-1))
		fixed = max(0, c1-per)
	}
	return zinf.PlanGeneration(g.rt.Config, g.rt.Bandwidth(), zinf.GenerationInput{Layers: g.m.NumLayers, WeightBytes: g.WeightBytes(),
		KVBytesPerSequence: g.KVBytesPerSequence(promptLen + maxNew), ComputeFixed: fixed, ComputePerSequence: per, MaxBatch: maxBatch})
}
