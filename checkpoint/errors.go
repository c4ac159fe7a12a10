package checkpoint

import (
	"errors"
	"fmt"
	"github.com/zinfio/zinf/tensor"
	"strings"
)

// Sentinel errors callers branch on with errors.Is. Every error this package
// returns for a checkpoint on disk wraps exactly one of the first four.
var (
	// ErrNotCheckpoint: the directory is missing or is not a zinf checkpoint
	// (no checkpoint.json, or one written by something else).
	ErrNotCheckpoint = errors.New("not a zinf checkpoint")
	// ErrVersion: a zinf checkpoint whose format version this build does not
	// read.
	ErrVersion = errors.New("unsupported checkpoint format version")
	// ErrCorrupt: a zinf checkpoint that is incomplete or damaged: a missing
	// manifest or tensor file, a truncated file, a checksum mismatch, a
	// manifest that contradicts itself or its files.
	ErrCorrupt = errors.New("checkpoint corrupt or incomplete")
	// ErrShape: tensors whose shapes differ from the model's.
	ErrShape = errors.New("tensor shape mismatch")

	// ErrExists: Save to a name that already holds a committed checkpoint
	// without SaveOptions.Overwrite, or to a name that holds something that
	// is not a checkpoint (never overwritten).
	ErrExists = errors.New("checkpoint already exists")
	// ErrInvalid: a State or options that cannot be saved (duplicate tensor
	// names, a size that does not match the shape, a bad file name, ...).
	ErrInvalid = errors.New("invalid checkpoint state or options")
	// ErrNotFound: no tensor of that name in the checkpoint (or rank).
	ErrNotFound = errors.New("tensor not in checkpoint")
	// ErrNoCheckpoint: Latest found no committed checkpoint under the root.
	ErrNoCheckpoint = errors.New("no committed checkpoint")
	// ErrSaveInFlight: SaveAsync gave up waiting (its context ended) for the
	// previous asynchronous save to finish.
	ErrSaveInFlight = errors.New("an asynchronous checkpoint save is still in flight")
	// ErrSnapshotTooLarge: an asynchronous save's snapshot would exceed
	// SaverOptions.MaxSnapshotBytes.
	ErrSnapshotTooLarge = errors.New("checkpoint snapshot larger than the allowed pinned memory")
	// ErrClosed: the Writer, Saver or Reader was closed.
	ErrClosed = tensor.ClosedError("checkpoint: closed")
)

// Error describes a failed checkpoint operation: what was done, on which
// path (a checkpoint directory or a file in it), which tensor when one is
// concerned, and the cause, which wraps one of the sentinels.
type Error struct {
	Op     string // "open", "save", "read", "verify", "check-shapes", "latest", ...
	Path   string // checkpoint directory or file
	Tensor string // tensor name, when the error concerns one tensor
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("checkpoint: ")
	b.WriteString(e.Op)
	if e.Tensor != "" {
		fmt.Fprintf(&b, " tensor %q", e.Tensor)
	}
	if e.Path != "" {
		if e.Tensor != "" {
			b.WriteString(" in")
		}
		b.WriteString(" ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// corruptf builds a cause wrapping ErrCorrupt.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// invalidf builds a cause wrapping ErrInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
