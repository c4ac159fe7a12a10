package comm

import (
	"context"
	"errors"
	"fmt"
)

// Op is a reduction operator.
type Op int

const (
	// Sum adds the ranks' values. With the rank-ordered reduction, element
	// i of the result is ((x0[i] + x1[i]) + x2[i]) + ... in the buffer's
	// precision, rank 0 first.
	Sum Op = iota
	// Max keeps the largest value (NaN wins, so an overflow check sees it).
	Max
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Max:
		return "max"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

func (o Op) valid() bool { return o == Sum || o == Max }

// Comm is one rank's handle on a world of ranks that run collectives
// together. Every rank must call the same collectives in the same order
// with matching arguments (counts, root, op); a mismatch the
// implementation can see ends the world with an error.
//
// Buffers belong to the caller: a collective reads send and writes recv
// only until it returns. A collective that fails on one rank fails on
// every rank: a rank whose context ends, that calls Abort or Close, or
// (where the implementation can tell) that dies, makes every collective
// in progress or to come return a *RankError naming that rank. Nothing
// waits forever: besides the context, implementations bound how long a
// collective waits for a rank that never arrives.
//
// A Comm is used from one goroutine at a time (the rank's loop); Rank,
// Size and Abort may be called from any goroutine.
type Comm interface {
	// Rank is this rank's index in [0, Size).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// AllGather gives every rank every rank's send, in rank order: rank
	// r contributes counts[r] bytes (len(send) == counts[r]) and recv
	// receives sum(counts) bytes, rank r's at offset sum(counts[:r]).
	// Chunks may differ in size, and be empty. send may be this rank's
	// own chunk of recv (gathering in place); otherwise it must not
	// overlap recv.
	AllGather(ctx context.Context, send, recv []byte, counts []int) error
	// ReduceScatter sums send (sum(counts) elements, the same layout on
	// every rank) over the ranks and leaves this rank's chunk —
	// counts[rank] elements at offset sum(counts[:rank]) — in recv.
	ReduceScatter(ctx context.Context, send, recv []float32, counts []int) error
	// ReduceScatterMany is ReduceScatter for ranks that contribute any
	// number of vectors each: rank r contributes per[r] of them (per is
	// the same on every rank and sums to at least 1; sends holds this
	// rank's per[rank] vectors of sum(counts) elements). The sum runs
	// over the vectors in the order of their rank, then of their place
	// in sends, starting from the first: a process that stands in for
	// several consecutive data-parallel ranks gets the same result, bit
	// for bit, as a world with one process per data-parallel rank.
	ReduceScatterMany(ctx context.Context, sends [][]float32, recv []float32, counts, per []int) error
	// AllReduce reduces buf over the ranks, in place, on every rank.
	AllReduce(ctx context.Context, buf []float32, op Op) error
	// AllReduceFloat64 is AllReduce for float64 values (norms, flags).
	AllReduceFloat64(ctx context.Context, buf []float64, op Op) error
	// Broadcast copies root's buf into every rank's buf (same length).
	Broadcast(ctx context.Context, buf []byte, root int) error
	// Barrier returns once every rank has entered it.
	Barrier(ctx context.Context) error
	// Abort ends the world: every collective in progress or to come, on
	// every rank, returns a *RankError naming this rank and err. It may be
	// called from any goroutine, more than once (the first error stays).
	Abort(err error)
	// Close leaves the world; a rank still waiting for this one gets a
	// *RankError. Close is idempotent.
	Close() error
}

// ErrClosed is returned by a collective on a closed Comm.
var ErrClosed = errors.New("comm: closed")

// ErrAborted is wrapped by the error a rank's Abort hands to the others
// when it gave none.
var ErrAborted = errors.New("comm: aborted")

// ErrMismatch says that ranks called different collectives, or the same
// one with arguments that do not agree.
var ErrMismatch = errors.New("comm: ranks disagree on the collective")

// ErrStalled says that a collective waited longer than the world's stall
// timeout for ranks that never arrived.
var ErrStalled = errors.New("comm: collective stalled")

// RankError is how a world that failed reports it: Rank is the rank that
// failed (or -1 when no single rank is to blame), Op the collective, Err
// the cause.
type RankError struct {
	Rank int
	Op   string
	Err  error
}

func (e *RankError) Error() string {
	if e.Rank < 0 {
		return fmt.Sprintf("comm: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("comm: %s: rank %d failed: %v", e.Op, e.Rank, e.Err)
}

func (e *RankError) Unwrap() error { return e.Err }

// Offsets returns the offset of each rank's chunk for counts, and their
// sum.
func Offsets(counts []int) (off []int, total int) {
	off = make([]int, len(counts))
	for r, c := range counts {
		off[r] = total
		total += c
	}
	return off, total
}

// checkMany validates ReduceScatterMany's arguments on rank me and
// returns the total element count.
func checkMany(sends [][]float32, recv []float32, counts, per []int, me, size int) (int, error) {
	total, err := checkCounts("reduce-scatter", counts, size)
	if err != nil {
		return 0, err
	}
	if len(per) != size {
		return 0, fmt.Errorf("comm: reduce-scatter: %d contribution counts for a world of %d ranks", len(per), size)
	}
	vectors := 0
	for r, p := range per {
		if p < 0 {
			return 0, fmt.Errorf("comm: reduce-scatter: per[%d] = %d: must be >= 0", r, p)
		}
		vectors += p
	}
	if vectors == 0 {
		return 0, errors.New("comm: reduce-scatter: no rank contributes a vector (per sums to 0)")
	}
	if len(sends) != per[me] {
		return 0, fmt.Errorf("comm: reduce-scatter: rank %d sends %d vectors, per[%d] says %d", me, len(sends), me, per[me])
	}
	for i, s := range sends {
		if len(s) != total {
			return 0, fmt.Errorf("comm: reduce-scatter: rank %d's vector %d has %d elements (counts sum to %d)", me, i, len(s), total)
		}
	}
	if len(recv) != counts[me] {
		return 0, fmt.Errorf("comm: reduce-scatter: rank %d receives into %d elements (its count is %d)", me, len(recv), counts[me])
	}
	return total, nil
}

// checkCounts validates counts for a world of size ranks.
func checkCounts(op string, counts []int, size int) (total int, err error) {
	if len(counts) != size {
		return 0, fmt.Errorf("comm: %s: %d counts for a world of %d ranks", op, len(counts), size)
	}
	for r, c := range counts {
		if c < 0 {
			return 0, fmt.Errorf("comm: %s: counts[%d] = %d: must be >= 0", op, r, c)
		}
		total += c
	}
	return total, nil
}
