package optimizer_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// rulesGolden is testdata/optimizer_golden.json, written by
// scripts/optimizer_golden.py: torch.optim.SGD and torch.optim.Adagrad
// trajectories, and Lion's from the paper's formula in torch float32 ops.
type rulesGolden struct {
	Torch string `json:"torch"`
	Cases []struct {
		Name       string   `json:"name"`
		Rule       string   `json:"rule"`
		StateNames []string `json:"state_names"`
		Steps      int      `json:"steps"`
		LR         uint32   `json:"lr"`
		Momentum   uint32   `json:"momentum"`
		Dampening  uint32   `json:"dampening"`
		Nesterov   bool     `json:"nesterov"`
		WD         uint32   `json:"weight_decay"`
		LRDecay    uint32   `json:"lr_decay"`
		// LR64 and LRDecay64 are the float64 values PyTorch was given,
		// where they are not the float32 ones: zinf steps with them as a
		// schedule hands them (StepParams.LR64).
		LR64      *float64 `json:"lr_f64"`
		LRDecay64 *float64 `json:"lr_decay_f64"`
		// Exact: a probe compared bit for bit (Adagrad's: each step's
		// param is torch's float32 decayed rate, -clr/2).
		Exact   bool   `json:"exact"`
		InitAcc uint32 `json:"initial_accumulator_value"`
		Eps     uint32 `json:"eps"`
		Beta1   uint32 `json:"beta1"`
		Beta2   uint32 `json:"beta2"`
		Tensors []struct {
			N      int          `json:"n"`
			Init   []uint32     `json:"init"`
			Grads  [][]uint32   `json:"grads"`
			Param  [][]uint32   `json:"param"`
			States [][][]uint32 `json:"states"` // step, state, element
		} `json:"tensors"`
	} `json:"cases"`
}

// Tolerances of TestRulesMatchPyTorch, in ulps of the largest magnitude of
// the tensor at that step (normUlp), as measured with torch 1.13 (SGD:
// param 1, momentum_buffer 1; Adagrad: param 0, sum 1; Lion: param 0,
// exp_avg 2), each at least 1: zinf rounds every operation on its own, in float32; torch's
// CPU kernels fuse some of them (add with alpha and addcmul/addcdiv are
// fused multiply-adds in the vectorized lanes, not in the scalar tail),
// and take scalar hyperparameters through doubles (Adagrad's clr =
// lr/(1+(step-1)*lr_decay) is computed in double by both; Lion's 1-lr*wd
// is a double in the formula and a float32 product in zinf). Lion's
// param moves by exactly lr*sign(c) a step, so its differences stay at
// the rounding of that subtraction.
var rulesTolerance = map[string]struct{ param, state float64 }{
	"sgd":     {1, 1},
	"adagrad": {1, 1},
	"lion":    {1, 2},
}

// TestRulesMatchPyTorch replays the golden gradients through the optimizer
// on every kernel of this CPU, with sub-groups of 5 elements (scalar tails
// only) and of whole tensors (the 33-element golden tensors run mostly on
// the SIMD body), and compares params and states after every step with
// PyTorch's within the tolerances above.
func TestRulesMatchPyTorch(t *testing.T) {
	for _, k := range optimizer.Kernels() {
		for _, sg := range []int{5, 1 << 20} {
			t.Run(fmt.Sprintf("%s/subgroup=%d", k, sg), func(t *testing.T) { testRulesMatchPyTorch(t, k.Name(), sg) })
		}
	}
}

func testRulesMatchPyTorch(t *testing.T, kernel string, subGroup int) {
	gd := readGolden[rulesGolden](t, "testdata/optimizer_golden.json")
	if len(gd.Cases) == 0 {
		t.Fatal("no golden cases")
	}
	f := math.Float32frombits
	worst := map[string][2]float64{}
	for _, c := range gd.Cases {
		t.Run(c.Name, func(t *testing.T) {
			var h optimizer.Hyper
			switch c.Rule {
			case "sgd":
				h = optimizer.Hyper{Rule: optimizer.RuleSGD, LR: f(c.LR), Momentum: f(c.Momentum), Dampening: f(c.Dampening), Nesterov: c.Nesterov, WeightDecay: f(c.WD)}
			case "adagrad":
				h = optimizer.Hyper{Rule: optimizer.RuleAdagrad, LR: f(c.LR), LRDecay: float64(f(c.LRDecay)), WeightDecay: f(c.WD), InitialAccumulatorValue: f(c.InitAcc), Eps: f(c.Eps)}
				if c.LRDecay64 != nil {
					h.LRDecay = *c.LRDecay64
				}
			case "lion":
				h = optimizer.Hyper{Rule: optimizer.RuleLion, LR: f(c.LR), Beta1: f(c.Beta1), Beta2: f(c.Beta2), WeightDecay: f(c.WD)}
			default:
				t.Fatalf("rule %q", c.Rule)
			}
			if !slices.Equal(h.StateNames(), c.StateNames) {
				t.Fatalf("state names %v, torch %v", h.StateNames(), c.StateNames)
			}
			pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			src := &goldenGrads{}
			opt, err := optimizer.New(optimizer.Options{Pool: pool, Grads: src, Hyper: h, SubGroupSize: subGroup, PipelineDepth: 1,
				Kernel: kernel, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer opt.Close()
			for i, gt := range c.Tensors {
				if len(gt.Init) != gt.N || len(gt.Grads) != c.Steps || len(gt.States) != c.Steps {
					t.Fatalf("tensor %d: malformed golden data", i)
				}
				if err := opt.Register(fmt.Sprint(i), floats(gt.Init)); err != nil {
					t.Fatal(err)
				}
			}
			tol := rulesTolerance[c.Rule]
			if c.Exact {
				tol.param, tol.state = 0, 0
			}
			for step := range c.Steps {
				src.g = map[string][]float32{}
				for i, gt := range c.Tensors {
					src.g[fmt.Sprint(i)] = floats(gt.Grads[step])
				}
				sp := opt.DefaultParams()
				if c.LR64 != nil {
					sp.LR, sp.LR64 = float32(*c.LR64), *c.LR64
				}
				if err := opt.StepWith(context.Background(), sp); err != nil {
					t.Fatal(err)
				}
				for i, gt := range c.Tensors {
					p, st, err := opt.ReadStates(context.Background(), fmt.Sprint(i))
					if err != nil {
						t.Fatal(err)
					}
					type cmp struct {
						what string
						got  []float32
						want []uint32
						tol  float64
						k    int
					}
					cmps := []cmp{{"param", p, gt.Param[step], tol.param, 0}}
					for k, name := range c.StateNames {
						cmps = append(cmps, cmp{name, st[k], gt.States[step][k], tol.state, 1})
					}
					for _, q := range cmps {
						want := floats(q.want)
						unit := normUlp(want)
						for e := range want {
							d := math.Abs(float64(q.got[e])-float64(want[e])) / unit
							w := worst[c.Rule]
							w[q.k] = max(w[q.k], d)
							worst[c.Rule] = w
							if d > q.tol || math.IsNaN(d) {
								t.Errorf("step %d, tensor %d (n=%d), %s[%d]: zinf %v, torch %v: %.2f ulps of the tensor's largest value apart (tolerance %v)",
									step+1, i, gt.N, q.what, e, q.got[e], want[e], d, q.tol)
							}
						}
					}
				}
			}
		})
	}
	for rule, w := range worst {
		t.Logf("%s, sub-groups of %d: torch %s, %s: largest differences in ulps of the tensor's largest value: param %.2f, states %.2f", kernel, subGroup, gd.Torch, rule, w[0], w[1])
	}
}

// TestRulesReference: every rule stepped through the swapper (sub-groups,
// pipeline, a store-less optimizer; small sub-groups, and one large enough
// for a staggered record split over workers) on every kernel of this CPU
// equals the scalar kernel's Update on whole tensors bit for bit, with
// scaled gradients.
func TestRulesReference(t *testing.T) {
	for _, k := range optimizer.Kernels() {
		for _, size := range []struct{ n, subGroup, workers int }{{50, 7, 1}, {2*optimizer.StaggerMinElems + 4099, 1 << 20, 3}} {
			t.Run(fmt.Sprintf("%s/%d", k, size.n), func(t *testing.T) { rulesReference(t, k.Name(), size.n, size.subGroup, size.workers) })
		}
	}
}

func rulesReference(t *testing.T, kernel string, n, subGroup, workers int) {
	for _, h := range []optimizer.Hyper{
		{Rule: optimizer.RuleSGD, LR: 0.1},
		{Rule: optimizer.RuleSGD, LR: 0.1, Momentum: 0.9, Dampening: 0.2, WeightDecay: 0.01},
		{Rule: optimizer.RuleSGD, LR: 0.1, Momentum: 0.9, Nesterov: true},
		{Rule: optimizer.RuleAdagrad, LR: 0.05, LRDecay: 0.1, InitialAccumulatorValue: 0.2, WeightDecay: 0.01},
		{Rule: optimizer.RuleLion, LR: 1e-3, WeightDecay: 0.1},
		{Rule: optimizer.RuleAdam, LR: 1e-2, AdamW: true, WeightDecay: 0.01},
	} {
		t.Run(fmt.Sprintf("%s-%v", h.Rule, h.StateNames()), func(t *testing.T) {
			pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 8 << 20, Pin: buffers.PinOff})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			src := &goldenGrads{}
			opt, err := optimizer.New(optimizer.Options{Pool: pool, Grads: src, Hyper: h, SubGroupSize: subGroup, PipelineDepth: 2,
				UpdateWorkers: workers, Kernel: kernel, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer opt.Close()
			w := make([]float32, n)
			for i := range w {
				w[i] = float32(math.Sin(float64(i)))
			}
			if err := opt.Register("w", w); err != nil {
				t.Fatal(err)
			}
			ref := append([]float32(nil), w...)
			var states [][]float32
			for range h.StateCount() {
				s := make([]float32, n)
				for i := range s {
					if h.Rule == optimizer.RuleAdagrad {
						s[i] = h.InitialAccumulatorValue
					}
				}
				states = append(states, s)
			}
			for step := 1; step <= 4; step++ {
				g := make([]float32, n)
				for i := range g {
					g[i] = float32(math.Cos(float64(i*step))) * 0.1
				}
				g[3] = 0
				p := optimizer.StepParams{LR: h.LR * float32(step), ScaleGrads: step%2 == 0, GradScale: 0.5}
				src.g = map[string][]float32{"w": append([]float32(nil), g...)}
				if err := opt.StepWith(context.Background(), p); err != nil {
					t.Fatal(err)
				}
				optimizer.Kernels()[0].Update(ref, g, states, step, h, p)
				got, st, err := opt.ReadStates(context.Background(), "w")
				if err != nil {
					t.Fatal(err)
				}
				for k, pair := range append([][2][]float32{{got, ref}}, zipStates(st, states)...) {
					for i := range pair[1] {
						if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
							t.Fatalf("step %d: array %d [%d] = %v, Update %v", step, k, i, pair[0][i], pair[1][i])
						}
					}
				}
			}
		})
	}
}

func zipStates(a, b [][]float32) [][2][]float32 {
	out := make([][2][]float32, len(a))
	for i := range a {
		out[i] = [2][]float32{a[i], b[i]}
	}
	return out
}
