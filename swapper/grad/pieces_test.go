package grad_test

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/grad"
)

// TestPieces: a gradient kept in pieces (Options.PieceElems) accumulates —
// whole, and in spans crossing piece edges — to exactly the sums of a
// gradient kept whole, in a pool that holds one piece and not the
// gradient (PinnedNeedBytes says so); ranges within a piece read what
// the whole one reads; a range across two pieces is refused; SumSquares
// is the whole gradient's, bit for bit, after spans and after a whole
// accumulation.
func TestPieces(t *testing.T) {
	ctx := context.Background()
	const n, pe = 10_000, 2048
	st := openStore(t, 2, true)
	ref, err := grad.New(grad.Options{Store: st, Pool: newPool(t, 1<<20), KeyPrefix: "ref/", SumSquares: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	opts := grad.Options{Store: st, PieceElems: pe, SumSquares: true}
	need := grad.PinnedNeedBytes(opts, []int{n}, grad.BlockBytes(nil))
	if need >= 4*n {
		t.Fatalf("PinnedNeedBytes %d is not below the gradient's %d bytes", need, 4*n)
	}
	gran := 4096
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: buffers.SpanBytes(need, gran), MinBufferBytes: gran, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	opts.Pool = pool
	pc, err := grad.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for _, s := range []*grad.Swapper{ref, pc} {
		if err := s.Register("w", n); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for micro := range 4 {
		g := randGrad(rng, n)
		if micro%2 == 0 {
			for _, s := range []*grad.Swapper{ref, pc} {
				if err := s.Accumulate(ctx, "w", g); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		spans := []grad.Span{{Lo: 7, Hi: 2050}, {Lo: 3000, Hi: 3001}, {Lo: 4095, Hi: 8193}, {Lo: 9999, Hi: 10_000}}
		var vals []float32
		full := make([]float32, n)
		for _, sp := range spans {
			vals = append(vals, g[sp.Lo:sp.Hi]...)
			copy(full[sp.Lo:sp.Hi], g[sp.Lo:sp.Hi])
		}
		if err := pc.AccumulateSpans(ctx, "w", spans, vals); err != nil {
			t.Fatal(err)
		}
		if err := ref.Accumulate(ctx, "w", full); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*grad.Swapper{ref, pc} {
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	a, b := make([]float32, n), make([]float32, n)
	if err := ref.Read(ctx, "w", a); err != nil {
		t.Fatal(err)
	}
	if err := pc.Read(ctx, "w", b); err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("element %d: %v whole, %v in pieces", i, a[i], b[i])
		}
	}
	want, _ := ref.SumSquares("w")
	if got, _ := pc.SumSquares("w"); got != want {
		t.Fatalf("SumSquares %v in pieces, %v whole (the last accumulation missed pieces: summed again)", got, want)
	}
	// A whole gradient added last: the sum runs on through the pieces.
	g := randGrad(rng, n)
	for _, s := range []*grad.Swapper{ref, pc} {
		if err := s.Accumulate(ctx, "w", g); err != nil {
			t.Fatal(err)
		}
	}
	want, _ = ref.SumSquares("w")
	if got, _ := pc.SumSquares("w"); got != want {
		t.Fatalf("after a whole accumulation: SumSquares %v in pieces, %v whole", got, want)
	}
	if err := ref.Read(ctx, "w", a); err != nil {
		t.Fatal(err)
	}
	lo, hi := 2*pe+5, 3*pe
	buf, err := pool.Acquire(ctx, pc.RangeBufferBytes(lo, hi), buffers.PurposeGradients)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pc.ReadRange(ctx, "w", lo, hi, buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range got {
		if math.Float32bits(x) != math.Float32bits(a[lo+i]) {
			t.Fatalf("ranged read element %d differs", lo+i)
		}
	}
	if _, err := pc.ReadRange(ctx, "w", pe-1, pe+1, buf.Bytes()); err == nil || !strings.Contains(err.Error(), "pieces") {
		t.Fatalf("a range across two pieces: %v", err)
	}
	buf.Release()
}
