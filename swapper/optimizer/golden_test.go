package optimizer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// golden is testdata/adam_golden.json, written by scripts/adam_golden.py
// from torch.optim.Adam and torch.optim.AdamW; float32 values are stored
// as their bit patterns.
type golden struct {
	Torch string       `json:"torch"`
	Cases []goldenCase `json:"cases"`
}

type goldenCase struct {
	Name                             string `json:"name"`
	AdamW                            bool   `json:"adamw"`
	LR, Beta1, Beta2, Eps, WeightDec uint32
	Steps                            int            `json:"steps"`
	Tensors                          []goldenTensor `json:"tensors"`
}

func (c *goldenCase) UnmarshalJSON(b []byte) error {
	type plain goldenCase
	var aux struct {
		plain
		LR          uint32 `json:"lr"`
		Beta1       uint32 `json:"beta1"`
		Beta2       uint32 `json:"beta2"`
		Eps         uint32 `json:"eps"`
		WeightDecay uint32 `json:"weight_decay"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*c = goldenCase(aux.plain)
	c.LR, c.Beta1, c.Beta2, c.Eps, c.WeightDec = aux.LR, aux.Beta1, aux.Beta2, aux.Eps, aux.WeightDecay
	return nil
}

type goldenTensor struct {
	N        int        `json:"n"`
	Init     []uint32   `json:"init"`
	Grads    [][]uint32 `json:"grads"`
	Param    [][]uint32 `json:"param"`
	ExpAvg   [][]uint32 `json:"exp_avg"`
	ExpAvgSq [][]uint32 `json:"exp_avg_sq"`
}

func floats(u []uint32) []float32 {
	out := make([]float32, len(u))
	for i, b := range u {
		out[i] = math.Float32frombits(b)
	}
	return out
}

// ulps is the distance between two finite float32s in units in the last
// place: how many representable values lie between them.
func ulps(a, b float32) int64 {
	key := func(x float32) int64 {
		i := int64(int32(math.Float32bits(x)))
		if i < 0 {
			i = math.MinInt32 - i // order negative values below positive ones
		}
		return i
	}
	d := key(a) - key(b)
	if d < 0 {
		d = -d
	}
	return d
}

// normUlp is the ulp of the largest magnitude in want: the unit in which
// an element's difference is measured. An element's own ulp would overstate
// differences where it is the small difference of larger terms (exp_avg
// of a gradient that changes sign: 1 ulp of the terms is hundreds of the
// result's).
func normUlp(want []float32) float64 {
	var m float32
	for _, w := range want {
		m = max(m, float32(math.Abs(float64(w))))
	}
	if m == 0 {
		return float64(math.SmallestNonzeroFloat32)
	}
	return float64(math.Nextafter32(m, float32(math.Inf(1))) - m)
}

// goldenGrads serves the golden gradients of the current step.
type goldenGrads struct{ g map[string][]float32 }

func (s *goldenGrads) RangeBufferBytes(lo, hi int) int { return 4 * (hi - lo) }

func (s *goldenGrads) ReadRange(_ context.Context, name string, lo, hi int, dst []byte) ([]float32, error) {
	src, ok := s.g[name]
	if !ok || hi > len(src) {
		return nil, fmt.Errorf("no gradient [%d, %d) for %q", lo, hi, name)
	}
	out := buffers.Float32Bytes(dst[:4*(hi-lo)])
	copy(out, src[lo:hi])
	return out, nil
}

// Tolerances of TestAdamMatchesPyTorch, in ulps of the largest magnitude
// in the state tensor at that step (normUlp), as tight as the golden data
// allows (torch 1.13 measured: param 1, exp_avg 2, exp_avg_sq 1.5; element
// by element, in each value's own ulps, up to 74, 381 and 9, all where a
// value is a small difference of larger terms). They are not zero because PyTorch (torch.optim's
// single-tensor Adam on CPU) and zinf round differently, by design:
//
//   - PyTorch computes the bias corrections 1-beta1^t and sqrt(1-beta2^t)
//     and the step size lr/(1-beta1^t) in double precision (Python floats)
//     and rounds them to float32 only when they meet a tensor; zinf rounds
//     each to float32 where it is computed, as DeepSpeed's CPU Adam does.
//     That moves the step size and denominator by an ulp now and then, and
//     the master weights with them.
//   - PyTorch's 1-beta1, 1-beta2 and 1-lr*weight_decay are double and
//     rounded to float32 once; zinf's are float32 operations on the float32
//     hyperparameters (the golden cases hand PyTorch exactly those float32
//     values, so the inputs agree).
//   - PyTorch's vectorised CPU kernels may fuse a multiply and an add
//     (add_ with alpha, addcmul_, addcdiv_) where zinf rounds each
//     operation on its own, so that its result is the same on every
//     architecture.
//
// Differences compound over the steps through exp_avg and exp_avg_sq.
const (
	ulpParam    = 1
	ulpExpAvg   = 2
	ulpExpAvgSq = 1.5
)

// readGolden decodes a golden file of testdata.
func readGolden[T any](t *testing.T, path string) T {
	t.Helper()
	var gd T
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &gd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return gd
}

// TestAdamMatchesPyTorch replays PyTorch's golden gradients through the
// optimizer (states in pinned memory, a pipeline) on every kernel of this
// CPU, with sub-groups of 5 elements (scalar tails only) and of whole
// tensors (the golden tensors of 33 elements run mostly on the SIMD
// body), and compares params, exp_avg and exp_avg_sq after every step with
// torch.optim.Adam / AdamW's, within the tolerances above.
func TestAdamMatchesPyTorch(t *testing.T) {
	for _, k := range optimizer.Kernels() {
		for _, sg := range []int{5, 1 << 20} {
			t.Run(fmt.Sprintf("%s/subgroup=%d", k, sg), func(t *testing.T) { testAdamMatchesPyTorch(t, k.Name(), sg) })
		}
	}
}

func testAdamMatchesPyTorch(t *testing.T, kernel string, subGroup int) {
	gd := readGolden[golden](t, "testdata/adam_golden.json")
	if len(gd.Cases) == 0 {
		t.Fatal("no golden cases")
	}
	var worst [3]float64
	var worstElem [3]int64
	for _, c := range gd.Cases {
		t.Run(c.Name, func(t *testing.T) {
			pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			f := math.Float32frombits
			h := optimizer.Hyper{LR: f(c.LR), Beta1: f(c.Beta1), Beta2: f(c.Beta2), Eps: f(c.Eps), WeightDecay: f(c.WeightDec), AdamW: c.AdamW}
			src := &goldenGrads{}
			opt, err := optimizer.New(optimizer.Options{Pool: pool, Grads: src, Hyper: h, SubGroupSize: subGroup, PipelineDepth: 1,
				Kernel: kernel, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer opt.Close()
			for i, gt := range c.Tensors {
				if len(gt.Init) != gt.N || len(gt.Grads) != c.Steps {
					t.Fatalf("tensor %d: malformed golden data", i)
				}
				if err := opt.Register(fmt.Sprint(i), floats(gt.Init)); err != nil {
					t.Fatal(err)
				}
			}
			for step := range c.Steps {
				src.g = map[string][]float32{}
				for i, gt := range c.Tensors {
					src.g[fmt.Sprint(i)] = floats(gt.Grads[step])
				}
				if err := opt.Step(context.Background()); err != nil {
					t.Fatal(err)
				}
				for i, gt := range c.Tensors {
					p, m, v, err := opt.ReadState(context.Background(), fmt.Sprint(i))
					if err != nil {
						t.Fatal(err)
					}
					for k, q := range []struct {
						what string
						got  []float32
						want []uint32
						tol  float64
					}{{"param", p, gt.Param[step], ulpParam}, {"exp_avg", m, gt.ExpAvg[step], ulpExpAvg}, {"exp_avg_sq", v, gt.ExpAvgSq[step], ulpExpAvgSq}} {
						want := floats(q.want)
						if len(want) != len(q.got) {
							t.Fatalf("step %d tensor %d %s: %d values, golden %d", step+1, i, q.what, len(q.got), len(want))
						}
						unit := normUlp(want)
						for e := range want {
							worstElem[k] = max(worstElem[k], ulps(q.got[e], want[e]))
							d := math.Abs(float64(q.got[e])-float64(want[e])) / unit
							worst[k] = max(worst[k], d)
							if d > q.tol {
								t.Errorf("step %d, tensor %d (n=%d), %s[%d]: zinf %v, torch %v: %.2f ulps of the tensor's largest value apart (tolerance %v)",
									step+1, i, gt.N, q.what, e, q.got[e], want[e], d, q.tol)
							}
						}
					}
				}
			}
		})
	}
	t.Logf("torch %s: largest differences in ulps of the tensor's largest value: param %.2f, exp_avg %.2f, exp_avg_sq %.2f; element by element (own ulps, inflated where a value is the small difference of larger terms): param %d, exp_avg %d, exp_avg_sq %d",
		gd.Torch, worst[0], worst[1], worst[2], worstElem[0], worstElem[1], worstElem[2])
}
