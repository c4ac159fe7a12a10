package decoder_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// TestInOutKernelsAgree: a model of in-out weights (the zoo's layout),
// f32 and bf16, gives the same bits on every kernel the machine has (the
// in-out products' SIMD kernels against their scalar reference) and on
// one worker or three, prefill and decoding steps alike, and stays within
// float32 rounding of the same weights stored out by in.
func TestInOutKernelsAgree(t *testing.T) {
	c := llama()
	c.Vocab, c.Dim, c.FFNDim, c.HeadDim = 600, 128, 520, 32 // 520: an 8-column tile past the wide ones
	for _, typ := range []kernels.DType{kernels.F32, kernels.BF16} {
		m := randomModel(t, c, 31).as(t, typ)
		ci := c
		ci.Layout, ci.HeadLayout = decoder.InOut, decoder.InOut
		tr := &model{c: ci, vals: map[decoder.Name][]float32{}}
		for n, v := range m.vals {
			shape := c.Shape(n.Role)
			if len(shape) == 2 && n.Role != decoder.Embedding {
				rows, cols := shape[0], shape[1]
				w := make([]float32, len(v))
				for r := range rows {
					for k := range cols {
						w[k*rows+r] = v[r*cols+k]
					}
				}
				v = w
			}
			tr.vals[n] = v
		}
		tr = tr.as(t, typ)
		ps := prompts(3, 6, c.Vocab)
		want, _ := run(t, m, ps, 3, false)
		var got [][][]float32
		var runs []string
		for _, kn := range kernels.Kernels() {
			for _, w := range []int{1, 3} {
				pool, err := kernels.NewPool(kernels.Options{Workers: w, Kernel: kn})
				if err != nil {
					t.Fatal(err)
				}
				out, _ := run(t, tr, ps, 3, false, pool)
				pool.Close()
				got = append(got, out)
				runs = append(runs, fmt.Sprintf("kernel %s, %d workers", kn, w))
			}
		}
		for s := range want {
			for i := 1; i < len(got); i++ {
				if !slices.Equal(got[0][s], got[i][s]) {
					t.Fatalf("%v step %d: %s %v, %s %v", typ, s, runs[0], got[0][s][:4], runs[i], got[i][s][:4])
				}
			}
			scale := 1.0
			for _, v := range want[s] {
				scale = max(scale, math.Abs(float64(v)))
			}
			for i := range want[s] {
				if e := math.Abs(float64(got[0][s][i]-want[s][i])) / scale; e > 1e-5 {
					t.Fatalf("%v step %d logit %d: in-out %v, out-in %v (relative error %.3g)", typ, s, i, got[0][s][i], want[s][i], e)
				}
			}
		}
	}
}
