package optimizer

import (
	"errors"
	"fmt"
	ztensor "github.com/zinfio/zinf/tensor"
)

// Sentinel errors; test for them with errors.Is.
var (
	// ErrClosed: the optimizer was closed.
	ErrClosed = ztensor.ClosedError("optimizer: closed")
	// ErrNotRegistered: no tensor of that name was registered.
	ErrNotRegistered = errors.New("optimizer: tensor not registered")
	// ErrRegistered: a tensor of that name is registered already.
	ErrRegistered = errors.New("optimizer: tensor already registered")
	// ErrLength: a slice's length differs from the tensor's partition.
	ErrLength = errors.New("optimizer: length mismatch")
	// ErrFormat: states in another StateFormat than the optimizer's
	// (LoadEncodedStates).
	ErrFormat = errors.New("optimizer: state format mismatch")
	// ErrPoolTooSmall: the pool can never hold the buffers a tensor needs.
	ErrPoolTooSmall = errors.New("optimizer: pinned pool too small")
	// ErrStepOpen: a step transaction (BeginStep) is open.
	ErrStepOpen = errors.New("optimizer: a step transaction is open")
	// ErrStepEnded: the step transaction was committed or aborted already.
	ErrStepEnded = errors.New("optimizer: step transaction already ended")
	// ErrHandedOver: the tensor was handed over in this step already.
	ErrHandedOver = errors.New("optimizer: tensor already handed over in this step")
)

// Error describes a failed optimizer operation: what was being done, to
// which tensor (and sub-group), in which step, and the cause. It unwraps to
// the cause, so errors.Is(err, aio.ErrNoSpace), swapper.ErrChecksum,
// context.Canceled and the like work through it.
type Error struct {
	// Op is what failed: "register", "load", "read-state", "step" (the
	// step as a whole: closed, a transaction open or ended, cancelled
	// between tensors), "hand-over" (StepTxn.Tensor), "read-ahead"
	// (acquiring buffers, reading states), "grad" (reading gradients),
	// "update", "write-behind", "stage" (Params.StageUpdate), "commit".
	Op string
	// Tensor is the parameter tensor's name ("" when none applies).
	Tensor string
	// SubGroup is the sub-group's index within the tensor, or -1 when the
	// operation concerned the whole tensor.
	SubGroup int
	// SubGroups is the tensor's number of sub-groups (0 when unknown).
	SubGroups int
	// Step is the step being taken (1-based), 0 outside a step.
	Step int
	// Err is the cause.
	Err error
}

func (e *Error) Error() string {
	s := "optimizer: "
	if e.Step > 0 {
		s += fmt.Sprintf("step %d: ", e.Step)
	}
	s += e.Op
	if e.Tensor != "" {
		s += fmt.Sprintf(" of tensor %q", e.Tensor)
		if e.SubGroup >= 0 && e.SubGroups > 1 {
			s += fmt.Sprintf(" (sub-group %d of %d)", e.SubGroup, e.SubGroups)
		}
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }
