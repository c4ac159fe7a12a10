// Package comm is how zinf's ranks talk to each other: the collectives
// ZeRO-3 partitioning needs (all-gather a layer's parameters from every
// rank's partition, reduce-scatter gradients into each rank's partition,
// all-reduce global quantities such as the gradient norm or an overflow
// flag, broadcast, barrier).
//
// Comm is the interface; NewLocal builds a world of ranks inside one
// process (each rank on its own goroutine), which tests and simulated
// multi-rank runs use. NewMPI joins a world of processes started by
// Open MPI's mpirun (across machines too); it needs the mpi build tag
// (cgo and Open MPI's development files: `make build-mpi`), and without
// it returns ErrNoMPI, so the default build needs no MPI. For device
// memory, package nccl (comm/nccl) offers NCCL's collectives, loaded at run
// time.
//
//	c, err := comm.NewMPI(comm.MPIOptions{}) // under: mpirun -np 4 ./prog
//	defer c.Close()
//	rt, err := zinf.Open(cfg, model, zinf.Options{Rank: c.Rank(), WorldSize: c.Size(), Comm: c})
//
// # MPI
//
// The binding wraps each MPI call in a small C function, requests
// MPI_THREAD_SERIALIZED and makes every call from one goroutine locked
// to its OS thread; collectives are MPI's non-blocking ones (their
// buffers pinned with runtime.Pinner), polled, so that a failure can
// end them: a rank's Abort sends a note with its error to every other
// rank (on a communicator of its own); a rank's process that dies
// (SIGKILL, a crash) is noticed by the ranks on the same host within
// MPIOptions.LivenessInterval (by PID and start time); ranks on other
// hosts are stopped by mpirun, which ends a job as soon as one of its
// processes fails, or by the stall timeout. A rank whose process is
// there but does not run (stopped with SIGSTOP, hung) is named by the
// heartbeat: each rank's goroutine sends a byte to every other every
// MPIOptions.HeartbeatInterval (1 s), in a collective or not, and a rank
// waiting in a collective that has heard nothing from a peer for
// MPIOptions.HeartbeatTimeout (10 s) fails the world with a *RankError
// naming it and wrapping ErrRankSilent. Open MPI does not survive a
// dead peer (no fault tolerance in 4.1): a failed world is never used
// again, and its processes exit.
//
// The rank-ordered reduce-scatter is an MPI_Ialltoallv of the chunks
// (in segments, MPIOptions.SegmentBytes) followed by a local sum in rank
// order; the rank-ordered all-reduce an all-gather followed by the same
// sum. MPIOptions.NativeReductions selects MPI's own reduce-scatter and
// all-reduce instead, which are faster at scale but add in the
// library's order: not bit-exact.
//
// Reductions are rank-ordered by default: element i of a sum is
// ((x0[i] + x1[i]) + x2[i]) + ..., rank 0 first, in the buffer's
// precision, so a distributed run equals a sequential reference bit for
// bit. ReduceScatterMany lets a rank contribute several vectors (a
// process standing in for several data-parallel ranks) in the same
// order. An implementation that offers its library's native reduction (a
// tree, a ring) says so, and says that it is not bit-exact.
//
// Failure is collective: when one rank's context ends, or it calls Abort
// or Close, or it never arrives within the stall timeout, every rank's
// collective returns a *RankError naming the rank at fault. Nothing waits
// forever.
package comm
