package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

// The benchmarks report the weight bytes a product reads (SetBytes), so
// go test -bench gives MB/s to compare with BenchmarkMemoryRead, the
// machine's bandwidth for a plain SIMD sum over 256 MiB. Products run on a
// pool of GOMAXPROCS workers.

var benchShapes = []struct{ rows, cols int }{{2048, 8192}, {8192, 2048}}

var (
	benchMu      sync.Mutex
	benchWeights = map[string]Matrix{}
)

// benchMatrix returns a cached random matrix, so that every benchmark of
// a shape reads the same bytes.
func benchMatrix(t DType, rows, cols int) Matrix {
	benchMu.Lock()
	defer benchMu.Unlock()
	key := fmt.Sprint(t, rows, cols)
	if m, ok := benchWeights[key]; ok {
		return m
	}
	m := randMatrix(rand.New(rand.NewPCG(1, uint64(t))), t, rows, cols)
	benchWeights[key] = m
	return m
}

func BenchmarkMatMul(b *testing.B) {
	for _, sh := range benchShapes {
		for _, t := range allTypes {
			for _, batch := range []int{1, 4} {
				for _, kn := range Kernels() {
					name := fmt.Sprintf("%dx%d/%v/batch=%d/%s", sh.rows, sh.cols, t, batch, kn)
					b.Run(name, func(b *testing.B) {
						w := benchMatrix(t, sh.rows, sh.cols)
						x := randVec(rand.New(rand.NewPCG(2, 3)), batch*sh.cols)
						y := make([]float32, batch*sh.rows)
						p, err := NewPool(Options{Kernel: kn})
						if err != nil {
							b.Fatal(err)
						}
						defer p.Close()
						b.SetBytes(int64(len(w.Data)))
						b.ReportAllocs()
						for b.Loop() {
							if err := p.MatMul(y, w, x, batch); err != nil {
								b.Fatal(err)
							}
						}
					})
				}
			}
		}
	}
}

// BenchmarkMemoryRead sums a 256 MiB []float32 with the SIMD of the
// products, split over 1 and over GOMAXPROCS goroutines: the bandwidth
// the products' figures are a share of.
func BenchmarkMemoryRead(b *testing.B) {
	data := make([]float32, 256<<20/4)
	for i := range data {
		data[i] = float32(i & 0xff)
	}
	for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			b.SetBytes(int64(4 * len(data)))
			sums := make([]float32, workers)
			var wg sync.WaitGroup
			for b.Loop() {
				for i := range workers {
					part := data[len(data)*i/workers/Lanes*Lanes : len(data)*(i+1)/workers/Lanes*Lanes]
					wg.Go(func() { sums[i] = sumF32(part) })
				}
				wg.Wait()
			}
		})
	}
}

// BenchmarkMatMulInOut is BenchmarkMatMul's shapes stored in features by
// out features (MatMulInOut), f32 and bf16, and the output head of
// make demo-generate's model (dim 32 in, cl100k's 100277 tokens out).
func BenchmarkMatMulInOut(b *testing.B) {
	for _, sh := range append(benchShapes, struct{ rows, cols int }{32, 100277}) {
		for _, t := range []DType{F32, BF16} {
			for _, batch := range []int{1, 4} {
				for _, kn := range Kernels() {
					name := fmt.Sprintf("%dx%d/%v/batch=%d/%s", sh.rows, sh.cols, t, batch, kn)
					b.Run(name, func(b *testing.B) {
						if kn == KernelScalar && testing.Short() {
							b.Skip("the scalar kernel under -short")
						}
						w := benchMatrix(t, sh.rows, sh.cols) // rows inputs, cols outputs
						x := randVec(rand.New(rand.NewPCG(2, 3)), batch*sh.rows)
						y := make([]float32, batch*sh.cols)
						p, err := NewPool(Options{Kernel: kn})
						if err != nil {
							b.Fatal(err)
						}
						defer p.Close()
						b.SetBytes(int64(len(w.Data)))
						b.ReportAllocs()
						for b.Loop() {
							if err := p.MatMulInOut(y, w, x, batch); err != nil {
								b.Fatal(err)
							}
						}
					})
				}
			}
		}
	}
}
