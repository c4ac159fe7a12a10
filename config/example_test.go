package config_test

import (
	"fmt"

	"github.com/zinfio/zinf/config"
)

// A DeepSpeed config loads as it is; zinf's section sits beside it.
func ExampleParse() {
	cfg, err := config.Parse([]byte(`{
	  "train_batch_size": 16,
	  "zero_optimization": {
	    "stage": 3,
	    "overlap_comm": true,
	    "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"},
	    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}
	  },
	  "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 2},
	  "zinf": {"tiers": {"cpu_pinned_bytes": "2GiB"}, "rank": 0, "world_size": 1}
	}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("paths:", cfg.NVMePaths())
	fmt.Println("block:", cfg.AIO.BlockSize, "depth:", cfg.AIO.QueueDepth, "parallel:", cfg.AIO.IntraOpParallelism)
	fmt.Println("pinned:", cfg.Zinf.Tiers.CPUPinnedBytes)
	for _, w := range cfg.Warnings {
		fmt.Println("warning:", w)
	}
	// Output:
	// paths: [/local_nvme]
	// block: 256KiB depth: 32 parallel: 2
	// pinned: 2GiB
	// warning: aio.thread_count is DeepSpeed's old name for aio.intra_op_parallelism; read as intra_op_parallelism 2
	// warning: ignored (DeepSpeed key not used by zinf): train_batch_size, zero_optimization.overlap_comm
}

// Every problem is reported at once, each with its key, value and what is
// allowed.
func ExampleParse_errors() {
	_, err := config.Parse([]byte(`{
	  "zero_optimization": {
	    "stage": 3,
	    "offload_parm": {"device": "nvme"},
	    "offload_optimizer": {"device": "disk"}
	  },
	  "aio": {"queue_depth": "eight"},
	  "zinf": {"rank": 0, "world_size": 1}
	}`))
	fmt.Println(err)
	// Output:
	// config: 3 problems:
	// zero_optimization.offload_parm: unknown key (did you mean "zero_optimization.offload_param"?)
	// zero_optimization.offload_optimizer.device: "disk" is not allowed (allowed: none, cpu, nvme)
	// aio.queue_depth: "eight" is a string, not an integer (allowed: 1..4096)
}

func ExampleParseSize() {
	for _, s := range []string{"4GiB", "1.5GB", "512KiB", "1e9", "100"} {
		n, err := config.ParseSize(s)
		fmt.Println(s, n, err, config.Size(n))
	}
	// Output:
	// 4GiB 4294967296 <nil> 4GiB
	// 1.5GB 1500000000 <nil> 1500MB
	// 512KiB 524288 <nil> 512KiB
	// 1e9 1000000000 <nil> 1GB
	// 100 100 <nil> 100B
}

func ExampleAIOSection() {
	out, err := config.AIOSection(config.AIO{
		BlockSize:          config.MiB,
		QueueDepth:         32,
		IntraOpParallelism: 8,
		OverlapEvents:      true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(string(out))
	// Output:
	// {
	//   "aio": {
	//     "block_size": 1048576,
	//     "queue_depth": 32,
	//     "intra_op_parallelism": 8,
	//     "single_submit": false,
	//     "overlap_events": true,
	//     "use_gds": false
	//   }
	// }
}

// Default is the demo config; the caller supplies the scratch directory.
func ExampleDefault() {
	cfg := config.Default()
	fmt.Println("needs scratch dir:", cfg.NeedsScratchDir())
	cfg.SetScratchDir("/tmp/zinf-demo")
	fmt.Println("device:", cfg.Zinf.Device, "paths:", cfg.NVMePaths(), "valid:", cfg.Validate() == nil)
	// Output:
	// needs scratch dir: true
	// device: sim paths: [/tmp/zinf-demo] valid: true
}
