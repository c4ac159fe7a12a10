package grad

import (
	"errors"
	"math"
	"testing"
)

// refSumSq is the documented order, written out again: float64, index
// order, one rounding per addition.
func refSumSq(v []float32) float64 {
	var s float64
	for _, x := range v {
		d := float64(x)
		s = s + float64(d*d)
	}
	return s
}

// TestSumSquares checks the sum of squares the swapper keeps for the
// global gradient norm, after one and several micro-steps, on the
// pinned-copy and the read-modify-write paths (a Flush between
// micro-steps gives the pinned copy back, so the next one reads the sum
// from the store), kept in memory and without a store; that it costs no
// store read beyond the read-modify-write itself; that Zero resets it and
// an inf shows.
func TestSumSquares(t *testing.T) {
	const n = 4099
	for _, tc := range []struct {
		name      string
		store     bool
		keep      int64
		flushEach bool
	}{{"store-pinned-copy", true, 0, false}, {"store-read-modify-write", true, 0, true}, {"kept", true, 1 << 20, false}, {"no-store", false, 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			_, s := newEnv(t, testBackends(t)[0], tc.store, Options{SumSquares: true, KeepInCPUBytes: tc.keep})
			if err := s.Register("w", n); err != nil {
				t.Fatal(err)
			}
			if err := s.Register("empty", 0); err != nil {
				t.Fatal(err)
			}
			if v, err := s.SumSquares("w"); err != nil || v != 0 {
				t.Fatalf("before any gradient: %v, %v", v, err)
			}
			var steps [][]float32
			for k := range 3 {
				steps = append(steps, grads(uint64(10+k), n))
				if err := s.Accumulate(ctx, "w", steps[k]); err != nil {
					t.Fatal(err)
				}
				readsBefore := s.Stats().Reads
				got, err := s.SumSquares("w")
				if err != nil {
					t.Fatal(err)
				}
				if want := refSumSq(reference(steps...)); math.Float64bits(got) != math.Float64bits(want) {
					t.Fatalf("after %d micro-steps: %v, want %v", k+1, got, want)
				}
				if s.Stats().Reads != readsBefore {
					t.Fatal("SumSquares read the store")
				}
				if tc.flushEach {
					if err := s.Flush(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.flushEach && s.Stats().Reads == 0 {
				t.Fatal("the read-modify-write path did not run")
			}
			if v, err := s.SumSquares("empty"); err != nil || v != 0 {
				t.Fatalf("empty partition: %v, %v", v, err)
			}
			if err := s.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			s.Zero()
			if v, _ := s.SumSquares("w"); v != 0 {
				t.Fatalf("after Zero: %v", v)
			}
			g := grads(99, n)
			g[n-1] = float32(math.Inf(-1))
			if err := s.Accumulate(ctx, "w", g); err != nil {
				t.Fatal(err)
			}
			if v, _ := s.SumSquares("w"); !math.IsInf(v, 1) {
				t.Fatalf("with an inf gradient: %v", v)
			}
			if _, err := s.SumSquares("nope"); !errors.Is(err, ErrUnknown) {
				t.Fatalf("unknown tensor: %v", err)
			}
		})
	}
	_, s := newEnv(t, testBackends(t)[0], false, Options{})
	if err := s.Register("w", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SumSquares("w"); err == nil {
		t.Fatal("SumSquares without Options.SumSquares succeeded")
	}
}
