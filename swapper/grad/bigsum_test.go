package grad_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/swapper/grad"
)

// TestAccumulateLargeGradientBits: a gradient larger than the caches
// (300 001 float32s, an odd count: the vector kernels' tails) summed over
// three micro-steps through the public API reads back with the bits of
// the plain float32 loop a user would write (the first micro-step plus
// +0, so -0 reads +0; then each next added in order), whatever path the
// sums took (in the pinned buffer, or read back from NVMe and added).
func TestAccumulateLargeGradientBits(t *testing.T) {
	g, _, _ := holdEnvWith(t, 8<<20, grad.Options{})

	const n = 300_001
	if err := g.Register("w", n); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(11, 12))
	want := make([]float32, n)
	ctx := context.Background()
	for micro := range 3 {
		step := make([]float32, n)
		for i := range step {
			switch r.IntN(16) {
			case 0:
				step[i] = float32(math.Copysign(0, -1))
			case 1:
				step[i] = float32(math.Ldexp(1, -140)) // subnormal
			default:
				step[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()*3))
			}
		}
		for i, x := range step {
			if micro == 0 {
				want[i] = x + 0
			} else {
				want[i] = want[i] + x
			}
		}
		if err := g.Accumulate(ctx, "w", step); err != nil {
			t.Fatalf("micro-step %d: %v", micro, err)
		}
	}
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := g.Read(ctx, "w", got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("element %d: read %v (%#08x), the float32 loop gives %v (%#08x)", i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}
