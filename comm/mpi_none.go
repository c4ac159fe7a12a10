//go:build !mpi || !cgo

package comm

import "errors"

// ErrNoMPI is returned by NewMPI in a binary built without the MPI
// binding.
var ErrNoMPI = errors.New("comm: this binary was built without MPI: rebuild with -tags mpi (needs cgo, pkg-config and Open MPI's development files, Debian's libopenmpi-dev), e.g. make build-mpi")

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
