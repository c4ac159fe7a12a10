//go:build mpi && cgo

package comm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/internal/commtest"
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
	if kase == "stress" {
		opts.SegmentBytes = 4 * 1021 // several segments per chunk, not thousands
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
