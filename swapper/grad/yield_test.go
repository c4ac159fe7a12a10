package grad

import (
	"math"
	"testing"

	"github.com/zinfio/zinf/internal/base/yield"
)

// TestSumsWhileComputing: with compute marked (package yield) the sums
// run in chunks with yield points between them; the accumulated gradient
// and its sum of squares keep their bits.
func TestSumsWhileComputing(t *testing.T) {
	yield.Begin()
	defer yield.End()
	const n = 3*chunkElems + 77
	for _, sumSq := range []bool{false, true} {
		ctx := testCtx(t)
		_, s := newEnv(t, testBackends(t)[0], true, Options{SumSquares: sumSq})
		if err := s.Register("w", n); err != nil {
			t.Fatal(err)
		}
		var steps [][]float32
		for k := range 3 {
			steps = append(steps, grads(uint64(40+k), n))
			if err := s.Accumulate(ctx, "w", steps[k]); err != nil {
				t.Fatal(err)
			}
		}
		got := make([]float32, n)
		if err := s.Read(ctx, "w", got); err != nil {
			t.Fatal(err)
		}
		want := reference(steps...)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("sum-squares %v: element %d is %v, want %v", sumSq, i, got[i], want[i])
			}
		}
		if sumSq {
			v, err := s.SumSquares("w")
			if err != nil {
				t.Fatal(err)
			}
			if w := refSumSq(want); math.Float64bits(v) != math.Float64bits(w) {
				t.Fatalf("sum of squares %v, want %v", v, w)
			}
		}
	}
}
