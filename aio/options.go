package aio

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// DirectPolicy says whether files are opened with O_DIRECT.
type DirectPolicy int

const (
	// DirectOptional opens with O_DIRECT and, when the filesystem refuses it,
	// falls back to buffered I/O with one warning. It is the default.
	DirectOptional DirectPolicy = iota
	// DirectRequired opens with O_DIRECT or fails with ErrNoDirect.
	DirectRequired
	// DirectOff never uses O_DIRECT.
	DirectOff
)

// String returns the policy's config spelling.
func (p DirectPolicy) String() string {
	switch p {
	case DirectRequired:
		return "required"
	case DirectOff:
		return "off"
	default:
		return "optional"
	}
}

// ParseDirectPolicy reads "required", "optional" or "off" (case-insensitive).
func ParseDirectPolicy(s string) (DirectPolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "required", "on", "true":
		return DirectRequired, nil
	case "optional", "":
		return DirectOptional, nil
	case "off", "false":
		return DirectOff, nil
	}
	return 0, fmt.Errorf("aio: unknown O_DIRECT policy %q (allowed: required, optional, off)", s)
}

// Backend names.
const (
	BackendAuto   = "auto"
	BackendUring  = "uring"
	BackendLibaio = "libaio"
	BackendPosix  = "posix"
)

// Backends lists the concrete backends in the order auto tries them.
var Backends = []string{BackendUring, BackendLibaio, BackendPosix}

// Defaults, with DeepNVMe's meaning (DeepSpeed's "aio" config section).
const (
	// DefaultBlockSizeBytes is DeepSpeed's aio.block_size default: 1 MiB.
	DefaultBlockSizeBytes = 1 << 20
	// DefaultQueueDepth is DeepSpeed's aio.queue_depth default.
	DefaultQueueDepth = 8
	// DefaultIntraOpParallelism is DeepSpeed's aio.intra_op_parallelism default.
	DefaultIntraOpParallelism = 1
	// MaxIntraOpParallelism bounds the workers per engine.
	MaxIntraOpParallelism = 64
	// MaxQueueDepth bounds the pieces in flight per worker.
	MaxQueueDepth = 4096
)

// Options configure an Engine. The zero value is usable: EnsureDefaults
// fills every zero field.
type Options struct {
	// Backend is "auto" (default), "uring", "libaio" or "posix".
	Backend string
	// BlockSizeBytes is the size of the pieces a request is split into.
	// Default 1 MiB. Under O_DIRECT it must be a multiple of the file's
	// alignment (checked per request).
	BlockSizeBytes int
	// QueueDepth is the number of pieces kept in flight per worker.
	// Default 8.
	QueueDepth int
	// IntraOpParallelism is the number of workers (each with its own ring
	// or thread pool) a request is spread over. Default 1.
	IntraOpParallelism int
	// SingleSubmit submits pieces one system call each instead of in batches
	// (DeepNVMe's single_submit). Default false.
	SingleSubmit bool
	// SerialEvents is the negation of DeepNVMe's overlap_events (default
	// true): when set, a worker waits for every piece of a batch to complete
	// before it submits the next batch instead of refilling the queue as
	// completions arrive. Default false (overlap on).
	SerialEvents bool
	// Direct is the O_DIRECT policy used by OpenFile. Default DirectOptional.
	Direct DirectPolicy
	// Logger receives warnings (O_DIRECT fallback, backend choice). Default
	// slog.Default().
	Logger *slog.Logger
	// Faults, when set, is consulted before every piece is issued; tests use
	// it to inject errors, short transfers and latency. Nil in production.
	Faults FaultHook
}

// EnsureDefaults fills zero fields with their documented defaults.
func (o *Options) EnsureDefaults() {
	if o.Backend == "" {
		o.Backend = BackendAuto
	}
	if o.BlockSizeBytes == 0 {
		o.BlockSizeBytes = DefaultBlockSizeBytes
	}
	if o.QueueDepth == 0 {
		o.QueueDepth = DefaultQueueDepth
	}
	if o.IntraOpParallelism == 0 {
		o.IntraOpParallelism = DefaultIntraOpParallelism
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid field at once.
func (o *Options) Validate() error {
	var errs []error
	switch o.Backend {
	case BackendAuto, BackendUring, BackendLibaio, BackendPosix:
	default:
		errs = append(errs, fmt.Errorf("aio: backend %q is unknown (allowed: auto, uring, libaio, posix)", o.Backend))
	}
	if o.BlockSizeBytes <= 0 || o.BlockSizeBytes&(o.BlockSizeBytes-1) != 0 && o.BlockSizeBytes%4096 != 0 {
		errs = append(errs, fmt.Errorf("aio: block size %d is invalid (allowed: a positive power of two or multiple of 4096)", o.BlockSizeBytes))
	}
	if o.QueueDepth <= 0 || o.QueueDepth > MaxQueueDepth {
		errs = append(errs, fmt.Errorf("aio: queue depth %d is invalid (allowed: 1..%d)", o.QueueDepth, MaxQueueDepth))
	}
	if o.IntraOpParallelism <= 0 || o.IntraOpParallelism > MaxIntraOpParallelism {
		errs = append(errs, fmt.Errorf("aio: intra-op parallelism %d is invalid (allowed: 1..%d)", o.IntraOpParallelism, MaxIntraOpParallelism))
	}
	switch o.Direct {
	case DirectOptional, DirectRequired, DirectOff:
	default:
		errs = append(errs, fmt.Errorf("aio: O_DIRECT policy %d is unknown", int(o.Direct)))
	}
	return errors.Join(errs...)
}
