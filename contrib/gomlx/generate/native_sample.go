package generate

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"
)

// nativeSampler draws the native decoder's tokens from its logits by the
// generation's strategy, in Go, with the masks and the draw of the GoMLX
// path (Sample): top-k keeps the k largest logits (ties in index order),
// top-p what nucleus says, and the draw is GoMLX's
// Gumbel-argmax over the kept logits divided by the temperature. The
// uniforms come from a PCG generator seeded with Sampling.Seed, not from
// GoMLX's RNG: a seed gives the same tokens run after run on the native
// path, and other tokens than on the GoMLX path (the same distribution).
type nativeSampler struct {
	s       Sampling
	rng     *rand.Rand
	idx     []int32   // scratch: token ids sorted by logit
	kept    []float32 // scratch: the row's logits after the mask
	probSum []float64 // scratch
}

// pcgStream separates the sampler's stream from other users of the seed.
const pcgStream = 0x7a696e662d6e6174 // "zinf-nat"

func newNativeSampler(s Sampling) *nativeSampler {
	return &nativeSampler{s: s, rng: rand.New(rand.NewPCG(uint64(s.Seed), pcgStream))}
}

// next picks a token for each of the batch's rows of logits.
func (ns *nativeSampler) next(logits []float32, batch, vocab int) []int32 {
	if ns.s.Strategy == sample.StrategyGreedy {
		return greedy(logits, batch, vocab)
	}
	out := make([]int32, batch)
	for b := range batch {
		out[b] = ns.row(logits[b*vocab : (b+1)*vocab])
	}
	return out
}

// row draws one token from one row of logits.
func (ns *nativeSampler) row(l []float32) int32 {
	V := len(l)
	ns.kept = append(ns.kept[:0], l...)
	keep := V
	switch ns.s.Strategy {
	case sample.StrategyTopK:
		keep = min(ns.s.TopK, V)
	case sample.StrategyTopP:
		keep = ns.nucleus(l)
	}
	if keep < V {
		// The indices in the order of a stable descending sort: the
		// first keep are kept.
		ns.idx = ns.idx[:0]
		for i := range V {
			ns.idx = append(ns.idx, int32(i))
		}
		slices.SortStableFunc(ns.idx, func(a, b int32) int { return cmp.Compare(l[b], l[a]) })
		inf := float32(math.Inf(-1))
		for _, i := range ns.idx[keep:] {
			ns.kept[i] = inf
		}
	}
	// Gumbel-argmax, as sample.Temperature: logits / T plus
	// -log(-log(u)), u uniform in [1e-10, 1-1e-7], in float32.
	t := float32(ns.s.Temperature)
	best, bv := 0, float32(math.Inf(-1))
	for i, x := range ns.kept {
		if ns.s.Temperature != 1 {
			x /= t
		}
		u := min(max(ns.rng.Float32(), 1e-10), 1-1e-7)
		v := x + float32(-math.Log(-math.Log(float64(u))))
		if v > bv {
			best, bv = i, v
		}
	}
	return int32(best)
}

// nucleus returns the number of tokens top-p keeps, as the GoMLX path's
// mask (Sample, after GoMLX's sample.TopP) computes it: its loop goes over
// the candidate counts 1, 2, 4, ... below the vocabulary and each count
// whose most probable tokens' softmax probabilities reach p replaces the
// mask chosen so far, so the mask is the largest such count, and the
// whole vocabulary when even that one falls short of p.
func (ns *nativeSampler) nucleus(l []float32) int {
	V := len(l)
	k := 1
	for 2*k < V {
		k *= 2
	}
	if k >= V {
		return V
	}
	m := math.Inf(-1)
	for _, x := range l {
		m = max(m, float64(x))
	}
	ns.probSum = ns.probSum[:0]
	var z float64
	for _, x := range l {
		e := math.Exp(float64(x) - m)
		ns.probSum = append(ns.probSum, e)
		z += e
	}
	slices.SortFunc(ns.probSum, func(a, b float64) int { return cmp.Compare(b, a) })
	var sum float64
	for _, e := range ns.probSum[:k] {
		sum += e / z
	}
	if sum >= ns.s.TopP {
		return k
	}
	return V
}
