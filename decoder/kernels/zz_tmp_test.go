package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func BenchmarkZZSmall(b *testing.B) {
	for _, t := range []DType{F32, BF16, Q8_0} {
		for _, sh := range [][2]int{{1024, 1024}, {3072, 1024}, {1024, 3072}} {
			for _, workers := range []int{1, 2} {
				b.Run(fmt.Sprintf("%v/%dx%d/w%d", t, sh[0], sh[1], workers), func(b *testing.B) {
					var ws []Matrix
					for i := range 24 {
						ws = append(ws, randMatrix(rand.New(rand.NewPCG(uint64(i), 1)), t, sh[0], sh[1]))
					}
					x := randVec(rand.New(rand.NewPCG(2, 3)), sh[1])
					y := make([]float32, sh[0])
					p, _ := NewPool(Options{Workers: workers})
					defer p.Close()
					b.SetBytes(int64(len(ws[0].Data)))
					i := 0
					for b.Loop() {
						p.MatMul(y, ws[i%24], x, 1)
						i++
					}
				})
			}
		}
	}
}
