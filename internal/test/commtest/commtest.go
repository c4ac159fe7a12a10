// Package commtest checks a comm.Comm implementation against the
// contract: every rank of a world runs the same seeded sequence of
// collectives and checks its own results against a sequential,
// rank-ordered reference it computes from the seed, bit for bit. The
// in-process world runs it on goroutines, the MPI world under mpirun.
package commtest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/zinfio/zinf/comm"
)

// Options shape a Conformance run.
type Options struct {
	// Seed picks the sequence; every rank must use the same.
	Seed uint64
	// Rounds is the number of collectives (default 80).
	Rounds int
	// MaxCount bounds each rank's chunk, in elements (default 40). Large
	// values exercise an implementation's segmentation.
	MaxCount int
	// Native: reductions are the library's own (not rank-ordered), so
	// sums are compared within a tolerance instead of bit for bit.
	Native bool
	// Trace, when set, is told each round before it runs.
	Trace func(round int, what string)
}

// Data is the vector rank contributes to round (and, for
// ReduceScatterMany, its vector k): infinities, subnormals, signed zeros
// and values over eight decades, so that a sum in another order
// differs.
func Data(seed uint64, round, rank, k, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, uint64(round)<<32|uint64(rank)<<16|uint64(k)))
	v := make([]float32, n)
	for i := range v {
		switch r.IntN(40) {
		case 0:
			v[i] = float32(math.Inf(1 - 2*r.IntN(2)))
		case 1:
			v[i] = 1e-40 // subnormal
		case 2:
			v[i] = float32(math.Copysign(0, -1))
		default:
			v[i] = (r.Float32() - 0.5) * float32(math.Pow(10, float64(r.IntN(8)-4)))
		}
	}
	return v
}

// Conformance runs the sequence on c and returns the first result that
// differs from the reference (or the first error).
func Conformance(ctx context.Context, c comm.Comm, o Options) error {
	if o.Rounds == 0 {
		o.Rounds = 80
	}
	if o.MaxCount == 0 {
		o.MaxCount = 40
	}
	size, me := c.Size(), c.Rank()
	rng := rand.New(rand.NewPCG(o.Seed, 1))
	counts := func() []int {
		cs := make([]int, size)
		for r := range cs {
			if rng.IntN(4) > 0 { // empty chunks too
				cs[r] = rng.IntN(o.MaxCount + 1)
			}
		}
		return cs
	}
	for i := range o.Rounds {
		kind := rng.IntN(8)
		cs := counts()
		n := rng.IntN(o.MaxCount + 1)
		op := comm.Op(rng.IntN(2))
		root := rng.IntN(size)
		per := make([]int, size)
		for r := range per {
			per[r] = rng.IntN(3)
		}
		per[rng.IntN(size)]++ // at least one vector
		off, total := comm.Offsets(cs)
		if o.Trace != nil {
			o.Trace(i, fmt.Sprintf("kind %d counts %v n %d op %v root %d per %v", kind, cs, n, op, root, per))
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("round %d (%s): %s", i, []string{"all-gather", "all-gather in place", "reduce-scatter",
				"reduce-scatter-many", "all-reduce", "all-reduce float64", "broadcast", "barrier"}[kind], fmt.Sprintf(format, args...))
		}
		switch kind {
		case 0, 1:
			recv := make([]byte, total)
			for j := range recv {
				recv[j] = 0xEE
			}
			send := make([]byte, cs[me])
			if kind == 1 {
				send = recv[off[me] : off[me]+cs[me]]
			}
			for j := range send {
				send[j] = byte(me*31 + j + i)
			}
			if err := c.AllGather(ctx, send, recv, cs); err != nil {
				return fail("%v", err)
			}
			for r := range size {
				for j := range cs[r] {
					if recv[off[r]+j] != byte(r*31+j+i) {
						return fail("byte %d of rank %d is %#x, want %#x", j, r, recv[off[r]+j], byte(r*31+j+i))
					}
				}
			}
		case 2, 3:
			var sends [][]float32
			p := per
			if kind == 2 {
				p = make([]int, size)
				for r := range p {
					p[r] = 1
				}
			}
			for k := range p[me] {
				sends = append(sends, Data(o.Seed, i, me, k, total))
			}
			recv := make([]float32, cs[me])
			var err error
			if kind == 2 {
				err = c.ReduceScatter(ctx, sends[0], recv, cs)
			} else {
				err = c.ReduceScatterMany(ctx, sends, recv, cs, p)
			}
			if err != nil {
				return fail("%v", err)
			}
			var want []float32
			for r := range size {
				for k := range p[r] {
					x := Data(o.Seed, i, r, k, total)[off[me] : off[me]+cs[me]]
					if want == nil {
						want = x
						continue
					}
					for j := range want {
						want[j] = want[j] + x[j]
					}
				}
			}
			if err := same32(recv, want, o.Native); err != nil {
				return fail("%v", err)
			}
		case 4:
			buf := Data(o.Seed, i, me, 0, n)
			if err := c.AllReduce(ctx, buf, op); err != nil {
				return fail("%v", err)
			}
			want := Data(o.Seed, i, 0, 0, n)
			for r := 1; r < size; r++ {
				for j, x := range Data(o.Seed, i, r, 0, n) {
					if op == comm.Sum {
						want[j] = want[j] + x
					} else {
						want[j] = max32(want[j], x)
					}
				}
			}
			if err := same32(buf, want, o.Native && op == comm.Sum); err != nil {
				return fail("%s: %v", op, err)
			}
		case 5:
			val := func(r, j int) float64 { return float64(r)*0.1 + float64(i*j)*1e-7 }
			buf := make([]float64, n)
			for j := range buf {
				buf[j] = val(me, j)
			}
			if err := c.AllReduceFloat64(ctx, buf, op); err != nil {
				return fail("%v", err)
			}
			for j := range buf {
				want := val(0, j)
				for r := 1; r < size; r++ {
					if op == comm.Sum {
						want += val(r, j)
					} else {
						want = max(want, val(r, j))
					}
				}
				if buf[j] != want && !(o.Native && op == comm.Sum && math.Abs(buf[j]-want) <= 1e-12*math.Abs(want)) {
					return fail("%s: [%d] = %v, want %v", op, j, buf[j], want)
				}
			}
		case 6:
			buf := make([]byte, n*5)
			for j := range buf {
				buf[j] = byte(me + j)
			}
			if err := c.Broadcast(ctx, buf, root); err != nil {
				return fail("%v", err)
			}
			for j := range buf {
				if buf[j] != byte(root+j) {
					return fail("from %d: byte %d is %d", root, j, buf[j])
				}
			}
		case 7:
			if err := c.Barrier(ctx); err != nil {
				return fail("%v", err)
			}
		}
	}
	return nil
}

func max32(a, b float32) float32 {
	if a != a || b != b {
		return float32(math.NaN())
	}
	return max(a, b)
}

// same32 compares bit for bit, or within a relative tolerance (and with
// the same infinities and NaNs) when loose.
func same32(got, want []float32, loose bool) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d elements, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if math.Float32bits(g) == math.Float32bits(w) {
			continue
		}
		if loose {
			if g != g && w != w || g == w {
				continue
			}
			if !math.IsInf(float64(w), 0) && math.Abs(float64(g-w)) <= 1e-3*math.Max(math.Abs(float64(w)), 1e-30) {
				continue
			}
		}
		return fmt.Errorf("[%d] = %v (%#08x), want %v (%#08x)", i, g, math.Float32bits(g), w, math.Float32bits(w))
	}
	return nil
}
