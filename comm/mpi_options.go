package comm

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// ErrNoMPI is returned by NewMPI in a binary built without the MPI
// binding.
var ErrNoMPI = errors.New("comm: this binary was built without MPI: rebuild with -tags mpi (needs cgo, pkg-config and Open MPI's development files, Debian's libopenmpi-dev), e.g. make build-mpi")

// MPIOptions configure NewMPI. Zero values take the defaults.
type MPIOptions struct {
	// StallTimeout bounds how long a collective waits for the other
	// ranks before the world fails with ErrStalled. Default
	// DefaultStallTimeout; negative: no bound (Abort, a failure note, a
	// dead peer on this host and the context still end a wait).
	StallTimeout time.Duration
	// NativeReductions uses MPI's own reductions (MPI_Ireduce_scatter,
	// MPI_Iallreduce) instead of the rank-ordered ones. They add in the
	// library's order (a tree or a ring, e.g. (x0+x2)+(x1+x3)), so
	// results are NOT bit-exact: they differ from a sequential sum and
	// from the in-process world in the last bits, and Max does not
	// promise to propagate NaN. Default false: rank-ordered, bit-exact.
	NativeReductions bool
	// SegmentBytes is the largest piece of one rank's chunk that one
	// all-to-all round of the rank-ordered reduce-scatter moves: the
	// reduce-scatter's scratch memory is at most world size x vectors x
	// SegmentBytes. Default 4 MiB; a multiple of 4.
	SegmentBytes int
	// LivenessInterval is how often a rank checks that the processes of
	// the other ranks on its host are still there (a rank killed with
	// SIGKILL sends no note). Default 100 ms.
	LivenessInterval time.Duration
	// IdlePoll is how often the binding looks for failure notes and dead
	// peers while no collective runs. Default 50 ms.
	IdlePoll time.Duration
	// PollMin and PollMax bound the sleep between tests of a collective
	// in flight once it has not completed after a short spin (ranks on
	// shared cores must not spin). Default 20 µs and 1 ms.
	PollMin, PollMax time.Duration
	// HeartbeatInterval is how often a rank tells every other that its
	// process runs (a byte on a communicator of its own, sent by the
	// binding's goroutine whether or not a collective runs). Default
	// DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long a rank waiting in a collective
	// tolerates silence from another rank's process before the world
	// fails with a *RankError naming that rank and wrapping
	// ErrRankSilent: a process stopped (SIGSTOP, a debugger) or hung is
	// named within seconds instead of holding the job for StallTimeout.
	// A rank that is slow but running keeps sending. Default
	// DefaultHeartbeatTimeout; negative: no check (StallTimeout still
	// bounds the wait). At least 2 x HeartbeatInterval.
	HeartbeatTimeout time.Duration
	// FailLinger is how long after a failure Close returns: mpirun ends
	// every rank of a job as soon as one exits with an error status, so
	// a rank lingers for the others to see the failure and report it
	// (and for its failure notes to leave). Default 1 s.
	FailLinger time.Duration
}

// The heartbeat defaults (MPIOptions).
const (
	DefaultHeartbeatInterval = time.Second
	DefaultHeartbeatTimeout  = 10 * time.Second
)

func (o *MPIOptions) validate() error {
	var errs []error
	if o.StallTimeout == 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = 4 << 20
	}
	if o.SegmentBytes < 4 || o.SegmentBytes%4 != 0 {
		errs = append(errs, fmt.Errorf("comm: MPIOptions.SegmentBytes %d: must be a positive multiple of 4", o.SegmentBytes))
	}
	for _, d := range []struct {
		name string
		p    *time.Duration
		def  time.Duration
	}{{"LivenessInterval", &o.LivenessInterval, 100 * time.Millisecond}, {"IdlePoll", &o.IdlePoll, 50 * time.Millisecond},
		{"PollMin", &o.PollMin, 20 * time.Microsecond}, {"PollMax", &o.PollMax, time.Millisecond}, {"FailLinger", &o.FailLinger, time.Second},
		{"HeartbeatInterval", &o.HeartbeatInterval, DefaultHeartbeatInterval}} {
		if *d.p == 0 {
			*d.p = d.def
		}
		if *d.p < 0 {
			errs = append(errs, fmt.Errorf("comm: MPIOptions.%s %v: must be positive", d.name, *d.p))
		}
	}
	if o.HeartbeatTimeout > 0 && o.HeartbeatInterval > 0 && o.HeartbeatTimeout < 2*o.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("comm: MPIOptions.HeartbeatTimeout %v: must be at least twice HeartbeatInterval (%v), or negative for no check", o.HeartbeatTimeout, o.HeartbeatInterval))
	}
	if o.PollMax < o.PollMin {
		errs = append(errs, fmt.Errorf("comm: MPIOptions.PollMax %v is below PollMin %v", o.PollMax, o.PollMin))
	}
	return errors.Join(errs...)
}

// LaunchedByMPI reports whether this process was started by Open MPI's
// launcher (mpirun, mpiexec, or srun with Open MPI's PMIx support), and
// its rank and world size as the launcher gave them
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE).
func LaunchedByMPI() (rank, size int, ok bool) {
	s, okS := os.LookupEnv("OMPI_COMM_WORLD_SIZE")
	r, okR := os.LookupEnv("OMPI_COMM_WORLD_RANK")
	if !okS || !okR {
		return 0, 0, false
	}
	size, err1 := strconv.Atoi(s)
	rank, err2 := strconv.Atoi(r)
	if err1 != nil || err2 != nil || size < 1 || rank < 0 || rank >= size {
		return 0, 0, false
	}
	return rank, size, true
}
