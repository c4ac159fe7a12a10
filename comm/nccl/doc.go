// Package nccl runs zinf's collectives on device memory with NVIDIA's
// NCCL, loaded at run time (dlopen of libnccl.so.2, or the library
// ZINF_NCCL_LIBRARY names) like the CUDA driver, so that no build needs
// NCCL or a GPU.
//
//	boot, _ := comm.NewMPI(comm.MPIOptions{})     // any comm.Comm: it carries NCCL's unique id
//	dev, _ := cuda.Open(cuda.Options{Ordinal: local rank})
//	c, err := nccl.New(boot, dev, nccl.Options{})  // collective: every rank calls it
//	defer c.Close()
//	err = c.AllGather(ctx, part, full, counts)    // accel.Mem buffers of dev
//
// Every NCCL call runs on one goroutine locked to its OS thread, with the
// device's context current (CUDA's current context is per thread), and
// is queued on a stream of its own; the binding polls the stream
// (cuStreamQuery) and, meanwhile, NCCL's asynchronous error, the
// context and the stall timeout; a failure aborts the communicator
// (ncclCommAbort, which ends kernels waiting for a peer) and the
// bootstrap Comm, and every later call returns the *comm.RankError.
//
// Reductions are rank-ordered, and so bit-exact, by default: the
// reduce-scatter moves every rank's chunks with grouped ncclSend/ncclRecv
// (an all-to-all) into device scratch memory, and the chunks are added
// in rank order on the host (zinf compiles no GPU kernels), then copied
// back; the all-reduce all-gathers and adds likewise. NCCL's own
// ncclReduceScatter and ncclAllReduce (a ring or a tree: another order,
// not bit-exact) are Options.NativeReductions. The all-gather is
// ncclAllGather for equal chunks, grouped sends and receives for
// unequal ones.
//
// What was checked, and where: the binding's calls, argument order,
// grouping, error handling and the rank-ordered arithmetic run in the
// tests against a stand-in NCCL (testdata/nccl_standin.c: the ranks are
// threads of one process over the CUDA stand-in's host-backed memory),
// on every machine. Against the real library on a GPU it runs only with
// ZINF_GPU_TESTS=1 (make gpu-tests), one rank per GPU; see the README's
// GPU section for what has been run there.
package nccl
