// Package zinf trains and serves models larger than the memory that holds
// them. Parameters, optimizer states and gradients live on GPU, CPU (pinned
// host memory) or NVMe, as a config file says, and move between tiers with
// overlapped asynchronous swaps.
//
// Open takes a config (DeepSpeed's ds_config.json keys are understood as
// they are) and a Model (the tensors by layer) and plans before it builds:
// where each tensor lives and how far ahead to prefetch, from each NVMe
// path's bandwidth (configured, from a `zinf tune` result, cached or
// probed; see NVMeBandwidth); how the pinned pool is split between its
// consumers (Reservations), refusing a pool below the minimum with a
// PoolTooSmallError; and the disk the swap files take with their
// copy-on-write copies, refusing an NVMe path without that much free space.
// Then it builds the pinned pool, the async I/O engine, the swap stores,
// the device (a simulated GPU when none is present) and the param, gradient
// and optimizer swappers. PlanModel gives the same plan without opening
// anything (`zinf plan` prints it). The planner is package plan, a pure
// function: Open checks its inputs (plan.Check), measures what the plan
// depends on (memory, the NVMe bandwidth, the swap stores' geometry),
// makes the plan (plan.Make) and builds each component from it alone.
//
// A training loop gives each tensor its initial values (Init), begins and
// ends each layer in forward and backward (a barrier that also prefetches
// what comes next), reads parameters into its own buffers, hands over
// gradients as backward produces them (AccumulateGrad, StepLayer), and
// calls Step. Close drains I/O, frees pinned memory and removes the
// scratch swap files; methods called after it return errors matching
// ErrClosed.
//
// SaveCheckpoint, SaveCheckpointAsync, SaveCheckpointShared and
// LoadCheckpoint save and restore every rank's parameters and optimizer
// states (package checkpoint:
// safetensors files, a crash-safe commit, loads at any world size). A
// Checkpointer saves a loop's checkpoints every N steps into one root,
// keeping the newest few; after a crash, ResumeLatest loads the newest
// committed one.
//
// # The optimizer step
//
// Step is a complete DeepSpeed-style step, in the standard order: unscale,
// check overflow, clip, update. With gradient_clipping or fp16 on it first
// reduces the sum of the squares of every rank's accumulated gradients —
// computed by the gradient swapper from each gradient's pinned copy as it
// is written behind, so the norm costs no read from NVMe — in float64:
// each tensor's partition element by element, the tensors in
// Model.Tensors order, then the ranks' sums in rank order through
// Options.Comm (required at world size > 1; comm.NewLocal for ranks in one
// process). fp16 skips a step whose gradients hold an inf or NaN and
// lowers the loss scale (LossScale is what the loop multiplies its loss
// by); otherwise every gradient is multiplied by one float32 factor,
// 1/(S*max(1, (norm+1e-6)/gradient_clipping)), and the optimizer updates
// with the schedule's learning rate (SetLR lets a loop set it instead).
// config/doc.go and the schedule package have the exact formulas and the
// DeepSpeed behaviour they follow.
//
// World 1 and world 4 sum the squares in different orders (a whole tensor
// against four partitions, then four rank sums), so their norms can differ
// in the last bits of a float64; the clip factor, rounded to float32, is
// then usually the same, but not always. A world of N ranks equals,
// bit for bit, an in-memory reference that sums in the same order
// (TestTrainStepDifferential has one).
//
// # Ranks as processes
//
// With Options.Comm and GatherLayers each process runs one rank's
// runtime: BeginLayer all-gathers the layer's full parameters from every
// rank's partitions (gathering the next layer of the pass on the
// runtime's collective goroutine while the loop computes; two layers'
// worth of pinned memory is reserved for it, Reservations.GatherBytes),
// ReadParam gives full tensors, ReduceGrad and ReduceGrads reduce-scatter
// each rank's own gradients into the partitions in rank order, and
// SaveCheckpointShared saves every rank's part of one checkpoint. The
// collectives run in the order the loop asks for them, the same on every
// rank; Collective queues a loop's own among them. comm.NewMPI (the mpi
// build tag) joins a job started by mpirun; comm.NewLocal stands in for
// it with goroutines. Results equal the in-process world of the same size
// bit for bit.
//
// StepTensor keeps the overlap: each layer's update still starts during
// backward, speculating that the step needs neither clipping nor a skip.
// Step commits it when that was right; otherwise it rolls the step back
// (nothing of it was committed: the copy-on-write store keeps the old
// states) and takes the right one. zinf.speculate chooses always, never or
// auto (speculate unless more than half of the last 8 steps needed a
// correction); Metrics().Train counts commits, rollbacks and the time the
// rollbacks took, LastStep describes the last step.
//
// Observability: Options.Trace takes a trace.Sink that receives the run's
// timeline (each layer's compute and the loop's waits, every swap store
// read and write, each step and rollback; trace.ChromeWriter writes a file
// Perfetto opens; with no sink each hook is a nil check). Metrics is a
// snapshot of the counters, safe from any goroutine; package metrics
// exports them, and the stores' per-path bytes and latency histograms, as
// Prometheus metrics.
//
// The packages underneath can be used alone: aio (the I/O engine), buffers
// (the pinned pool), swapper and its param/optimizer/grad subpackages,
// policy (placement and prefetch scheduling), config, schedule (learning
// rates and the fp16 loss scale), comm (collectives between ranks), accel
// and gds.
package zinf
