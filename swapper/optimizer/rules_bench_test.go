package optimizer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// BenchmarkRules measures the SGD, Adagrad and Lion updates alone as
// BenchmarkAdam measures Adam's: elements per second (Gelem/s), elements
// per CPU-second of the process (Gelem/cpu-s; Linux) and bytes touched per
// second, on every kernel of this CPU, at 16 Mi and 64 Mi elements (64 Ki
// and 256 Ki under -short), on one goroutine and split over GOMAXPROCS as
// the step splits it (Options.UpdateWorkers). The operands lie where a
// step's buffer puts them: the master and the states in a staggered
// record (LayoutForArrays), the gradient on the next page, in one mmap'd,
// page-aligned buffer (transparent huge pages with
// ZINF_BENCH_HUGEPAGES=1). The variants:
//
//   - SGD: plain SGD (no state; 8 bytes read and 4 written per element);
//   - SGD-momentum: momentum 0.9, dampening 0.1, weight decay, past the
//     first step (12 read, 8 written);
//   - SGD-nesterov: Nesterov momentum 0.9 (12 read, 8 written);
//   - Adagrad: lr_decay and weight decay (12 read, 8 written);
//   - Lion: weight decay (12 read, 8 written).
func BenchmarkRules(b *testing.B) {
	sizes := []int{16 << 20, 64 << 20}
	if testing.Short() {
		sizes = []int{1 << 16, 1 << 18}
	}
	workers := []int{1}
	if w := runtime.GOMAXPROCS(0); w > 1 && !testing.Short() {
		workers = append(workers, w)
	}
	variants := []struct {
		name string
		h    Hyper
	}{
		{"SGD", Hyper{Rule: RuleSGD, LR: 1e-2}},
		{"SGD-momentum", Hyper{Rule: RuleSGD, LR: 1e-2, Momentum: 0.9, Dampening: 0.1, WeightDecay: 1e-4}},
		{"SGD-nesterov", Hyper{Rule: RuleSGD, LR: 1e-2, Momentum: 0.9, Nesterov: true}},
		{"Adagrad", Hyper{Rule: RuleAdagrad, LR: 1e-2, Eps: 1e-10, LRDecay: 1e-3, WeightDecay: 1e-4}},
		{"Lion", Hyper{Rule: RuleLion, LR: 1e-4, Beta1: 0.9, Beta2: 0.99, WeightDecay: 0.1}},
	}
	kernels := append([]*kernel{scalarKernel}, simdKernels...)
	for _, n := range sizes {
		// One buffer big enough for the largest record (two arrays) and
		// the gradient after it.
		big := LayoutForArrays(n, 2)
		words := roundUp(big.Bytes, staggerPage)/4 + int64(n)
		mem, free := benchMemory(b, int(words))
		r := rand.New(rand.NewPCG(2, uint64(n)))
		for i := range mem {
			mem[i] = float32(r.NormFloat64()) // no zeros, no subnormals
		}
		for _, v := range variants {
			arrays := 1 + v.h.StateCount()
			lay := LayoutForArrays(n, arrays)
			gradOff := roundUp(lay.Bytes, staggerPage) / 4
			w, g := lay.array(mem, 0), mem[gradOff:gradOff+int64(n)]
			var st [][]float32
			for k := 1; k < arrays; k++ {
				s := lay.array(mem, k)
				if v.h.Rule == RuleAdagrad {
					for i := range s {
						s[i] = float32(math.Abs(float64(s[i])))
					}
				}
				st = append(st, s)
			}
			bytes := int64(4 * (2 + 2*len(st) + 1)) // read w, g, states; write w, states
			for _, k := range kernels {
				for _, nw := range workers {
					size := fmt.Sprintf("%dMi", n>>20)
					if n < 1<<20 {
						size = fmt.Sprintf("%dKi", n>>10)
					}
					b.Run(fmt.Sprintf("%s/n=%s/%s/workers=%d", v.name, size, k.name, nw), func(b *testing.B) {
						h := v.h
						b.SetBytes(bytes * int64(n))
						b.ReportAllocs()
						cpu0 := cpuSeconds()
						for b.Loop() {
							k.updateSplit(w, g, st, 2, h, nw)
						}
						elems := float64(n) * float64(b.N)
						b.ReportMetric(elems/b.Elapsed().Seconds()/1e9, "Gelem/s")
						if cpu := cpuSeconds() - cpu0; cpu > 0 {
							b.ReportMetric(elems/cpu/1e9, "Gelem/cpu-s")
						}
					})
				}
			}
		}
		free()
	}
}
