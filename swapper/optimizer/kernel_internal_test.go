package optimizer

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/yield"
)

// TestAdamSplit: an update split over any number of workers, at lengths
// around the chunk boundaries, updates every element exactly once, on
// every kernel: the bits equal one scalar call over the whole range.
func TestAdamSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	lens := []int{0, 1, 17, minChunk - 1, minChunk, minChunk + 1, 2*minChunk - 1, 2 * minChunk, 2*minChunk + 17, 5*minChunk + 3, 41*minChunk + 5}
	if testing.Short() {
		lens = lens[:7]
	}
	a := newAdamArgs(4, Hyper{LR: 1e-2, WeightDecay: 0.1})
	for _, n := range lens {
		var ops [4][]float32
		for k := range ops {
			ops[k] = make([]float32, n)
			for i := range ops[k] {
				ops[k][i] = float32(r.NormFloat64())
			}
		}
		for i := range ops[3] {
			ops[3][i] = float32(math.Abs(float64(ops[3][i])))
		}
		var want [4][]float32
		for k := range ops {
			want[k] = slices.Clone(ops[k])
		}
		adamScalar(want[0], want[1], want[2], want[3], &a)
		for _, k := range append([]*kernel{scalarKernel}, simdKernels...) {
			// With compute marked (package yield) the update goes in
			// chunks with yield points between them, on one worker too.
			for _, computing := range []bool{false, true} {
				if computing {
					yield.Begin()
				}
				for workers := 1; workers <= 5; workers++ {
					var got [4][]float32
					for j := range ops {
						got[j] = slices.Clone(ops[j])
					}
					k.adamSplit(got[0], got[1], got[2], got[3], &a, workers)
					for j := range got {
						for i := range got[j] {
							if math.Float32bits(got[j][i]) != math.Float32bits(want[j][i]) {
								t.Fatalf("%s, n=%d, %d workers, computing %v: operand %d element %d is %v, want %v", k.name, n, workers, computing, j, i, got[j][i], want[j][i])
							}
						}
					}
				}
				if computing {
					yield.End()
				}
			}
		}
	}
}

// sliceGrads serves one gradient slice per tensor name.
type sliceGrads map[string][]float32

func (s sliceGrads) RangeBufferBytes(lo, hi int) int { return 4 * (hi - lo) }

func (s sliceGrads) ReadRange(_ context.Context, name string, lo, hi int, dst []byte) ([]float32, error) {
	out := buffers.Float32Bytes(dst[:4*(hi-lo)])
	copy(out, s[name][lo:hi])
	return out, nil
}

// TestStepRunsRuleKernels: the optimizer's step runs every rule's vector
// body of its kernel (not only the scalar loop): a kernel whose bodies
// count the elements they are given (and run the scalar reference on
// them) sees every whole vector of every sub-group, split over workers,
// and the results are Update's.
func TestStepRunsRuleKernels(t *testing.T) {
	var seen atomic.Int64
	const lanes = 8
	spy := &kernel{name: "spy", lanes: lanes,
		adam: func(p, g, m, v *float32, n int, args [adamArgCount]float32, mode int) {
			seen.Add(int64(n))
			adamScalar(unsafe.Slice(p, n), unsafe.Slice(g, n), unsafe.Slice(m, n), unsafe.Slice(v, n), &adamArgs{args, mode})
		},
		sgd: func(w, g, buf *float32, n int, args [sgdArgCount]float32, mode int) {
			seen.Add(int64(n))
			var b []float32
			if buf != nil {
				b = unsafe.Slice(buf, n)
			}
			sgdScalar(unsafe.Slice(w, n), unsafe.Slice(g, n), b, &sgdArgs{args, mode})
		},
		adagrad: func(w, g, s *float32, n int, args [adagradArgCount]float32, mode int) {
			seen.Add(int64(n))
			adagradScalar(unsafe.Slice(w, n), unsafe.Slice(g, n), unsafe.Slice(s, n), &adagradArgs{args, mode})
		},
		lion: func(w, g, m *float32, n int, args [lionArgCount]float32, mode int) {
			seen.Add(int64(n))
			lionScalar(unsafe.Slice(w, n), unsafe.Slice(g, n), unsafe.Slice(m, n), &lionArgs{args, mode})
		},
	}
	// Sub-groups of 3*minChunk+5 elements, split into chunks of minChunk
	// (whole vectors) and a last one of 5 (a scalar tail).
	const subGroup = 3*minChunk + 5
	const n = 2*subGroup + 11
	wantVec := 2*(3*minChunk) + (11 - 11%lanes)
	for _, h := range []Hyper{
		{Rule: RuleSGD, LR: 0.1},
		{Rule: RuleSGD, LR: 0.1, Momentum: 0.9, Nesterov: true, WeightDecay: 0.01},
		{Rule: RuleAdagrad, WeightDecay: 0.01},
		{Rule: RuleLion, WeightDecay: 0.1},
		{Rule: RuleAdam, AdamW: true, WeightDecay: 0.1},
	} {
		t.Run(fmt.Sprintf("%s-%d", h.Rule, h.StateCount()), func(t *testing.T) {
			pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 20, Pin: buffers.PinOff})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			g := make([]float32, n)
			w := make([]float32, n)
			for i := range g {
				g[i], w[i] = float32(math.Cos(float64(i))), float32(math.Sin(float64(i)))
			}
			opt, err := New(Options{Pool: pool, Grads: sliceGrads{"w": g}, Hyper: h, SubGroupSize: subGroup, UpdateWorkers: 3,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer opt.Close()
			opt.kern = spy
			if err := opt.Register("w", w); err != nil {
				t.Fatal(err)
			}
			seen.Store(0)
			if err := opt.Step(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := seen.Load(); got != int64(wantVec) {
				t.Errorf("the kernel's vector body updated %d elements, want %d (every whole vector of %d)", got, wantVec, n)
			}
			ref := slices.Clone(w)
			st := make([][]float32, h.StateCount())
			for j := range st {
				st[j] = make([]float32, n)
				for i := range st[j] {
					st[j][i] = h.initialState(j)
				}
			}
			Kernel{}.Update(ref, slices.Clone(g), st, 1, h, opt.DefaultParams())
			got, _, err := opt.ReadStates(context.Background(), "w")
			if err != nil {
				t.Fatal(err)
			}
			for i := range ref {
				if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
					t.Fatalf("param %d after the step is %v, Update gives %v", i, got[i], ref[i])
				}
			}
		})
	}
}
