package comm_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/internal/test/commtest"
)

// onRanks runs f on every rank of a fresh local world, each on its own
// goroutine, under a watchdog, and returns each rank's error.
func onRanks(t *testing.T, size int, opts comm.LocalOptions, f func(c comm.Comm) error) []error {
	t.Helper()
	cs, err := comm.NewLocal(size, opts)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(c)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("watchdog: ranks still running after 60s\n%s", buf[:runtime.Stack(buf, true)])
	}
	return errs
}

func counts(rng *rand.Rand, size int) []int {
	c := make([]int, size)
	for r := range c {
		c[r] = rng.IntN(40) // empty chunks too
	}
	return c
}

// TestRandomCollectives runs a seeded random sequence of collectives on
// worlds of 1 to 5 ranks and checks every result against a sequential,
// rank-ordered reference, bit for bit.
func TestRandomCollectives(t *testing.T) {
	for size := 1; size <= 5; size++ {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			seed := uint64(size) * 7919
			// Every rank derives the same plan from the seed; data differs
			// per rank and is derived from (seed, round, rank).
			type step struct {
				kind   int
				counts []int
				n      int
				op     comm.Op
				root   int
			}
			rng := rand.New(rand.NewPCG(seed, 1))
			var plan []step
			for range 60 {
				plan = append(plan, step{kind: rng.IntN(6), counts: counts(rng, size), n: rng.IntN(50), op: comm.Op(rng.IntN(2)), root: rng.IntN(size)})
			}
			data := func(round, rank, n int) []float32 {
				r := rand.New(rand.NewPCG(seed, uint64(round*1000+rank)))
				v := make([]float32, n)
				for i := range v {
					switch r.IntN(20) {
					case 0:
						v[i] = float32(math.Inf(1 - 2*r.IntN(2)))
					case 1:
						v[i] = 1e-40 // subnormal
					default:
						v[i] = (r.Float32() - 0.5) * float32(math.Pow(10, float64(r.IntN(8)-4)))
					}
				}
				return v
			}
			errs := onRanks(t, size, comm.LocalOptions{}, func(c comm.Comm) error {
				ctx := context.Background()
				me := c.Rank()
				for i, s := range plan {
					off, total := comm.Offsets(s.counts)
					switch s.kind {
					case 0: // all-gather
						send := make([]byte, s.counts[me])
						for j := range send {
							send[j] = byte(me*31 + j + i)
						}
						recv := make([]byte, total)
						if err := c.AllGather(ctx, send, recv, s.counts); err != nil {
							return err
						}
						for r := range size {
							for j := range s.counts[r] {
								if recv[off[r]+j] != byte(r*31+j+i) {
									return fmt.Errorf("round %d all-gather: byte %d of rank %d", i, j, r)
								}
							}
						}
					case 1: // reduce-scatter
						send := data(i, me, total)
						recv := make([]float32, s.counts[me])
						if err := c.ReduceScatter(ctx, send, recv, s.counts); err != nil {
							return err
						}
						want := data(i, 0, total)[off[me] : off[me]+s.counts[me]]
						for r := 1; r < size; r++ {
							x := data(i, r, total)[off[me]:]
							for j := range want {
								want[j] = want[j] + x[j]
							}
						}
						if err := same32(recv, want); err != nil {
							return fmt.Errorf("round %d reduce-scatter: %v", i, err)
						}
					case 2: // all-reduce float32
						buf := data(i, me, s.n)
						if err := c.AllReduce(ctx, buf, s.op); err != nil {
							return err
						}
						want := data(i, 0, s.n)
						for r := 1; r < size; r++ {
							for j, x := range data(i, r, s.n) {
								if s.op == comm.Sum {
									want[j] = want[j] + x
								} else {
									want[j] = max(want[j], x)
								}
							}
						}
						if err := same32(buf, want); err != nil {
							return fmt.Errorf("round %d all-reduce %s: %v", i, s.op, err)
						}
					case 3: // all-reduce float64
						buf := []float64{float64(me) + 0.1, float64(i) * float64(me)}
						if err := c.AllReduceFloat64(ctx, buf, s.op); err != nil {
							return err
						}
						want := []float64{0.1, 0}
						for r := 1; r < size; r++ {
							x := []float64{float64(r) + 0.1, float64(i) * float64(r)}
							for j := range want {
								if s.op == comm.Sum {
									want[j] += x[j]
								} else {
									want[j] = max(want[j], x[j])
								}
							}
						}
						if buf[0] != want[0] || buf[1] != want[1] {
							return fmt.Errorf("round %d all-reduce float64 %s: %v, want %v", i, s.op, buf, want)
						}
					case 4: // broadcast
						buf := make([]byte, s.n)
						for j := range buf {
							buf[j] = byte(me + j)
						}
						if err := c.Broadcast(ctx, buf, s.root); err != nil {
							return err
						}
						for j := range buf {
							if buf[j] != byte(s.root+j) {
								return fmt.Errorf("round %d broadcast from %d: byte %d", i, s.root, j)
							}
						}
					case 5:
						if err := c.Barrier(ctx); err != nil {
							return err
						}
					}
				}
				return c.Close()
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

func same32(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d elements, want %d", len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	return nil
}

// TestMaxPropagatesNaN: an overflow check must see a NaN on any rank.
func TestMaxPropagatesNaN(t *testing.T) {
	errs := onRanks(t, 3, comm.LocalOptions{}, func(c comm.Comm) error {
		v := []float32{1}
		w := []float64{1}
		if c.Rank() == 1 {
			v[0], w[0] = float32(math.NaN()), math.NaN()
		}
		if err := c.AllReduce(context.Background(), v, comm.Max); err != nil {
			return err
		}
		if err := c.AllReduceFloat64(context.Background(), w, comm.Max); err != nil {
			return err
		}
		if !math.IsNaN(float64(v[0])) || !math.IsNaN(w[0]) {
			return fmt.Errorf("max with a NaN on rank 1 gave %v, %v", v[0], w[0])
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// wantRankError checks that err is a *RankError naming rank.
func wantRankError(t *testing.T, who int, err error, rank int, cause error) {
	t.Helper()
	var re *comm.RankError
	if !errors.As(err, &re) {
		t.Fatalf("rank %d: want a *comm.RankError, got %v", who, err)
	}
	if re.Rank != rank || (cause != nil && !errors.Is(err, cause)) {
		t.Fatalf("rank %d: error %q names rank %d (cause %v), want rank %d (cause %v)", who, err, re.Rank, re.Err, rank, cause)
	}
}

// TestContextEndsEveryRank: rank 2's context ends while the others wait
// in a collective; every rank returns an error naming rank 2, and later
// collectives fail at once.
func TestContextEndsEveryRank(t *testing.T) {
	errs := onRanks(t, 4, comm.LocalOptions{}, func(c comm.Comm) error {
		ctx := context.Background()
		if c.Rank() == 2 {
			cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			<-cctx.Done() // never arrives in time
			return c.AllReduce(cctx, []float32{1}, comm.Sum)
		}
		if err := c.AllReduce(ctx, []float32{1}, comm.Sum); err == nil {
			return errors.New("all-reduce succeeded without rank 2")
		} else if err2 := c.Barrier(ctx); err2 == nil {
			return errors.New("a barrier after the failure succeeded")
		}
		return c.AllReduce(ctx, []float32{1}, comm.Sum)
	})
	for r, err := range errs {
		wantRankError(t, r, err, 2, context.DeadlineExceeded)
	}
}

// TestAbortAndClose: Abort from one rank (from any goroutine) ends the
// others' collectives naming it; Close while others wait does too.
func TestAbortAndClose(t *testing.T) {
	boom := errors.New("boom: ENOSPC")
	errs := onRanks(t, 3, comm.LocalOptions{}, func(c comm.Comm) error {
		if c.Rank() == 1 {
			time.Sleep(20 * time.Millisecond)
			c.Abort(boom)
			return c.Barrier(context.Background())
		}
		return c.Barrier(context.Background())
	})
	for r, err := range errs {
		wantRankError(t, r, err, 1, boom)
	}
	errs = onRanks(t, 3, comm.LocalOptions{}, func(c comm.Comm) error {
		if c.Rank() == 0 {
			time.Sleep(20 * time.Millisecond)
			c.Close()
			return c.Barrier(context.Background())
		}
		return c.Barrier(context.Background())
	})
	for r, err := range errs {
		wantRankError(t, r, err, 0, comm.ErrClosed)
	}
}

// TestStall: a rank that never arrives is named after the stall timeout.
func TestStall(t *testing.T) {
	release := make(chan struct{})
	errs := onRanks(t, 3, comm.LocalOptions{StallTimeout: 100 * time.Millisecond}, func(c comm.Comm) error {
		if c.Rank() == 2 {
			<-release
			return nil
		}
		err := c.Barrier(context.Background())
		if c.Rank() == 0 {
			close(release)
		}
		return err
	})
	for r, err := range errs[:2] {
		wantRankError(t, r, err, 2, comm.ErrStalled)
	}
}

// TestMismatch: ranks calling different collectives, or the same with
// different counts, fail the world with ErrMismatch instead of hanging or
// mixing buffers.
func TestMismatch(t *testing.T) {
	errs := onRanks(t, 2, comm.LocalOptions{}, func(c comm.Comm) error {
		if c.Rank() == 0 {
			return c.Barrier(context.Background())
		}
		time.Sleep(10 * time.Millisecond)
		return c.AllReduce(context.Background(), []float32{1}, comm.Sum)
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
	errs = onRanks(t, 2, comm.LocalOptions{}, func(c comm.Comm) error {
		cn := []int{1, 2}
		if c.Rank() == 1 {
			time.Sleep(10 * time.Millisecond)
			cn = []int{2, 1}
		}
		_, total := comm.Offsets(cn)
		return c.AllGather(context.Background(), make([]byte, cn[c.Rank()]), make([]byte, total), cn)
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
}

// TestBadArguments are refused on the calling rank before any waiting.
func TestBadArguments(t *testing.T) {
	if _, err := comm.NewLocal(0, comm.LocalOptions{}); err == nil {
		t.Fatal("a world of 0 ranks was accepted")
	}
	cs, err := comm.NewLocal(2, comm.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := cs[0]
	for name, err := range map[string]error{
		"counts length":     c.AllGather(ctx, nil, nil, []int{0}),
		"negative count":    c.AllGather(ctx, nil, nil, []int{-1, 1}),
		"send length":       c.AllGather(ctx, make([]byte, 3), make([]byte, 4), []int{2, 2}),
		"rs recv length":    c.ReduceScatter(ctx, make([]float32, 4), make([]float32, 1), []int{2, 2}),
		"unknown op":        c.AllReduce(ctx, []float32{1}, comm.Op(9)),
		"unknown op f64":    c.AllReduceFloat64(ctx, []float64{1}, comm.Op(9)),
		"root out of range": c.Broadcast(ctx, nil, 2),
		"many: per length":  c.ReduceScatterMany(ctx, nil, nil, []int{0, 0}, []int{1}),
		"many: no vectors":  c.ReduceScatterMany(ctx, nil, nil, []int{0, 0}, []int{0, 0}),
		"many: sends":       c.ReduceScatterMany(ctx, nil, make([]float32, 1), []int{1, 1}, []int{1, 1}),
		"many: vector len":  c.ReduceScatterMany(ctx, [][]float32{make([]float32, 3)}, make([]float32, 1), []int{1, 1}, []int{1, 1}),
		"many: negative":    c.ReduceScatterMany(ctx, nil, make([]float32, 1), []int{1, 1}, []int{-1, 2}),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c.Close()
	if err := c.Barrier(ctx); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("barrier on a closed comm: %v", err)
	}
}

// TestLocalConformance runs the shared contract check (the one the MPI
// world runs under mpirun) on in-process worlds of 1 to 5 ranks, with
// several vectors per rank, in-place gathers and signed zeros.
func TestLocalConformance(t *testing.T) {
	for size := 1; size <= 5; size++ {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			errs := onRanks(t, size, comm.LocalOptions{}, func(c comm.Comm) error {
				return commtest.Conformance(context.Background(), c, commtest.Options{Seed: uint64(size) * 104729, Rounds: 120})
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}
