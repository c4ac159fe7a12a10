// Package optimizer is zinf's optimizer swapper: it keeps this rank's fp32
// master weights and Adam's exp_avg and exp_avg_sq for every parameter
// partition on NVMe (a swapper.Store) or in pinned memory, and takes Adam
// steps by streaming them through a few pinned buffers, like DeepSpeed
// ZeRO-Infinity's optimizer swapper. Models whose optimizer states are many
// times the pinned pool work: the pool bounds the memory, not the model.
//
// # Use
//
//	opt, err := optimizer.New(optimizer.Options{
//		Store: store, Pool: pool, Params: paramSwapper, Grads: gradSwapper,
//		SubGroupSize: 1 << 20, PipelineDepth: 2,
//		Hyper: optimizer.Hyper{LR: 1e-4},
//	})
//	for _, p := range partitions {
//		opt.Register(p.Name, p.Values) // copied; states written to NVMe
//	}
//	for step := range steps {
//		// forward/backward fill the grad swapper ...
//		if err := opt.Step(ctx); err != nil {
//			// nothing changed: fix the cause (free space) and call Step again
//		}
//	}
//
// # Sub-groups and the pipeline
//
// A tensor's partition is cut into sub-groups of at most SubGroupSize
// elements; each sub-group's states are one record (master, exp_avg,
// exp_avg_sq: 12 bytes per element, staggered in large sub-groups, see
// below) in the store. Step runs, per sub-group in
// registration order (a transaction: in hand-over order), read (the state
// record from the store and the sub-group's gradient slice from
// Grads.ReadRange, both into one pinned buffer) / update (Adam, in place in
// that buffer) / write (the record back under a staging name, and the new
// master to Params: a RangeSink takes it sub-group by sub-group, a plain
// ParamSink the whole tensor after its last sub-group). With
// PipelineDepth k >= 1 up to k sub-groups are read ahead and up to k writes
// are in flight behind the update; BufferCount caps the buffer sets in use
// and the pool's backpressure does the rest, so a small pool makes the
// pipeline wait, never fail. These windows count a sub-group by the pinned
// block its buffer takes, relative to the step's largest (a 1 K-element
// bias next to 1 M-element weights counts for a thousandth of one), so
// small sub-groups between large ones do not use the read-ahead up. With
// an AsyncGradSource (the gradient swapper is one) the read-ahead starts a
// sub-group's gradient read with its record read and goes on; the update
// waits for both. StepStats.Timeline records each sub-group's way through
// the pipeline (read-ahead, buffers held, reads issued and completed,
// update, write-behind issued and completed, retired) and IOGaps the time
// none of the step's I/O was in flight.
//
// The update of one sub-group is split over up to UpdateWorkers goroutines
// (default GOMAXPROCS; config key zinf.optimizer_workers), which take
// chunks of at least 64 Ki elements as they come free (so a worker whose
// core another process holds delays the update by one chunk), so a large sub-group's update keeps pace with the
// read-ahead on a machine whose one core could not. The chunks share the
// sub-group's buffer, so the split needs no pinned memory and changes no
// bit (elements are independent); the pipeline's order (write-behind,
// StageRange in ascending order) is unchanged.
//
// Pinned memory in use during a step is at most min(BufferCount, 2k+1)
// sub-group buffers (one at depth 0), each a record and a gradient slice,
// and nothing per tensor: it is bounded by SubGroupSize, never by the
// largest tensor (for a plain ParamSink, a tensor of several sub-groups is
// assembled in ordinary memory). PinnedNeedBytes is the exact figure, in
// pool blocks, for the planner. Empty partitions cost nothing.
//
// # Overlapping the step with the backward pass
//
// A tensor's update depends on nothing but its own gradient and states, so
// it may start as soon as its gradient is final. BeginStep opens the step;
// during the backward pass of the last micro-step the training loop hands
// each tensor over as its gradient is done (last layer first), and the
// pipeline steps it in the background while backward goes on:
//
//	txn, err := opt.BeginStep(ctx)
//	defer txn.Abort() // no-op once committed
//	for _, layer := range reversed(layers) {
//		layer.Backward()
//		txn.Tensor(layer.Name) // returns at once
//	}
//	err = txn.Commit(ctx) // steps the rest, waits, commits atomically
//
// The result is bit for bit Step's, whatever the order, and the failure
// semantics are Step's: a failure at any time makes Commit discard
// everything and return it. Step itself is BeginStep + Commit.
//
// # Transactions
//
// A step is all or nothing: new records are staged and renamed over the old
// ones with one atomic Store.Rename only after every write succeeded, and
// Params.CommitUpdates publishes the parameters at the same point. Any
// failure (ENOSPC, EIO, a checksum mismatch, a cancelled context) leaves
// states, parameters and the step counter as they were, so retrying the
// step after the fault gives bit-for-bit the fault-free result. The price
// is disk space: during a step the store holds old and new records. With
// states in pinned memory (Store nil) the price is memory: every sub-group
// keeps two copies (24 bytes per element). Those copies are copy-on-write
// for SnapshotStates: a snapshot (for an asynchronous checkpoint) holds the
// current records without copying them, and a later step that would
// overwrite a held record builds its new one in a fresh pool buffer
// instead, waiting for pool memory if there is none.
//
// # Per-step parameters
//
// StepWith and BeginStepWith take a step's StepParams: the learning rate a
// schedule sets (used as given; 0 is a valid rate), betas that replace
// Hyper's (OneCycle's momentum cycling), and a factor every gradient
// element is multiplied by before the update — the loss-scale unscaling
// and the gradient-clipping coefficient in one (GradFactor computes it,
// as DeepSpeed's unscale_and_clip_grads). Step and BeginStep use
// DefaultParams (Hyper.LR, no scaling). AdamStep is the same step on
// whole tensors for an in-memory reference; SumSquares is the float64
// sum of squares the gradient norm is made of.
//
// # Arithmetic
//
// Hyper.Rule picks the update rule: Adam (AdamW), SGD (momentum,
// dampening, Nesterov), Adagrad or Lion, each with a scalar reference in
// its own file (adam.go, sgd.go, adagrad.go, lion.go) giving its formula;
// a record holds the master and the rule's states (Hyper.StateNames,
// LayoutForArrays). Update (and Adam, AdamStep) is exported: an in-memory
// reference loop that calls it on whole tensors produces exactly the bits
// the swapper produces, whatever the sub-group size, pipeline depth,
// worker count or kernel. Golden tests compare the rules with torch.optim
// (Lion: with its paper's formula) on every kernel. Adagrad's decayed rate
// clr = lr/(1+(step-1)*lr_decay) is computed in float64 from the float64
// learning rate (StepParams.LR64, which the runtime's schedule sets) and
// Hyper.LRDecay, then rounded once, as torch computes it from its Python
// floats: a probe golden case compares it bit for bit.
//
// # Kernels
//
// Every rule's update runs on a Kernel: the scalar reference loop (one
// element at a time, every float32 operation rounded on its own, no fused
// multiply-add) or a SIMD version of it that performs the same operations
// in the same order on 8 (AVX2) or 16 (AVX-512) elements at once, with the
// scalar loop for the tail. Adam, SGD (every mode: weight decay, momentum
// at the first and later steps, Nesterov), Adagrad and Lion all have AVX2
// and AVX-512 kernels. IEEE 754 rounds each basic operation the same
// whether it is scalar or packed, and the kernels use only correctly
// rounded ones (multiply, add, subtract, divide, square root: never a
// fused multiply-add, an approximate reciprocal or reciprocal square
// root), with the operands of each addition in the compiled scalar loop's
// order, so every kernel gives the scalar loop's bits, NaN payloads and
// zero signs included. Lion's sign(c) is computed from comparisons and bit
// masks: +1 above zero, -1 below, +0 for either zero and c itself for a
// NaN, exactly as the scalar loop's branches. kernel_test.go and
// rules_kernel_test.go check all this on random and special values, every
// option combination, every tail length, misaligned slices and guard
// elements, and mutation_amd64_test.go shows that they catch a kernel that
// deviates (an addition's operand order, a fused multiply-add, a
// reciprocal for a divide, the sign of ±0 or NaN, a write past the end).
// The widest kernel the CPU runs is chosen at start-up
// (golang.org/x/sys/cpu: AVX-512F, else AVX2, else scalar).
//
// On the development machine (AMD EPYC, AVX-512; BENCHMARKS.md, make
// bench-optimizers) one core's SIMD kernels update, per CPU-second, about
// 2 G elements of Adam (the scalar loop: 0.35), 2.3-2.8 G of SGD with
// momentum or Nesterov, Adagrad or Lion (scalar: 0.44-0.85) and 4.3-4.7 G
// of plain SGD (scalar: 1.8), at 16 and 64 Mi elements: 46-57 GB/s of
// state and gradient for every rule, which points to memory as the bound;
// the two widths are equally fast.
//
// To force a kernel, set Options.Kernel or, for Adam, Update and every
// optimizer whose Options.Kernel is empty, the environment variable
// ZINF_OPTIMIZER_KERNEL (KernelEnv) to "scalar", "avx2", "avx512" or
// "auto"; New reports a name that is unknown or not available on this CPU.
// Kernels lists this CPU's.
//
// The amd64 kernels are Go assembly generated by internal/asmgen with avo
// (github.com/mmcloughlin/avo; run go generate in this directory). The
// generated kernel_amd64.s is committed, so building zinf needs nothing
// but the Go toolchain, and the generator is its own Go module, so avo is
// no dependency of zinf. Go 1.26's SIMD package would have kept the
// kernels in Go, but it is an experiment that every program importing
// zinf would have to build with GOEXPERIMENT=simd, and its API may change;
// avo writes ordinary assembly that every Go release builds. arm64 runs
// the scalar loop: a NEON kernel could not be tested here, and untested
// assembly is worse than a slower loop.
//
// A new update rule gets kernels the same way: a scalar reference, a
// generator next to genSGD (internal/asmgen/rules.go), a body in the
// internal kernel struct (kernel.go says what it must satisfy) and its
// cases in the differential test (rules_kernel_test.go).
//
// # Compressed states
//
// Options.StateFormat (config key zinf.optimizer_states) stores Adam's
// moments narrower than fp32 in the records, on NVMe and in pinned
// memory. StateFormat describes how a record's states are stored (the
// master is always fp32): FormatFP32 (today's), FormatBF16 (bfloat16, rounded to
// nearest even) and FormatBlockwise8 (one byte per element, an index into
// a 256-entry dynamic map, and one fp32 absmax per Blockwise8BlockSize =
// 256 elements, the granularity bitsandbytes' blockwise 8-bit optimizers
// use). StateBytes and RecordBytes give the bytes a state or a record of n
// elements takes: an Adam record is 12 bytes per element in fp32, 8 in
// bf16 and 6.03 in 8 bits. A record of such states (LayoutForFormat) holds
// the master, then each state: bf16 values, or its absmax (one float32
// per block) followed by its codes. Sub-groups of 8-bit states start on
// block boundaries (SubGroupSize a multiple of 256), so a step gives
// exactly the bits of Adam8Step (AdamBF16Step) on whole tensors, whatever
// the tier, pipeline depth, worker count or kernel
// (TestCompressedStatesBitForBit). ReadStates, VisitStates and snapshots
// give the states decoded to fp32, and LoadStates encodes what it is
// given; ReadEncodedStates and LoadEncodedStates move them as stored
// (codes and absmax), which resuming bit for bit needs: decoding and
// encoding again changes a block whose largest magnitude is negative (the
// signed map has +1 but not -1). Options.StateFormatFor picks the format
// per tensor (KeepFP32: fp32 under MinCompressedElems elements and for
// names such as "*embed*"), since 8-bit moments train sparse-gradient
// tables badly: an exp_avg_sq coded as zero beside a nonzero exp_avg moves
// a weight by lr*m/eps.
//
// The two maps are bitsandbytes' dynamic maps (SignedDynamicMap for
// exp_avg, UnsignedDynamicMap for exp_avg_sq), computed in float32 from
// their definition and checked against testdata/dynamic_map.golden, which
// testdata/dynamic_map.py derives independently. QuantMap defines the
// coding exactly: the absmax is the largest magnitude by bits (so NaNs and
// signed zeros give one answer whatever the order), a value is divided by
// it (correctly rounded; an all-zero block divides by 1) and coded as the
// nearest entry, a tie going to the larger one; reading back is
// map[code]*absmax. Unlike bitsandbytes' GPU kernels, which divide
// approximately and nudge a code whose entry's sign differs from the
// value's, zinf's coding is a function of the float32 value alone, so
// every kernel and every machine gives the same bytes.
//
// Adam8 and AdamBF16 run Adam over such states in one pass per block:
// dequantize (or widen), Adam's scalar-loop operations (so the master gets
// the bits Adam gives on the dequantized moments), requantize with the new
// absmax (or round). Adam8 equals Dequantize, Adam, Quantize on the whole
// tensor bit for bit on every kernel (TestAdam8MatchesReference), and a
// noisy linear regression trained with it ends within 3% of the fp32
// run's loss (TestAdam8Converges). The AVX2 kernel gathers the map entries
// of the codes, runs Adam's vector body, and finds each new code with one
// gather of a per-bucket entry (the top 16 bits of |value/absmax| pick the
// bucket, which holds at most one threshold, compared as an integer key);
// the differential test includes values on every threshold and bucket
// edge, and Go models of the kernel with one deviation each (ties to the
// lower entry, a reciprocal for the divide, a floating-point maximum, no
// zero guard, NaN codes, a skipped vector) show that it catches them. The
// AVX-512 body is generated too but not dispatched until it has passed the
// same test on an AVX-512 CPU (TestAdam8AVX512Candidate); AVX-512 machines
// run the AVX2 body. BenchmarkAdam8 (make bench-adam) compares one core's
// 8-bit and fp32 updates at 16 Mi elements and the fp32 update in the L2
// cache: the speed of Adam's arithmetic alone, which the 8-bit kernel
// cannot exceed since it runs every operation of Adam's body and more.
// On a shared 2-vCPU VM (AMD EPYC, Zen 4, AVX2 only; 5 interleaved
// rounds, medians per CPU-second) the fp32 kernel did 1.34 G elements/s
// out of cache (37 GB/s) and 1.82 in the L2 cache: one core's memory
// leaves at most 1.36x to gain there, short of the bar of 1.5x
// for any kernel. The 8-bit kernel did 0.32 (0.24x the fp32 kernel):
// bound by its four gathers per eight elements (a profile puts the most
// samples on them and on the divides) and its two extra divides.
//
// # Record layout
//
// A sub-group of n elements holds its states in one record (on NVMe and in
// pinned memory). Below StaggerMinElems (64 Ki) elements the three states
// are back to back. From there on they are staggered (RecordLayout): each
// state starts a page plus a cache line after the page-rounded end of the
// previous one, and master one cache line into the record, so that the
// three states and the gradient slice (page-aligned in the same buffer)
// never start at addresses congruent modulo a large power of two. Back to
// back, a 64 Mi element sub-group's four operands would lie exactly 2^28
// bytes apart and, on huge pages, compete for the same cache sets. The padding is at most
// 2.1% of a record (0.01% from 16 Mi elements); StateRecords and
// PinnedNeedBytes account for it.
package optimizer
