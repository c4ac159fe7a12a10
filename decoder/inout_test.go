package decoder_test

import (
	"fmt"
	"testing"

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
		tr := inOutModel(t, m, typ)
		ps := prompts(3, 6, c.Vocab)
		want, _ := run(t, m, ps, 3, false)
		label := fmt.Sprintf("%v ", typ)
		got := runOnPools(t, label, tr, ps, 3, kernels.Kernels(), 1, 3)
		requireClose(t, label, got, want, 1e-5, [2]string{"in-out", "out-in"})
	}
}
