package trace

import (
	"sync/atomic"
	"time"
)

// Kind says what an Event records.
type Kind uint8

// The kinds of events. Spans have End after Start; Rollback may be a span
// (the time spent discarding) or an instant (End == Start).
const (
	// Compute is a layer in use by the loop: from BeginLayer's return to
	// EndLayer (Pass says forward or backward). Waits on zinf inside it
	// are Wait events of their own.
	Compute Kind = iota + 1
	// Wait is the loop blocked on zinf: a layer's barrier (Layer set), a
	// gradient hand-off (Name is the tensor). Where says which.
	Wait
	// Read and Write are swap store operations (a swap-in, a swap-out):
	// from submission to completion. Where is the store ("param", "grad",
	// "optim"), Name the tensor, Bytes the bytes moved.
	Read
	Write
	// OptRead, OptUpdate and OptWrite are the stages of one optimizer
	// sub-group in a step: its state and gradient read, its update, its
	// write-behind. Name is the tensor, SubGroup its index.
	OptRead
	OptUpdate
	OptWrite
	// Step is one call of the runtime's optimizer step (Runtime.Step),
	// from its start to its return; Failed says whether it returned an
	// error.
	Step
	// Rollback is a speculative step discarded (its update began during
	// the backward pass and had to be redone or dropped).
	Rollback
	numKinds
)

var kindNames = [numKinds]string{"", "compute", "wait", "read", "write", "optimizer read", "optimizer update", "optimizer write", "step", "rollback"}

// String returns the kind's name ("compute", "wait", "read", ...).
func (k Kind) String() string {
	if k > 0 && k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

// Valid reports whether k is one of the kinds above.
func (k Kind) Valid() bool { return k > 0 && k < numKinds }

// Event is one span of a run's timeline (or an instant, End == Start).
// Fields a kind does not use are zero, Layer and SubGroup -1.
type Event struct {
	Kind Kind
	// Failed marks an operation or step that returned an error.
	Failed bool
	// Rank is the runtime's rank; Step the number of optimizer steps it
	// had completed when the event began: the first step's events carry
	// 0, the second's 1.
	Rank int32
	Step int64
	// Layer is the model layer (Compute, Wait at a barrier), SubGroup the
	// optimizer sub-group; -1 when none.
	Layer, SubGroup int32
	// Bytes is what an I/O event moved (or would have, when it failed).
	Bytes int64
	// Name is the tensor, when there is one.
	Name string
	// Where says where the event happened: the pass of a Compute event
	// ("forward", "backward", "pass"), the store of an I/O event ("param",
	// "grad", "optim"), what a Wait waited for ("layer", "gradient").
	Where string
	// Start and End bound the span.
	Start, End time.Time
}

// Sink receives a run's events. Record is called from the loop's
// goroutine and from I/O completions, concurrently: it must be safe for
// concurrent use and quick (buffer and return). The Event is a value;
// keep it, not pointers into it. A nil Sink means tracing is off, and
// the code that would emit events costs a nil check and nothing else.
type Sink interface {
	Record(e Event)
}

// Tagged returns a Sink that stamps Rank, Where (when empty) and the step
// counter's value (when step is not nil) onto each event before passing it
// to s: what a runtime gives the swap stores it opens, which know neither.
// Tagged(nil, ...) is nil.
func Tagged(s Sink, rank int, where string, step *atomic.Int64) Sink {
	if s == nil {
		return nil
	}
	return &tagged{s: s, rank: int32(rank), where: where, step: step}
}

type tagged struct {
	s     Sink
	rank  int32
	where string
	step  *atomic.Int64
}

func (t *tagged) Record(e Event) {
	e.Rank = t.rank
	if e.Where == "" {
		e.Where = t.where
	}
	if t.step != nil {
		e.Step = t.step.Load()
	}
	t.s.Record(e)
}

// Func adapts a function to a Sink (tests, small consumers).
type Func func(Event)

// Record calls f(e).
func (f Func) Record(e Event) { f(e) }
