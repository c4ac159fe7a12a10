// Package comm is how zinf's ranks talk to each other: the collectives
// ZeRO-3 partitioning needs (all-gather a layer's parameters from every
// rank's partition, reduce-scatter gradients into each rank's partition,
// all-reduce global quantities such as the gradient norm or an overflow
// flag, broadcast, barrier).
//
// Comm is the interface; NewLocal builds a world of ranks inside one
// process (each rank on its own goroutine), which tests and simulated
// multi-rank runs use. Other implementations (MPI across processes, NCCL
// for device buffers) satisfy the same contract.
//
// Reductions are rank-ordered by default: element i of a sum is
// ((x0[i] + x1[i]) + x2[i]) + ..., rank 0 first, in the buffer's
// precision, so a distributed run equals a sequential reference bit for
// bit. An implementation that offers its library's native reduction (a
// tree, a ring) says so, and says that it is not bit-exact.
//
// Failure is collective: when one rank's context ends, or it calls Abort
// or Close, or it never arrives within the stall timeout, every rank's
// collective returns a *RankError naming the rank at fault. Nothing waits
// forever.
package comm
