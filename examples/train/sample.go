package train

import (
	"context"
	"fmt"
	"math"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// maxSampled bounds the elements a sampled tensor is checked at, so the
// check costs no memory that grows with the model.
const maxSampled = 4096

// sampler is the check a run too large for the in-memory reference
// (Options.Verify) gets instead (Options.Sample): for a few tensors, at a
// bounded set of elements, every step the runtimes take must equal the
// update rule applied in memory to the same elements, from the state the
// runtimes committed before it and the gradients the loop handed over (the
// rules work element by element, so a subset is exact); and every read of
// a sampled parameter must return its committed master weight in the
// param dtype. The runtimes' states are read back through
// Runtime.VisitOptimizerStates after every step (from NVMe, checksums
// verified, one sub-group's record at a time in pinned memory: the check
// holds no copy of a tensor).
type sampler struct {
	spec    Spec
	rts     []*zinf.Runtime
	hyper   optimizer.Hyper
	clip    float64
	tensors map[string]*sampled
	order   []string
	// checked counts element updates and element reads compared.
	checked int64
}

type sampled struct {
	idx    []int       // elements of the full tensor
	master []float32   // at idx, as last committed
	states [][]float32 // the rule's states at idx, as last committed
	grad   []float32   // accumulated this step at idx
	fresh  bool        // no gradient accumulated since the last step
}

// sampleIndices picks up to maxSampled elements of an n-element tensor:
// all of them, or evenly spaced ones and the last.
func sampleIndices(n int) []int {
	if n <= maxSampled {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	out := make([]int, 0, maxSampled)
	stride := (n + maxSampled - 2) / (maxSampled - 1)
	for i := 0; i < n-1; i += stride {
		out = append(out, i)
	}
	return append(out, n-1)
}

func newSampler(ctx context.Context, spec Spec, rts []*zinf.Runtime, h optimizer.Hyper, clip float64, names []string) (*sampler, error) {
	s := &sampler{spec: spec, rts: rts, hyper: h, clip: clip, tensors: map[string]*sampled{}}
	for _, n := range names {
		if _, dup := s.tensors[n]; dup {
			continue
		}
		found := false
		for _, p := range spec.ParamNames() {
			found = found || p == n
		}
		if !found {
			return nil, fmt.Errorf("train: sample %q: not a tensor of the model (layerNNN.weight or layerNNN.bias)", n)
		}
		s.tensors[n] = &sampled{idx: sampleIndices(spec.Numel(n)), fresh: true}
		s.order = append(s.order, n)
	}
	return s, s.snapshot(ctx)
}

// snapshot reads every sampled tensor's committed state from the ranks.
func (s *sampler) snapshot(ctx context.Context) error {
	k := s.hyper.StateCount()
	for _, n := range s.order {
		t := s.tensors[n]
		t.master = make([]float32, len(t.idx))
		t.states = make([][]float32, k)
		for j := range t.states {
			t.states[j] = make([]float32, len(t.idx))
		}
		for r, rt := range s.rts {
			lo, hi := rt.Partition(n)
			if lo == hi {
				continue
			}
			// Sub-group by sub-group from pinned memory: no copy of the
			// tensor on the heap, however large it is.
			err := rt.VisitOptimizerStates(ctx, n, func(off int, master []float32, states [][]float32) error {
				if len(states) != k {
					return fmt.Errorf("rank %d keeps %d states of %s, the rule %d", r, len(states), n, k)
				}
				a, b := lo+off, lo+off+len(master)
				for i, e := range t.idx {
					if e >= a && e < b {
						t.master[i] = master[e-a]
						for j := range states {
							t.states[j][i] = states[j][e-a]
						}
					}
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("sampled check: rank %d: %w", r, err)
			}
		}
	}
	return nil
}

// accumulated records a micro-step's gradient of a parameter (the full
// tensor, as every rank got it), summed as the gradient swapper sums.
func (s *sampler) accumulated(name string, g []float32) {
	t, ok := s.tensors[name]
	if !ok {
		return
	}
	if t.fresh {
		t.grad = make([]float32, len(t.idx))
		for i, e := range t.idx {
			t.grad[i] = g[e]
		}
		t.fresh = false
		return
	}
	for i, e := range t.idx {
		t.grad[i] += g[e]
	}
}

// read checks a gathered parameter against the committed master weights.
func (s *sampler) read(name string, v []float32) error {
	t, ok := s.tensors[name]
	if !ok {
		return nil
	}
	want := make([]float32, len(t.idx))
	copy(want, t.master)
	s.spec.Quantize(want)
	for i, e := range t.idx {
		if math.Float32bits(v[e]) != math.Float32bits(want[i]) {
			return fmt.Errorf("sampled check: %s element %d reads %v, its committed master weight in %s is %v", name, e, v[e], s.spec.DType, want[i])
		}
	}
	s.checked += int64(len(t.idx))
	return nil
}

// stepped checks the step just taken (info: rank 0's account of it)
// against the rule applied in memory, then keeps the new state.
func (s *sampler) stepped(ctx context.Context, info zinf.StepInfo) error {
	type want struct {
		master []float32
		states [][]float32
	}
	wants := map[string]want{}
	for _, n := range s.order {
		t := s.tensors[n]
		w := want{master: append([]float32(nil), t.master...)}
		for _, st := range t.states {
			w.states = append(w.states, append([]float32(nil), st...))
		}
		if info.Applied && !t.fresh {
			p := optimizer.StepParams{LR: float32(info.LR), LR64: info.LR}
			if info.Beta1 != 0 || info.Beta2 != 0 {
				p.Beta1, p.Beta2 = float32(info.Beta1), float32(info.Beta2)
			}
			// The factor the step multiplied the gradients by, from the
			// norm it reports, as optimizer.GradFactor computes it.
			k := info.LossScale
			if s.clip > 0 {
				if q := (info.GradNorm + optimizer.ClipEpsilon) / s.clip; q > 1 {
					k = q * info.LossScale
				}
			}
			if f := float32(1 / k); f != 1 {
				p.ScaleGrads, p.GradScale = true, f
			}
			optimizer.Update(w.master, append([]float32(nil), t.grad...), w.states, info.Step, s.hyper, p)
		}
		wants[n] = w
		t.fresh, t.grad = true, nil
	}
	if err := s.snapshot(ctx); err != nil {
		return err
	}
	for _, n := range s.order {
		t, w := s.tensors[n], wants[n]
		for i, e := range t.idx {
			if math.Float32bits(t.master[i]) != math.Float32bits(w.master[i]) {
				return fmt.Errorf("sampled check: step %d: %s master element %d is %v, the rule in memory gives %v", info.Step, n, e, t.master[i], w.master[i])
			}
			for j := range t.states {
				if math.Float32bits(t.states[j][i]) != math.Float32bits(w.states[j][i]) {
					return fmt.Errorf("sampled check: step %d: %s %s element %d is %v, the rule in memory gives %v",
						info.Step, n, s.hyper.StateNames()[j], e, t.states[j][i], w.states[j][i])
				}
			}
		}
		s.checked += int64(len(t.idx))
	}
	return nil
}
