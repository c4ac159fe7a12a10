package train

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
)

// runLocalRanks runs Run with each rank of an in-process world on its
// own goroutine (the path each process of an MPI job takes, over
// comm.NewLocal) and returns every rank's result and error.
func runLocalRanks(t *testing.T, procs int, o Options) ([]*Result, []error) {
	t.Helper()
	cs, err := comm.NewLocal(procs, comm.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, errs := make([]*Result, procs), make([]error, procs)
	var wg sync.WaitGroup
	for r := range procs {
		wg.Go(func() {
			or := o
			or.Comm = cs[r]
			if r != 0 {
				or.Progress = nil
			}
			res[r], errs[r] = Run(context.Background(), or)
		})
	}
	wg.Wait()
	return res, errs
}

// TestRanksAsProcesses: the ranks of a job trained as separate
// processes would train them (each its own runtime, layers gathered
// from every rank, gradients reduce-scattered in rank order; here over
// an in-process world) end in the same state, bit for bit, as the
// in-process world of the same size, as world 1 standing in for the
// same data-parallel degree, and as in-memory training.
func TestRanksAsProcesses(t *testing.T) {
	digests := map[string]int{}
	for _, procs := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(procs), func(t *testing.T) {
			cfg := testConfig(t, func(c *config.Config) { c.Zinf.WorldSize = procs })
			o := Options{Config: cfg, Spec: smallSpec, Steps: 3, Verify: true, Logger: quiet}
			res, errs := runLocalRanks(t, procs, o)
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				if res[r].BitwiseEqual == nil || !*res[r].BitwiseEqual {
					t.Fatalf("rank %d differs from in-memory training: %s", r, res[r].Mismatch)
				}
				if res[r].StateSHA256 != res[0].StateSHA256 {
					t.Fatalf("rank %d's final state %s, rank 0's %s", r, res[r].StateSHA256, res[0].StateSHA256)
				}
			}
			inproc, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			cfg1 := testConfig(t, func(c *config.Config) { c.Zinf.WorldSize = 1 })
			one, err := Run(context.Background(), Options{Config: cfg1, Spec: smallSpec, Steps: 3, Logger: quiet, DataParallel: procs})
			if err != nil {
				t.Fatal(err)
			}
			if inproc.StateSHA256 != res[0].StateSHA256 || one.StateSHA256 != res[0].StateSHA256 {
				t.Fatalf("final states: ranks as processes %s, in-process world %s, world 1 with data-parallel %d %s", res[0].StateSHA256, inproc.StateSHA256, procs, one.StateSHA256)
			}
			if p, dup := digests[res[0].StateSHA256]; dup {
				t.Fatalf("world %d ends in the state of world %d: the digest does not tell runs apart", procs, p)
			}
			digests[res[0].StateSHA256] = procs
			if res[0].FinalLoss != inproc.FinalLoss {
				t.Errorf("final loss %v, in-process %v", res[0].FinalLoss, inproc.FinalLoss)
			}
			if procs > 1 && (res[0].Dist.CommBytesPerStep == 0 || res[0].Dist.GatheredAhead == 0) {
				t.Errorf("collectives: %+v", res[0].Dist)
			}
		})
	}
}

// TestRanksAsProcessesOtherDegree: processes standing in for more
// data-parallel ranks than there are (2 for 3), and fewer (4 for 3: one
// rank computes none, but still gathers, reduces and steps its
// partition), end in the state of the in-process world of 3.
func TestRanksAsProcessesOtherDegree(t *testing.T) {
	cfg3 := testConfig(t, func(c *config.Config) { c.Zinf.WorldSize = 3 })
	want, err := Run(context.Background(), Options{Config: cfg3, Spec: smallSpec, Steps: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, procs := range []int{2, 4} {
		cfg := testConfig(t, func(c *config.Config) { c.Zinf.WorldSize = procs })
		res, errs := runLocalRanks(t, procs, Options{Config: cfg, Spec: smallSpec, Steps: 2, Logger: quiet, DataParallel: 3})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%d processes: rank %d: %v", procs, r, err)
			}
			if res[r].StateSHA256 != want.StateSHA256 {
				t.Fatalf("%d processes for 3 data-parallel ranks: rank %d ends in %s, the world of 3 in %s", procs, r, res[r].StateSHA256, want.StateSHA256)
			}
		}
	}
}
