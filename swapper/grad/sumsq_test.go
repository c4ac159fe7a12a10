package grad

import (
	"errors"
	"math"
	"strings"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/internal/test/faults"
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

// TestReportedFailureFreesMemory: a gradient whose write-behind failed
// keeps its pinned copy; once an optimizer's ReadRange (an overlapped
// step) has reported the failure, the copy waits for Flush. Another
// gradient that needs that memory must not wait for it forever: acquire
// writes the copy again, and gets the memory when space has returned, or
// returns the new failure while it has not.
func TestReportedFailureFreesMemory(t *testing.T) {
	const n = 3000 // 12000 bytes: the pool holds one such buffer at a time
	e, s := newEnvPool(t, testBackends(t)[0], true, Options{}, 16<<10)
	ctx := testCtx(t)
	for _, name := range []string{"a", "b"} {
		if err := s.Register(name, n); err != nil {
			t.Fatal(err)
		}
	}
	e.inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC})
	if err := s.Accumulate(ctx, "a", grads(1, n)); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, s.RangeBufferBytes(0, n))
	if _, err := s.ReadRange(ctx, "a", 0, n, dst); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("ReadRange after a failed write-behind: %v", err)
	}
	// The disk is still full: b cannot have the memory, and says why.
	err := s.Accumulate(ctx, "b", grads(2, n))
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "failed write-behind keeps its gradient") {
		t.Fatalf("Accumulate with the memory held by a failed gradient: %v", err)
	}
	e.inj.Clear()
	if err := s.Accumulate(ctx, "b", grads(2, n)); err != nil {
		t.Fatalf("after space returned: %v", err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for name, seed := range map[string]uint64{"a": 1, "b": 2} {
		got := make([]float32, n)
		if err := s.Read(ctx, name, got); err != nil {
			t.Fatal(err)
		}
		sameBits(t, name, got, grads(seed, n))
	}
}
