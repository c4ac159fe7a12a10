// Package config reads the one JSON file that describes zinf's offload
// tiers: DeepSpeed's ds_config.json, read as it is, plus zinf's own "zinf"
// section for what DeepSpeed's schema does not express.
//
// # Use
//
//	cfg, err := config.Load("ds_config.json")
//	if err != nil {
//		return err // an *Error lists every problem, one per line
//	}
//	for _, w := range cfg.Warnings {
//		log.Print(w) // old key names, ignored DeepSpeed keys, ...
//	}
//	paths := cfg.NVMePaths()
//
// Default returns the embedded demo config (simulated device, parameters
// and optimizer state on NVMe); its nvme_path keys are empty on purpose and
// the caller supplies a scratch directory with SetScratchDir. ParseSize
// reads byte counts such as "4GiB" for command-line flags, and AIOSection
// renders an "aio" section for `zinf tune` to print.
//
// # Which keys are read
//
// Every key of the file falls in one of three kinds:
//
//  1. Keys zinf acts on (the table below) are parsed and checked: type,
//     range, allowed words, and the rules between keys (see
//     Config.Validate).
//  2. DeepSpeed keys zinf knows but does not act on (train_batch_size,
//     scheduler, gradient_clipping, steps_per_print, fp16.loss_scale,
//     zero_optimization.overlap_comm, stage3_* tuning, ...) are accepted
//     without looking at their values, and listed in Config.Ignored and in
//     one warning: "ignored (DeepSpeed key not used by zinf): ...". A
//     DeepSpeed section zinf does not act on at all (scheduler, tensorboard,
//     activation_checkpointing, ...) is accepted whole.
//  3. Any other key is a problem: "unknown key", with a "did you mean"
//     suggestion when a known key is close (offload_parm -> offload_param)
//     or when the key belongs in another section (block_size at the top ->
//     aio.block_size). A typo never silently becomes a default.
//
// So an existing ds_config.json loads unchanged, and a "zinf" section can
// sit in the same file, since DeepSpeed ignores top-level keys it does not
// know. DeepSpeed's old spellings are read with a warning: aio.thread_count
// (now intra_op_parallelism), bfloat16 (now bf16), zero_optimization as a
// boolean, and zero_optimization.cpu_offload, cpu_offload_param and
// cpu_offload_use_pin_memory. The value "auto", which the Hugging Face
// integration fills in before DeepSpeed reads the file, is read as the
// default, with a warning, for the training keys that allow it
// (train_micro_batch_size_per_gpu, gradient_accumulation_steps,
// fp16/bf16.enabled, optimizer.params.*).
//
// JSON null means "the default" for any key. A key written twice in one
// object is a problem. The JSON itself must be strictly valid; a syntax
// error is reported with its line and column.
//
// # Values
//
// Integers may be written in exponent form (1e9) as long as they are whole.
// Sizes (marked "size" below) are bytes, written as a JSON number or a
// string with a unit: "4GiB", "64MiB", "1.5GB", "512KiB", "100". KiB, MiB,
// GiB, TiB are binary (1024^n); KB, MB, GB, TB decimal (1000^n); a bare K,
// M, G, T is binary, as in dd and fio. Counts of parameters (sub_group_size,
// buffer_size, max_in_cpu) are elements, not bytes, as in DeepSpeed.
//
// # Reference
//
// DeepSpeed's keys, with DeepSpeed's defaults:
//
//	key                                         type      default       meaning
//	zero_optimization.stage                     int       0             ZeRO stage, 0..3
//	zero_optimization.sub_group_size            int       1e9           parameters per optimizer sub-group (>= 1)
//	zero_optimization.offload_param.device      word      "none"        none | cpu | nvme; cpu or nvme needs stage 3
//	  .nvme_path                                string    ""            directory for parameter swap files
//	  .buffer_count                             int       5             pinned buffers for parameter swaps (>= 1)
//	  .buffer_size                              int       1e8           elements per buffer (>= 1)
//	  .max_in_cpu                               int       1e9           elements cached in host memory in front of NVMe
//	  .pin_memory                               bool      false         page-locked host buffers
//	zero_optimization.offload_optimizer.device  word      "none"        none | cpu | nvme; cpu needs stage >= 1, nvme stage 3
//	  .nvme_path                                string    ""            directory for optimizer swap files
//	  .buffer_count                             int       4             pinned buffers for optimizer swaps (>= 1)
//	  .pin_memory                               bool      false         page-locked host buffers
//	  .pipeline_read                            bool      false         overlap reading the next sub-group (see zinf.pipeline_depth)
//	  .pipeline_write                           bool      false         overlap writing the previous sub-group
//	  .fast_init                                bool      false         initialize optimizer state directly on NVMe
//	  .ratio                                    float     1.0           fraction offloaded, (0, 1]; below 1 needs stage 3
//	aio.block_size                              size      1MiB          bytes per request; a power of two or a multiple of 4096
//	aio.queue_depth                             int       8             requests in flight per ring or worker, 1..4096
//	aio.intra_op_parallelism                    int       1             rings or workers per swap, 1..64 (old name: thread_count)
//	aio.single_submit                           bool      false         submit requests one at a time
//	aio.overlap_events                          bool      true          submit while reaping completions
//	aio.use_gds                                 bool      false         GPUDirect Storage; means zinf.gds "auto" when that is absent
//	optimizer.type                              word      "Adam"        Adam | AdamW, in any case
//	optimizer.params.lr                         float     1e-3          learning rate (>= 0)
//	optimizer.params.betas                      [2]float  [0.9, 0.999]  each in [0, 1)
//	optimizer.params.eps                        float     1e-8          (> 0)
//	optimizer.params.weight_decay               float     0             (>= 0)
//	optimizer.params.adam_w_mode                bool      true          type Adam decouples weight decay, as DeepSpeed's Adam does
//	fp16.enabled                                bool      false         fp16 training; not with bf16
//	bf16.enabled                                bool      false         bf16 training; not with fp16 (old name: bfloat16)
//	gradient_accumulation_steps                 int       1             micro-steps per optimizer step (>= 1)
//	train_micro_batch_size_per_gpu              int       1             samples per micro-step (>= 1)
//
// optimizer.params.amsgrad and bias_correction are accepted only with the
// values zinf implements (false and true).
//
// zinf's section:
//
//	key                          type      default           meaning
//	zinf.tiers.gpu_bytes         size      0                 GPU tier capacity; 0 = the GPU's free memory, or
//	                                                         DefaultSimGPUBytes (1GiB) on the sim device
//	zinf.tiers.cpu_pinned_bytes  size      256MiB            pinned host buffer pool budget (>= 1)
//	zinf.nvme_paths              []string  absent            directories swap files are striped over;
//	                                                         absent = the offload nvme_path keys
//	zinf.checksums               bool      true              checksum swapped-out tensors, verify on swap-in
//	zinf.direct                  word      "optional"        O_DIRECT: required | optional (probe, fall back
//	                                                         with a warning) | off
//	zinf.backend                 word      "auto"            aio engine: auto | uring | libaio | posix
//	zinf.pipeline_depth          int       1                 optimizer read-ahead/write-behind in sub-groups, 0..16;
//	                                                         when absent, 0 if offload_optimizer sets both
//	                                                         pipeline_read and pipeline_write to false
//	zinf.gds                     word      "off"             off | auto | required; when absent, "auto" if
//	                                                         aio.use_gds is true; required is refused with device
//	                                                         sim or direct off
//	zinf.device                  word      "auto"            auto (cuda when a GPU works, else sim) | sim | cuda
//	zinf.rank                    int       $RANK or 0        data-parallel rank, below world_size
//	zinf.world_size              int       $WORLD_SIZE or 1  data-parallel processes (>= 1)
//	zinf.swap_file_bytes         size      0                 preallocated size of each swap file; 0 = grow as needed
//	zinf.prefetch_depth          int       0                 layers prefetched ahead, 0..1024; 0 = the policy decides
//	zinf.optimizer_workers       int       0                 cores one optimizer sub-group's update is split over,
//	                                                         0..1024; 0 = GOMAXPROCS (results do not depend on it)
//
// # Caveats
//
// The pipeline never changes results, only overlap, so zinf pipelines by
// default where DeepSpeed does not; write pipeline_read and pipeline_write
// false (or zinf.pipeline_depth 0) for DeepSpeed's sequential order.
// Validate checks what can be known from the file; whether a path is
// writable, O_DIRECT works or a GPU exists is found out when the runtime
// opens them.
package config
