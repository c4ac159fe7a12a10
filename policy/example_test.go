package policy_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/zinfio/zinf/policy"
)

func ExampleParseModelSpec() {
	spec, err := policy.ParseModelSpec("layers=24,width=4096,dtype=bf16,batch=8,world=4")
	if err != nil {
		fmt.Println(err)
		return
	}
	inv := spec.Inventory(0, spec.World)
	fmt.Println(spec, "->", len(inv), "tensors, first", inv[0].Name, inv[0].Bytes, "bytes")

	_, err = policy.ParseModelSpec("layers=24,width=4096,dtype=int8")
	fmt.Println(err)
	// Output:
	// layers=24,width=4096,dtype=bf16,batch=8,world=4 -> 240 tensors, first layer000.weight 8388608 bytes
	// policy: invalid input: model spec: dtype="int8": want fp32, bf16 or fp16
}

func ExamplePlan() {
	spec, _ := policy.ParseModelSpec("layers=8,width=1024,dtype=bf16")
	tiers := policy.Tiers{
		GPUBytes:     1 << 30,   // 1 GiB
		CPUBytes:     256 << 20, // 256 MiB pinned
		NVMeReadBps:  2e9,
		NVMeWriteBps: 1e9,
		NVMePaths:    1,
	}
	hints := policy.Hints{
		ParamDevice:            "nvme",
		OptimizerDevice:        "cpu",
		ComputeSecondsPerLayer: 0.003,
	}
	p, err := policy.Plan(tiers, spec.Inventory(0, 1), hints)
	if err != nil {
		fmt.Println(err)
		return
	}
	p.WriteTable(os.Stdout)
	// Output:
	// placement: 8 layers, 80 tensors, 144.1 MiB
	// tiers: gpu 1.0 GiB, cpu pinned 256.0 MiB, nvme 1 path read 1.9 GiB/s write 953.7 MiB/s, pcie unlimited
	//
	// TIER  HOLDS                      TENSORS  BYTES      % OF TIER
	// gpu   working set                -        8.0 MiB    0.8%
	// gpu   total                      0        8.0 MiB    0.8%
	// cpu   grad                       16       32.0 MiB   12.5%
	// cpu   optimizer                  48       96.1 MiB   37.5%
	// cpu   param buffers 4 x 2.0 MiB  -        8.0 MiB    3.1%
	// cpu   total                      64       136.1 MiB  53.2%
	// nvme  param                      16       16.0 MiB   -
	// nvme  total                      16       16.0 MiB   -
	//
	// prefetch: 1 layer ahead, at most 4.0 MiB fetched before use
	// predicted step: 35.5 ms (compute 24.0 ms, exposed parameter I/O 2.4 ms of 16.8 ms, exposed gradient I/O 0 of 0, optimizer step 9.1 ms exposed of 16.8 ms, overlapping backward)
	//
	// PHASE      COMPUTE  I/O      EXPOSED I/O  TIME
	// forward    8.0 ms   8.4 ms   1.4 ms       9.4 ms
	// backward   16.0 ms  8.4 ms   1.0 ms       17.0 ms
	// optimizer  0        16.8 ms  9.1 ms       9.1 ms
	// step       24.0 ms           11.5 ms      35.5 ms
}

// printFetcher prints what the scheduler asks of it.
type printFetcher struct{}

func (printFetcher) Prefetch(names ...string) error {
	fmt.Println("prefetch", strings.Join(names, " "))
	return nil
}

func (printFetcher) Wait(_ context.Context, names ...string) error {
	fmt.Println("wait    ", strings.Join(names, " "))
	return nil
}

func (printFetcher) Release(names ...string) { fmt.Println("release ", strings.Join(names, " ")) }

func ExampleScheduler() {
	layers := [][]string{{"w0"}, {"w1"}, {"w2"}}
	s := policy.NewScheduler(nil, layers, printFetcher{}, policy.SchedulerOptions{Depth: 1})
	ctx := context.Background()
	s.StartPass([]int{0, 1, 2})
	for l := 0; l < 3; l++ {
		if err := s.Begin(ctx, l); err != nil {
			fmt.Println(err)
			return
		}
		// ... compute layer l ...
		s.End(l)
	}
	fmt.Printf("%+v\n", s.Stats().DemandMisses)
	// Output:
	// prefetch w0
	// prefetch w1
	// wait     w0
	// release  w0
	// prefetch w2
	// wait     w1
	// release  w1
	// wait     w2
	// release  w2
	// 1
}
