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
//     steps_per_print, zero_optimization.overlap_comm, stage3_* tuning,
//     fp16.auto_cast, ...) are accepted and listed in Config.Ignored and
//     in one warning: "ignored (DeepSpeed key not used by zinf): ...".
//     Their values are checked only as DeepSpeed would refuse them: the
//     JSON type DeepSpeed requires (train_batch_size an integer or
//     "auto", overlap_comm a boolean, tensorboard an object; null always
//     passes), and no string in them longer than 4096 bytes. A DeepSpeed
//     section zinf does not act on at all (tensorboard,
//     activation_checkpointing, ...) is otherwise accepted whole.
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
// fp16/bf16.enabled, optimizer.params.*, gradient_clipping,
// scheduler.params.warmup_min_lr, warmup_max_lr and warmup_num_steps);
// for scheduler.params.total_num_steps, which has no default, it is a
// problem.
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
//	optimizer.type                              word      "Adam"        Adam | AdamW | SGD | Adagrad | Lion, in any case
//	optimizer.params.lr                         float     1e-3          learning rate (>= 0); Adagrad 1e-2, Lion 1e-4
//	optimizer.params.betas                      [2]float  [0.9, 0.999]  Adam, AdamW, Lion ([0.9, 0.99]); each in [0, 1)
//	optimizer.params.eps                        float     1e-8          Adam, AdamW, Adagrad (1e-10); (> 0)
//	optimizer.params.weight_decay               float     0             (>= 0); L2 for Adam (adam_w_mode false), SGD, Adagrad;
//	                                                                    decoupled for AdamW and Lion
//	optimizer.params.adam_w_mode                bool      true          type Adam decouples weight decay, as DeepSpeed's Adam does
//	optimizer.params.momentum                   float     0             SGD (>= 0; 0 = plain SGD, no state)
//	optimizer.params.dampening                  float     0             SGD
//	optimizer.params.nesterov                   bool      false         SGD; needs momentum > 0 and dampening 0
//	optimizer.params.lr_decay                   float     0             Adagrad (>= 0)
//	optimizer.params.initial_accumulator_value  float     0             Adagrad (>= 0)
//	fp16.enabled                                bool      false         fp16 training (with loss scaling); not with bf16
//	fp16.loss_scale                             float     0             0 = dynamic loss scaling; > 0 a static scale
//	fp16.initial_scale_power                    int       16            the dynamic scale starts at 2^power, 0..126
//	fp16.loss_scale_window                      int       1000          clean steps before the dynamic scale doubles (>= 1)
//	fp16.hysteresis                             int       2             overflows before the dynamic scale halves (>= 1)
//	fp16.consecutive_hysteresis                 bool      false         refill the hysteresis on every clean step
//	fp16.min_loss_scale                         float     1             floor of the dynamic scale (> 0)
//	bf16.enabled                                bool      false         bf16 training; not with fp16 (old name: bfloat16)
//	gradient_clipping                           float     0             largest global L2 gradient norm; 0 = off (>= 0)
//	scheduler.type                              word      none          WarmupLR | WarmupDecayLR | WarmupCosineLR | OneCycle
//	scheduler.params.warmup_min_lr              float     0             WarmupLR, WarmupDecayLR (>= 0)
//	scheduler.params.warmup_max_lr              float     see below     WarmupLR: optimizer.params.lr; WarmupDecayLR: 0.001
//	scheduler.params.warmup_num_steps           int       1000          the Warmup* types (>= 1; below 2 acts as 2)
//	scheduler.params.warmup_type                word      "log"         the Warmup* types: log | linear
//	scheduler.params.total_num_steps            int       required      WarmupDecayLR, WarmupCosineLR (>= 1)
//	scheduler.params.warmup_min_ratio           float     0             WarmupCosineLR (>= 0)
//	scheduler.params.cos_min_ratio              float     0.0001        WarmupCosineLR (>= 0)
//	scheduler.params.cycle_min_lr               float     required      OneCycle (>= 0)
//	scheduler.params.cycle_max_lr               float     required      OneCycle (>= 0)
//	scheduler.params.decay_lr_rate              float     0             OneCycle (>= 0)
//	scheduler.params.cycle_first_step_size      int       2000          OneCycle (>= 1)
//	scheduler.params.cycle_second_step_size     int       = first       OneCycle (>= 1)
//	scheduler.params.cycle_first_stair_count    int       0             OneCycle (>= 0; 0 = continuous)
//	scheduler.params.cycle_second_stair_count   int       = first       OneCycle (>= 0)
//	scheduler.params.decay_step_size            int       0             OneCycle (>= 0; 0 = no decay)
//	scheduler.params.cycle_momentum             bool      true          OneCycle: cycle beta1 (optimizers with betas)
//	scheduler.params.cycle_min_mom              float     0.8           OneCycle, [0, 1)
//	scheduler.params.cycle_max_mom              float     0.9           OneCycle, [0, 1)
//	scheduler.params.decay_mom_rate             float     0             OneCycle (>= 0)
//	gradient_accumulation_steps                 int|auto  1             micro-steps per optimizer step (>= 1); "auto":
//	                                                                    the planner picks the k whose compute covers a
//	                                                                    layer-major step's NVMe I/O
//	train_micro_batch_size_per_gpu              int       1             samples per micro-step (>= 1)
//
// optimizer.params.amsgrad, bias_correction and maximize are accepted only
// with the values zinf implements (false, true and false); a parameter of
// another optimizer type is refused, naming the types it belongs to. The
// update rules are torch.optim.Adam/AdamW, torch.optim.SGD and
// torch.optim.Adagrad, and Lion as its paper writes it (package
// swapper/optimizer has each formula); every optimizer's states are
// swapped as Adam's are, 4 bytes per element and state beside the fp32
// master (SGD with momentum and Adagrad and Lion one state, plain SGD
// none).
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
//	zinf.pipeline_depth          int       1                 optimizer read-ahead/write-behind in sub-groups (small ones
//	                                                         counted by their size relative to the largest), 0..16;
//	                                                         when absent, 0 if offload_optimizer sets both
//	                                                         pipeline_read and pipeline_write to false
//	zinf.gds                     word      "off"             off | auto | required; when absent, "auto" if
//	                                                         aio.use_gds is true; required is refused with device
//	                                                         sim or direct off
//	zinf.device                  word      "auto"            auto (cuda when a GPU works, else sim) | sim | cuda
//	zinf.rank                    int       $RANK or 0        data-parallel rank, below world_size; when absent
//	                                                         $RANK, $OMPI_COMM_WORLD_RANK or $SLURM_PROCID
//	zinf.world_size              int       $WORLD_SIZE or 1  data-parallel processes (>= 1); when absent
//	                                                         $WORLD_SIZE, $OMPI_COMM_WORLD_SIZE or $SLURM_NTASKS
//	                                                         (both from the first launcher that sets either)
//	zinf.swap_file_bytes         size      0                 preallocated size of each swap file; 0 = grow as needed
//	zinf.preallocate             bool      true              a training runtime reserves (fallocate) the swap file
//	                                                         space its plan counts at Open (see below)
//	zinf.piece_bytes             size      0                 tensors larger move in pieces of it (streamed parameters,
//	                                                         gradients in pieces), 0..1TiB; 0 = 4 MiB; above the
//	                                                         largest tensor every tensor moves whole
//	zinf.prefetch_depth          int       0                 layers prefetched ahead, 0..1024; 0 = the policy decides
//	zinf.optimizer_workers       int       0                 cores one optimizer sub-group's update is split over,
//	                                                         0..1024; 0 = GOMAXPROCS (results do not depend on it)
//	zinf.optimizer_states        word      "fp32"            fp32 | bf16 | 8bit: how Adam's exp_avg and exp_avg_sq are
//	                                                         stored on NVMe and in pinned memory (8bit: blockwise, an
//	                                                         fp32 absmax per 256 elements); masters stay fp32
//	zinf.optimizer_states_fp32   strings   []                tensor name patterns ('*' any run, e.g. "*embed*") whose
//	                                                         states stay fp32 under bf16 or 8bit, as do tensors
//	                                                         under 4096 elements
//	zinf.speculate               word      "auto"            auto | always | never: with gradient_clipping or fp16,
//	                                                         start each layer's update during backward before the
//	                                                         global norm and overflow are known (see below)
//	zinf.overlap_update          bool      false             Step returns once the step is decided; the update goes
//	                                                         on while the next forward runs (see below)
//	zinf.schedule                word      "auto"            auto | layer-major | micro-batch-major: the order of a
//	                                                         step's micro-batches (gradient_accumulation_steps);
//	                                                         auto = the planner predicts both and picks (see below)
//	zinf.pinned_grads            word      "auto"            auto | off: keep the gradients the pinned pool has room
//	                                                         for in pinned memory, where the update reads them: no
//	                                                         NVMe write-behind nor read-back (see below)
//	zinf.bandwidth.read_bytes_per_sec
//	                             size      0                 each NVMe path's read bandwidth per second ("3GB"), 0..100GB;
//	                                                         set with write_bytes_per_sec or not at all
//	zinf.bandwidth.write_bytes_per_sec
//	                             size      0                 each NVMe path's write bandwidth per second, 0..100GB
//	zinf.bandwidth.file          string    ""                a `zinf tune --bandwidth-file` result; relative to the
//	                                                         config file's directory
//	zinf.bandwidth.probe         bool      true              probe a path no figure above covers, at Open (cached in the
//	                                                         path for a week)
//	zinf.bandwidth.probe_bytes   size      16MiB             bytes each probe writes and reads, 1MiB..1GiB
//	zinf.nvme_tbw                size      0                 the NVMe drives' endurance rating (bytes written over
//	                                                         their life, e.g. "600TB"); zinf plan, train and doctor
//	                                                         set a run's writes per day against it; 0 = not given
//	zinf.kv_cache.device         word      "auto"            auto | memory | cpu | nvme: where a generation's KV cache
//	                                                         lives (Runtime.OpenKVCache): memory (the Go heap), cpu
//	                                                         (pinned memory of its own), nvme (swap files, each layer
//	                                                         read back into pinned memory just ahead of use); auto:
//	                                                         memory while the cache fits in kv_cache.bytes, else nvme
//	zinf.kv_cache.bytes          size      0                 the cache's budget on its tier: memory and auto, the
//	                                                         cache in memory (0 = no limit); cpu, the pinned cache;
//	                                                         nvme, its pinned staging (three layers). 0 = what it
//	                                                         needs; a budget below the need is refused at plan time
//	zinf.activations.device      word      "auto"            auto | memory | cpu | nvme: where activations handed to
//	                                                         Runtime.OpenActivations live between a layer's forward
//	                                                         and its backward; auto = memory within memory_bytes,
//	                                                         then pinned within cpu_bytes, then nvme
//	zinf.activations.memory_bytes size     0                 activations kept in memory under auto (0: no limit)
//	zinf.activations.cpu_bytes   size      0                 pinned memory of the activation tier (0: 64 MiB)
//	zinf.pinned_stall_timeout    duration  "2m"              how long a wait for pinned memory may see no release in
//	                                                         its region before it fails naming what the pool holds,
//	                                                         1s..24h (a wait that can never be served fails at once)
//	zinf.comm_stall_timeout      duration  "10m"             how long a collective waits for the other ranks, 1s..24h
//	zinf.comm_heartbeat_timeout  duration  "10s"             how long a rank in a collective tolerates silence from
//	                                                         another rank's process (mpirun) before the job fails
//	                                                         naming it (stopped with SIGSTOP, hung), 1s..1h
//
// A duration is a string such as "90s", "2m" or "1h30m" (Go's
// time.ParseDuration), or a number of seconds.
//
// # The training step
//
// These keys act as in DeepSpeed (ZeRO stage 3 with its DynamicLossScaler
// and lr_schedules), so a ported ds_config.json trains the same way. One
// optimizer step, in order (unscale, check overflow, clip, update):
//
//  1. sumSq = the sum of the squares of every rank's accumulated (loss-
//     scaled) gradient partition, in float64: per rank, each tensor's
//     partition element by element, the tensors in model order; then the
//     ranks' sums in rank order (((r0 + r1) + r2) + ...). A world of one
//     rank sums each tensor whole, so its norm may differ from a world of
//     four in the last bits (a different order of float64 additions); the
//     steps agree whenever that does not move the clip decision or the
//     float32 factor below.
//  2. fp16 only: if sumSq is inf or NaN (a gradient overflowed), the step
//     is skipped: nothing is updated, the gradients are dropped, the loss
//     scale is updated (below) and the schedule does not advance. bf16 and
//     fp32 have no loss scaling and no overflow check (as in DeepSpeed).
//  3. With loss scale S (1 without fp16) and c = gradient_clipping:
//     norm = sqrt(sumSq) / S; q = (norm + 1e-6) / c; k = q*S when c > 0
//     and q > 1, else S; every gradient element is multiplied by
//     float32(1/k) (unscaling and clipping in one factor, as DeepSpeed's
//     unscale_and_clip_grads). The clip coefficient is 1/q.
//  4. The optimizer updates with the learning rate (and, for OneCycle
//     with momentum, betas) of the schedule at this applied step.
//
// Dynamic loss scaling (fp16.loss_scale 0) starts at
// 2^initial_scale_power. After each step, on overflow: when hysteresis is
// 1 or the remaining hysteresis is 1, the scale halves (not below
// min_loss_scale; an overflow with the scale already at min_loss_scale
// fails the step: training diverged, as DeepSpeed raises), else the
// remaining hysteresis drops by one. On a clean step: with
// consecutive_hysteresis the remaining hysteresis is refilled; and when
// the clean steps since the last overflow, not counting this one, are a
// positive multiple of loss_scale_window, the scale doubles (and the
// hysteresis is refilled). That is the current DeepSpeed rule; releases
// before it counted this step too and doubled one step earlier. A static
// scale (loss_scale > 0) never changes; its overflowing steps are still
// skipped.
//
// The schedules are DeepSpeed's, with its parameter names and defaults:
// the learning rate of applied step k (from 1) is the schedule at
// iteration it = k - 2, because DeepSpeed builds its scheduler at
// iteration -1 and steps it after each applied step; step 1 gets the
// constructor's value (WarmupLR, WarmupDecayLR: warmup_min_lr;
// WarmupCosineLR: 0; OneCycle: cycle_min_lr with beta1 cycle_min_mom).
// With W = max(2, warmup_num_steps) and gamma(it) = ln(it+1)/ln(W) (log)
// or it/W (linear):
//
//	WarmupLR:       min + (max-min)*gamma(it) while it < W, then min + (max-min)
//	WarmupDecayLR:  the same warmup, then min + (max-min)*max(0, (T-it)/max(1, T-W))
//	WarmupCosineLR: lr * (wmin + gamma(it)*(1-wmin)) while it < W, then
//	                lr * max(0, cmin + (1-cmin)*(1+cos(pi*min(1, (it-W+1)/max(1, T-W))))/2)
//	OneCycle:       one triangular cycle of cycle_first_step_size steps up from
//	                cycle_min_lr to cycle_max_lr and cycle_second_step_size down
//	                (optionally in stair steps), then cycle_min_lr / (1 +
//	                decay_lr_rate*(it-total+1)/decay_step_size); with cycle_momentum
//	                beta1 moves inversely from cycle_max_mom to cycle_min_mom and
//	                back (then grows by decay_mom_rate), and beta2 is set to 0.99
//	                (DeepSpeed's OneCycle writes betas (momentum, 0.99)). Optimizers
//	                without betas get no momentum cycling, with a warning.
//
// The schedule package has each formula exactly. LRRangeTest and the
// torch.optim.lr_scheduler names DeepSpeed also accepts are refused. A
// Go loop may set the rate itself (zinf.Runtime.SetLR).
//
// zinf.speculate: zinf starts each layer's optimizer update during the
// backward pass (Runtime.StepTensor). With gradient_clipping or fp16 on,
// the global norm and overflow are known only at the end of the step, so
// the update is speculative: it assumes no clipping and no overflow, and
// is committed when that was right, or rolled back (nothing of it was
// committed) and redone with the right factor (or skipped) when it was
// not. "always" speculates every step, "never" waits for the norm (no
// overlap while clipping or fp16 is on), and "auto" speculates unless
// more than 4 of the last 8 steps needed a correction (clipping triggered
// or fp16 overflowed) — steps that did not speculate still tell whether
// they would have needed one, so auto starts speculating again once
// clipping stops triggering.
//
// zinf.preallocate: at Open, a training runtime reserves in each swap
// file the space its plan counts for it (every NVMe tensor with its
// copy-on-write copy; `zinf plan` shows the total per path), with
// fallocate. Without it the first step writes every staged copy past the
// files' ends: on ext4 an O_DIRECT write that extends a file completes
// synchronously under the inode's lock and one into new space allocates
// blocks as it goes. On a virtio disk, at 1.8 GiB of state, that step ran
// 1.15-1.25x the steps after it, and 1.02-1.07x in three runs of four
// preallocated; at 28 GiB the difference was inside the disk's swings
// (BENCHMARKS.md). Reserved space also
// means a step cannot run out of disk on the extents the plan counted
// (a checkpoint's extra copy is not reserved). The space is taken from
// the start whether or not training fills it; Open checks it is free
// either way. An inference runtime is never preallocated.
//
// zinf.overlap_update: Step decides the step (the norm, overflow and
// clipping) and returns while the update is still running, each tensor's
// new parameters published as soon as they are written, the tensors not
// yet updated in forward order. BeginLayer(l) of the next step waits for
// layer l's update only, so the next forward's first layers compute while
// the last ones update; AccumulateGrad, Step and anything that reads
// optimizer state wait for the whole step. Results are bit for bit those
// of a Step that returns after the commit. The step stays all or
// nothing: if the update fails after Step returned, every parameter it
// published is put back, and the next BeginLayer, AccumulateGrad or Step
// returns an error wrapping zinf.ErrUpdateFailed: call Step again (it
// retries the failed step from the same gradients) and rerun the
// micro-batches from the first layer. It takes effect where the plan has
// room for the update and the parameters together (Placement().OverlapStep),
// and not with zinf.Options.GatherLayers (ranks as processes gather each
// layer ahead of its use); otherwise Open logs why and Step waits for the
// whole update.
//
// zinf.schedule: the order of a step's micro-batches
// (gradient_accumulation_steps = k). "micro-batch-major" is
// ZeRO-Infinity's: every micro-batch runs forward and backward through
// every layer, so each parameter is read from NVMe 2k times per step and
// each gradient read back and rewritten k times. "layer-major" runs every
// micro-batch of a layer while its parameters are in
// (Runtime.BeginLayerMicroBatches): each parameter is read twice per step
// and each gradient summed over the k micro-batches in pinned memory, in
// micro-batch order, and written once; the loop keeps the k micro-batches'
// activations between a layer's forward and its backward. Both give the
// same bits. "auto" has the planner predict both (NVMe bandwidth, compute
// per layer, k, the pinned pool) and pick the faster; at k = 1 they are
// the same order, and auto says micro-batch-major.
//
// zinf.pinned_grads: with the optimizer on NVMe, each gradient is written
// behind to NVMe as the backward pass hands it over and read back by the
// update: 8 bytes per parameter per step (per micro-batch,
// micro-batch-major). Under "auto" the planner keeps in pinned memory, for
// the whole run, the gradients the pool has room for beyond every minimum
// and the planned prefetch window (taken in the model's order; with every
// one kept, the write-behind's own minimum is freed for them): the sums
// stay where the hand-offs add them, the update reads them there, and
// they never touch NVMe, with any schedule and any number of
// micro-batches. The results are the same bits as the round trip's (the
// same float32 sums, read by the same update): a step that must be
// redone — clipping or an fp16 overflow found after a speculative update,
// a failed step retried — reads them again from pinned memory, since a
// gradient is dropped only once its step is committed. Open logs how many
// stay and, when some do not, the pool that would keep them all; `zinf
// plan` shows them as "gradients: kept in pinned memory" and counts them
// in its bytes per parameter. "off" sends every gradient through NVMe.
//
// # NVMe bandwidth
//
// The planner sizes prefetching and predicts the step time from each NVMe
// path's read and write bandwidth (paths add up: swap files are striped
// over them). For each path the figure comes from the first of:
//
//  1. zinf.bandwidth.read_bytes_per_sec and write_bytes_per_sec (every
//     path gets these figures);
//  2. the path's entry in zinf.bandwidth.file, the file `zinf tune --path P
//     --bandwidth-file F` writes (an entry for a directory holds for the
//     directories below it); a file that cannot be read or is not such a
//     result is an error naming the key;
//  3. the probe cache in the path (.zinf-bandwidth.json, per filesystem,
//     at most a week old);
//  4. a probe at Open when zinf.bandwidth.probe is true: about probe_bytes
//     written and read with O_DIRECT in a private temporary file, at most
//     a few seconds, then cached in the path (a path with less than twice
//     probe_bytes free is not probed);
//  5. a conservative default (2 GB/s read, 1.5 GB/s write).
//
// `zinf plan` and `zinf train` print each figure with its source; the Go
// API has them in Runtime.Bandwidth and Runtime.Placement().Tiers.
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
