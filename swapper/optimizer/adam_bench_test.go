package optimizer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// BenchmarkAdam measures the update rule alone, in elements per second
// (Gelem/s), elements per CPU-second of the process (Gelem/cpu-s: per
// core, whatever share of the machine other processes take; Linux) and
// bytes touched per second (16 read and 12 written per element), on every
// kernel of this CPU, at 16 Mi and 64 Mi elements (64
// Ki and 256 Ki under -short), with p, m, v and g where a step's buffer
// puts them:
//
//   - packed: master, exp_avg and exp_avg_sq back to back and the gradient
//     on the next page, the record layout before the stagger (at 64 Mi
//     elements the four operands start exactly 2^28 bytes apart);
//   - staggered: LayoutFor(n), the layout records have now.
//
// workers=1 is one core; workers=GOMAXPROCS splits each update as the
// step does (Options.UpdateWorkers). The buffer comes from mmap (page
// aligned, like the pool's); with ZINF_BENCH_HUGEPAGES=1 it is advised
// onto transparent huge pages, where addresses 2^28 apart share cache
// sets in every level.
func BenchmarkAdam(b *testing.B) {
	sizes := []int{16 << 20, 64 << 20}
	if testing.Short() {
		sizes = []int{1 << 16, 1 << 18}
	}
	workers := []int{1}
	if w := runtime.GOMAXPROCS(0); w > 1 && !testing.Short() {
		workers = append(workers, w)
	}
	kernels := append([]*kernel{scalarKernel}, simdKernels...)
	for _, n := range sizes {
		lay := LayoutFor(n)
		packedGrad := roundUp(12*int64(n), staggerPage) / 4
		staggeredGrad := roundUp(lay.Bytes, staggerPage) / 4
		words := max(packedGrad, staggeredGrad) + int64(n)
		mem, free := benchMemory(b, int(words))
		r := rand.New(rand.NewPCG(1, uint64(n)))
		for i := range mem {
			mem[i] = float32(r.NormFloat64()) // no zeros, no subnormals
		}
		for _, layout := range []string{"packed", "staggered"} {
			var p, m, v, g []float32
			if layout == "packed" {
				p, m, v, g = mem[:n], mem[n:2*n], mem[2*n:3*n], mem[packedGrad:packedGrad+int64(n)]
			} else {
				p, m, v = lay.states(mem)
				g = mem[staggeredGrad : staggeredGrad+int64(n)]
			}
			for i := range v {
				v[i] = float32(math.Abs(float64(v[i])))
			}
			for _, k := range kernels {
				for _, w := range workers {
					name := fmt.Sprintf("n=%dMi/%s/%s/workers=%d", n>>20, layout, k.name, w)
					if n < 1<<20 {
						name = fmt.Sprintf("n=%dKi/%s/%s/workers=%d", n>>10, layout, k.name, w)
					}
					b.Run(name, func(b *testing.B) {
						a := newAdamArgs(1, Hyper{})
						b.SetBytes(28 * int64(n))
						b.ReportAllocs()
						cpu0 := cpuSeconds()
						for b.Loop() {
							k.adamSplit(p, g, m, v, &a, w)
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
