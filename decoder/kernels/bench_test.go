package kernels

import (
	"errors"
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

// BenchmarkLayerProducts runs the seven products of a decoder layer of
// the 400 M llama make bench-llamacpp measures (dim 1024, FFN 3072:
// queries, keys, values and output 1024 x 1024, gate and up 3072 x 1024,
// down 1024 x 3072) over 8 copies of the layer's weights (bf16: 200 MB,
// past the last level cache), as the decoder issues them: "separate" is
// one MatMul a product, "shared" one MatMuls for the queries, keys and
// values and one for the gate and up. GB/s is the weights' bytes read a
// second, to set beside BenchmarkMemoryRead's.
func BenchmarkLayerProducts(b *testing.B) {
	const dim, ffn, layers = 1024, 3072, 8
	for _, t := range []DType{F32, BF16, Q8_0} {
		rng := rand.New(rand.NewPCG(7, uint64(t)))
		shapes := [7][2]int{{dim, dim}, {dim, dim}, {dim, dim}, {dim, dim}, {ffn, dim}, {ffn, dim}, {dim, ffn}}
		var one [7]Matrix
		for i, s := range shapes {
			one[i] = randMatrix(rng, t, s[0], s[1])
		}
		ws := make([][7]Matrix, layers)
		var bytes int64
		for l := range ws {
			for i, m := range one {
				m.Data = append([]byte(nil), m.Data...)
				ws[l][i] = m
				bytes += int64(len(m.Data))
			}
		}
		for _, batch := range []int{1, 4} {
			x := randVec(rng, batch*ffn)
			var ys [7][]float32
			for i, s := range shapes {
				ys[i] = make([]float32, batch*s[0])
			}
			for _, mode := range []string{"separate", "shared"} {
				b.Run(fmt.Sprintf("%v/batch=%d/%s", t, batch, mode), func(b *testing.B) {
					p, err := NewPool(Options{})
					if err != nil {
						b.Fatal(err)
					}
					defer p.Close()
					b.SetBytes(bytes)
					xd, xf := x[:batch*dim], x[:batch*ffn]
					for b.Loop() {
						for l := range ws {
							w := &ws[l]
							var err error
							if mode == "shared" {
								err = errors.Join(p.MatMuls(ys[:3], w[:3], xd, batch), p.MatMul(ys[3], w[3], xd, batch),
									p.MatMuls(ys[4:6], w[4:6], xd, batch), p.MatMul(ys[6], w[6], xf, batch))
							} else {
								for i := range w {
									xi := xd
									if i == 6 {
										xi = xf
									}
									err = errors.Join(err, p.MatMul(ys[i], w[i], xi, batch))
								}
							}
							if err != nil {
								b.Fatal(err)
							}
						}
					}
					b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}
