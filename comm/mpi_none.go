//go:build !mpi || !cgo

package comm

// MPIBuilt reports whether this binary has the MPI binding (the mpi build
// tag).
func MPIBuilt() bool { return false }

// NewMPI needs the mpi build tag; without it, it returns ErrNoMPI.
func NewMPI(opts MPIOptions) (Comm, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return nil, ErrNoMPI
}
