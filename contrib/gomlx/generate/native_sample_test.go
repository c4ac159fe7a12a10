package generate

import (
	"math"
	"testing"

	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"
)

// TestNativeSamplerDistribution: the native path's draws follow the
// softmax of the kept logits over the temperature: temperature alone,
// top-k (the k largest kept), top-p (GoMLX's mask: the largest
// power-of-two count below the vocabulary whose probabilities reach p,
// else all), each within 0.015 of its probability over 40000 draws.
func TestNativeSamplerDistribution(t *testing.T) {
	logits := []float32{float32(math.Log(1)), float32(math.Log(2)), float32(math.Log(3)), float32(math.Log(4))}
	for _, c := range []struct {
		name string
		s    Sampling
		want [4]float64
	}{
		{"temperature 1", Sampling{Strategy: sample.StrategyTemperature, Temperature: 1}, [4]float64{.1, .2, .3, .4}},
		{"temperature 0.5", Sampling{Strategy: sample.StrategyTemperature, Temperature: 0.5}, [4]float64{1. / 30, 4. / 30, 9. / 30, 16. / 30}},
		{"top-k 2", Sampling{Strategy: sample.StrategyTopK, TopK: 2, Temperature: 1}, [4]float64{0, 0, 3. / 7, 4. / 7}},
		{"top-p 0.6", Sampling{Strategy: sample.StrategyTopP, TopP: 0.6, Temperature: 1}, [4]float64{0, 0, 3. / 7, 4. / 7}},
		{"top-p 0.8", Sampling{Strategy: sample.StrategyTopP, TopP: 0.8, Temperature: 1}, [4]float64{.1, .2, .3, .4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.s.Seed = 5
			ns := newNativeSampler(c.s)
			const n = 40000
			var got [4]float64
			for range n {
				got[ns.row(logits)]++
			}
			for i := range got {
				if p := got[i] / n; math.Abs(p-c.want[i]) > 0.015 {
					t.Fatalf("token %d drawn %.4f of the time, want %.4f (all: %v)", i, p, c.want[i], got)
				}
			}
		})
	}
	// Greedy is the argmax; the same seed draws the same tokens.
	if g := newNativeSampler(Sampling{}).next(logits, 1, 4); g[0] != 3 {
		t.Fatalf("greedy %v", g)
	}
	a, b := newNativeSampler(Sampling{Strategy: sample.StrategyTemperature, Temperature: 1, Seed: 9}), newNativeSampler(Sampling{Strategy: sample.StrategyTemperature, Temperature: 1, Seed: 9})
	for range 100 {
		if x, y := a.row(logits), b.row(logits); x != y {
			t.Fatalf("seed 9 drew %d then %d", x, y)
		}
	}
}
