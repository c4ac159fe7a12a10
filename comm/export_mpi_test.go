//go:build mpi && cgo

package comm

import "context"

// Bare MPI collectives and the binding's native reduce-scatter, for the
// benchmark case of TestMPIRank.

func BareAllGather(c Comm, send, recv []byte) error { return c.(*mpiWorld).bareAllGather(send, recv) }

func BareReduceScatter(c Comm, send, recv []float32) error {
	return c.(*mpiWorld).bareReduceScatter(send, recv)
}

func BareAlltoall(c Comm, send, recv []float32) error { return c.(*mpiWorld).bareAlltoall(send, recv) }

func NativeReduceScatter(c Comm, send, recv []float32, counts []int) error {
	return c.(*mpiWorld).nativeReduceScatterOf(context.Background(), send, recv, counts)
}
