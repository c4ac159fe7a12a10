//go:build mpi && cgo

package comm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/internal/test/commtest"
)

// TestMPIRank is one rank of a job TestMPI launches under mpirun; the
// case is in ZINF_MPI_CASE. Each rank prints "RANK <r> OK" or
// "RANK <r> ERROR <error>", which the launching test reads.
func TestMPIRank(t *testing.T) {
	kase := os.Getenv("ZINF_MPI_CASE")
	if kase == "" {
		t.Skip("run by TestMPI under mpirun")
	}
	opts := comm.MPIOptions{StallTimeout: 30 * time.Second, SegmentBytes: 4 * 13, NativeReductions: kase == "native"}
	switch kase {
	case "stop":
		// A stopped rank is named once it has been silent for 2 s.
		opts.HeartbeatInterval, opts.HeartbeatTimeout = 100*time.Millisecond, 2*time.Second
	case "stress":
		opts.SegmentBytes = 4 * 1021 // several segments per chunk, not thousands
	case "bench":
		opts.SegmentBytes = 0 // the default
		if v := os.Getenv("ZINF_MPI_BENCH_POLL_MAX"); v != "" {
			opts.PollMax, _ = time.ParseDuration(v)
			opts.PollMin = min(opts.PollMin, opts.PollMax)
		}
	}
	c, err := comm.NewMPI(opts)
	if err != nil {
		t.Fatalf("NewMPI: %v", err)
	}
	err = runCase(kase, c)
	line := fmt.Sprintf("RANK %d OK\n", c.Rank())
	if err != nil {
		line = fmt.Sprintf("RANK %d ERROR %v\n", c.Rank(), err)
	}
	// Also into a file of its own: mpirun may drop a rank's output when
	// it ends a job that a rank failed.
	fmt.Print(line)
	if dir := os.Getenv("ZINF_MPI_OUT"); dir != "" {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d", c.Rank())), []byte(line), 0o644)
	}
	if cerr := c.Close(); cerr != nil && err == nil {
		t.Fatalf("rank %d: close: %v", c.Rank(), cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func runCase(kase string, c comm.Comm) error {
	ctx := context.Background()
	me := c.Rank()
	switch kase {
	case "conformance":
		// Chunks up to 200 elements, segments of 13: the reduce-scatter
		// runs in many rounds.
		return commtest.Conformance(ctx, c, commtest.Options{Seed: uint64(c.Size()) * 7919, Rounds: 150, MaxCount: 200, Trace: trace(me)})
	case "stress":
		// Chunks up to 100000 elements in segments of 1021 elements,
		// 600 rounds, a seed per run.
		seed, _ := strconv.ParseUint(os.Getenv("ZINF_MPI_SEED"), 10, 64)
		return commtest.Conformance(ctx, c, commtest.Options{Seed: seed, Rounds: 600, MaxCount: 100000})
	case "bench":
		return benchCollectives(ctx, c)
	case "native":
		return commtest.Conformance(ctx, c, commtest.Options{Seed: 42, Rounds: 60, MaxCount: 200, Native: true})
	case "abort":
		// Rank 1 fails after two collectives; the others are in the third.
		for i := range 3 {
			if me == 1 && i == 2 {
				time.Sleep(200 * time.Millisecond)
				c.Abort(fmt.Errorf("disk full on rank 1: %w", syscall.ENOSPC))
				return c.Barrier(ctx)
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		return errors.New("the third barrier completed without rank 1")
	case "kill":
		// Rank 1 dies (SIGKILL: no note, no exit path) while the others
		// wait for it in an all-reduce.
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if me == 1 {
			time.Sleep(200 * time.Millisecond)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		t0 := time.Now()
		err := c.AllReduce(ctx, []float32{1}, comm.Sum)
		return fmt.Errorf("after %v: %w", time.Since(t0).Round(time.Millisecond), err)
	case "stop":
		// Rank 1 stops (SIGSTOP: its process is there, but nothing of
		// it runs, heartbeats included) while the others wait for it in
		// an all-reduce; the liveness check by PID sees a live process.
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if me == 1 {
			time.Sleep(200 * time.Millisecond)
			syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			return errors.New("rank 1 was continued")
		}
		t0 := time.Now()
		err := c.AllReduce(ctx, []float32{1}, comm.Sum)
		return fmt.Errorf("after %v: %w", time.Since(t0).Round(time.Millisecond), err)
	case "context":
		// Rank 0's context ends while the others wait.
		if me == 0 {
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			<-cctx.Done()
			return c.Barrier(cctx)
		}
		return c.Barrier(ctx)
	}
	return fmt.Errorf("unknown case %q", kase)
}

func trace(me int) func(int, string) {
	if os.Getenv("ZINF_MPI_TRACE") == "" {
		return nil
	}
	return func(i int, what string) { fmt.Fprintf(os.Stderr, "rank %d round %d: %s\n", me, i, what) }
}

// benchCollectives times the binding's all-gather and reduce-scatter
// against MPI's own blocking collectives in the same job, interleaved
// round by round: sizes (MiB of the full vector) from ZINF_MPI_BENCH_MIB,
// rounds from ZINF_MPI_BENCH_ROUNDS. Each measurement is the slowest
// rank's time per call over a few calls; rank 0 prints one JSON line per
// measurement ("BENCH {...}").
func benchCollectives(ctx context.Context, c comm.Comm) error {
	sizes := []int{1, 16, 64}
	if s := os.Getenv("ZINF_MPI_BENCH_MIB"); s != "" {
		sizes = sizes[:0]
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				return err
			}
			sizes = append(sizes, n)
		}
	}
	rounds, _ := strconv.Atoi(os.Getenv("ZINF_MPI_BENCH_ROUNDS"))
	rounds = max(rounds, 1)
	P, me := c.Size(), c.Rank()
	for round := range rounds {
		for _, mib := range sizes {
			total := (mib << 20) / (4 * P) * 4 * P // bytes, a multiple of 4P
			chunk := total / P
			counts := make([]int, P)
			elems := make([]int, P)
			for q := range counts {
				counts[q], elems[q] = chunk, chunk/4
			}
			sendB, recvB := make([]byte, chunk), make([]byte, total)
			sendF, recvF := make([]float32, total/4), make([]float32, chunk/4)
			a2a := make([]float32, total/4)
			for i := range sendF {
				sendF[i] = float32(i%97) * 0.25
			}
			iters := max(1, min(20, (256<<20)/max(total, 1)))
			ops := []struct {
				name string
				f    func() error
			}{
				{"all-gather binding", func() error { return c.AllGather(ctx, sendB, recvB, counts) }},
				{"all-gather bare MPI_Allgather", func() error { return comm.BareAllGather(c, sendB, recvB) }},
				{"reduce-scatter binding (rank-ordered)", func() error { return c.ReduceScatter(ctx, sendF, recvF, elems) }},
				{"reduce-scatter binding (native)", func() error { return comm.NativeReduceScatter(c, sendF, recvF, elems) }},
				{"reduce-scatter bare MPI_Reduce_scatter_block", func() error { return comm.BareReduceScatter(c, sendF, recvF) }},
				{"reduce-scatter bare MPI_Alltoall + ordered sum", func() error {
					if err := comm.BareAlltoall(c, sendF, a2a); err != nil {
						return err
					}
					n := chunk / 4
					copy(recvF, a2a[:n])
					for q := 1; q < P; q++ {
						x := a2a[q*n : (q+1)*n]
						for i := range recvF {
							recvF[i] += x[i]
						}
					}
					return nil
				}},
			}
			for _, op := range ops {
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				t0 := time.Now()
				for range iters {
					if err := op.f(); err != nil {
						return fmt.Errorf("%s: %w", op.name, err)
					}
				}
				sec := []float64{time.Since(t0).Seconds() / float64(iters)}
				if err := c.AllReduceFloat64(ctx, sec, comm.Max); err != nil {
					return err
				}
				if me == 0 {
					fmt.Printf("BENCH {\"round\":%d,\"ranks\":%d,\"bytes\":%d,\"op\":%q,\"seconds\":%g,\"iters\":%d}\n", round, P, total, op.name, sec[0], iters)
				}
			}
		}
	}
	return nil
}
