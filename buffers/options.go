package buffers

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"strings"
	"time"
)

// Purpose says what a buffer holds. The pool keeps its accounting (bytes in
// use, outstanding buffers) per purpose, for metrics and leak reports.
type Purpose uint8

// The purposes a buffer can be acquired for.
const (
	PurposeParams      Purpose = iota // model parameters (ZeRO-3 partitions)
	PurposeOptimizer                  // fp32 master weights and optimizer state
	PurposeGradients                  // gradient partitions
	PurposeStaging                    // bounce buffers for I/O and device copies
	PurposeCheckpoint                 // checkpoint reading and writing
	PurposeCollectives                // full tensors gathered from every rank's partition
	NumPurposes                       // the number of purposes; not a purpose
)

var purposeNames = [NumPurposes]string{"params", "optimizer", "gradients", "staging", "checkpoint", "collectives"}

// String returns the purpose's lower-case name ("params", "optimizer",
// "gradients", "staging", "checkpoint", "collectives"), or "purpose(N)" for
// an invalid value.
func (p Purpose) String() string {
	if p < NumPurposes {
		return purposeNames[p]
	}
	return fmt.Sprintf("purpose(%d)", uint8(p))
}

// Valid reports whether p is one of the defined purposes.
func (p Purpose) Valid() bool { return p < NumPurposes }

// PinPolicy says whether the arena is locked into RAM with mlock(2).
type PinPolicy int

const (
	// PinAuto pins the arena when the memlock limit (RLIMIT_MEMLOCK, or
	// CAP_IPC_LOCK) allows it; otherwise the pool continues with unpinned
	// memory and logs one warning that names the limit, the bytes wanted and
	// how to raise the limit (ulimit -l, LimitMEMLOCK=).
	PinAuto PinPolicy = iota
	// PinRequired makes NewPool fail with an error wrapping ErrPinned when
	// the arena cannot be pinned.
	PinRequired
	// PinOff never pins. The memory is still page aligned and off the Go heap.
	PinOff
)

// String returns "auto", "required" or "off".
func (p PinPolicy) String() string {
	switch p {
	case PinAuto:
		return "auto"
	case PinRequired:
		return "required"
	case PinOff:
		return "off"
	}
	return fmt.Sprintf("PinPolicy(%d)", int(p))
}

// ParsePinPolicy parses "auto", "required" or "off" (the names String
// returns), as a config file spells them.
func ParsePinPolicy(s string) (PinPolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return PinAuto, nil
	case "required", "require", "on":
		return PinRequired, nil
	case "off", "none", "disabled":
		return PinOff, nil
	}
	return PinAuto, fmt.Errorf("buffers: pin policy %q: want one of auto, required, off", s)
}

// Defaults used by EnsureDefaults.
const (
	// DefaultCapacityBytes is the arena budget when Options.CapacityBytes is
	// zero: 256 MiB, enough for a few bounce buffers of the default aio block
	// size without pinning more RAM than a desktop's memlock limit dreams of.
	// Real runs size it from the config (offload_param / offload_optimizer
	// buffer_count x buffer_size).
	DefaultCapacityBytes int64 = 256 << 20
	// DefaultMinBufferBytes is the smallest size class (the allocation
	// granule) when Options.MinBufferBytes is zero: 4096, or the page size
	// where pages are larger.
	DefaultMinBufferBytes = 4096
	// DefaultStallTimeout is Options.StallTimeout's default: far longer
	// than any single transfer or update takes, so only a real deadlock —
	// every byte held by holders that wait themselves — reaches it.
	DefaultStallTimeout = 2 * time.Minute
	// MaxMinBufferBytes bounds MinBufferBytes (1 GiB).
	MaxMinBufferBytes = 1 << 30
	// maxGranules bounds CapacityBytes/MinBufferBytes: the allocator keeps
	// 9 bytes of Go-heap metadata per granule and indexes granules with int32.
	maxGranules = 1<<31 - 1
)

// Options configures a Pool. The zero value is usable: EnsureDefaults fills
// every zero field.
type Options struct {
	// CapacityBytes is the arena's byte budget: all buffers together never
	// hold more. Default DefaultCapacityBytes (256 MiB). It is rounded up to
	// a multiple of MinBufferBytes (hence of the page size). The largest
	// single buffer is the largest power-of-two multiple of MinBufferBytes
	// that fits in the capacity, so a power-of-two capacity lets one buffer
	// span the whole arena.
	CapacityBytes int64
	// MinBufferBytes is the smallest size class and the allocation granule:
	// every buffer's capacity is its length rounded up to a multiple of it,
	// and every buffer starts at an address aligned to it. It must be a power
	// of two, at least the page size (so buffers are page aligned and fit
	// O_DIRECT) and at most MaxMinBufferBytes. Default 4096 (or the page
	// size if larger). The allocator keeps about 9 bytes of metadata per
	// granule of capacity, so very large arenas may want a larger granule.
	MinBufferBytes int
	// Pin is the pinning policy. Default PinAuto.
	Pin PinPolicy
	// Logger receives the unpinned-memory warning and misuse reports.
	// Default slog.Default().
	Logger *slog.Logger
	// Reservations gives purposes their own region of the arena, in bytes
	// (each rounded up to MinBufferBytes): a purpose with a reservation is
	// served only from it, so its consumer can neither starve nor be starved
	// by another. Purposes left at 0 share what the reservations leave.
	// Their sum must not exceed the capacity. Default: none.
	Reservations [NumPurposes]int64
	// StallTimeout bounds how long an Acquire may wait while its region
	// sees no release at all: then it fails with ErrStalled, naming what
	// the pool's memory is held for. Default DefaultStallTimeout; a
	// negative value turns the watchdog off (then only the caller's context
	// bounds a wait).
	StallTimeout time.Duration
}

func pageSize() int { return os.Getpagesize() }

func defaultMinBufferBytes() int {
	return max(DefaultMinBufferBytes, pageSize())
}

// EnsureDefaults fills the zero fields of o with their documented defaults.
func (o *Options) EnsureDefaults() {
	if o.CapacityBytes == 0 {
		o.CapacityBytes = DefaultCapacityBytes
	}
	if o.MinBufferBytes == 0 {
		o.MinBufferBytes = defaultMinBufferBytes()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = DefaultStallTimeout
	}
}

// Validate reports every problem with o at once, joined with errors.Join;
// each names the field, its value and what is allowed. Zero fields are valid
// (they mean "the default").
func (o *Options) Validate() error {
	var errs []error
	bad := func(field string, value any, allowed string) {
		errs = append(errs, fmt.Errorf("buffers: Options.%s = %v: %s", field, value, allowed))
	}
	ps := pageSize()
	if o.CapacityBytes < 0 {
		bad("CapacityBytes", o.CapacityBytes, "must be >= 0 (0 means the default, 256 MiB)")
	}
	minOK := true
	if o.MinBufferBytes != 0 {
		if o.MinBufferBytes < ps || o.MinBufferBytes > MaxMinBufferBytes || bits.OnesCount(uint(o.MinBufferBytes)) != 1 {
			minOK = false
			bad("MinBufferBytes", o.MinBufferBytes,
				fmt.Sprintf("must be a power of two between the page size (%d) and %d (0 means the default, %d)",
					ps, MaxMinBufferBytes, defaultMinBufferBytes()))
		}
	}
	if o.CapacityBytes > 0 && minOK {
		granule := int64(o.MinBufferBytes)
		if granule == 0 {
			granule = int64(defaultMinBufferBytes())
		}
		if o.CapacityBytes > (1<<62) || (o.CapacityBytes+granule-1)/granule > maxGranules {
			bad("CapacityBytes", o.CapacityBytes,
				fmt.Sprintf("must be at most %d x MinBufferBytes (%d): raise MinBufferBytes for an arena this large",
					int64(maxGranules), granule))
		} else if rounded := roundUp(o.CapacityBytes, granule); int64(int(rounded)) != rounded {
			bad("CapacityBytes", o.CapacityBytes, "does not fit in this platform's address space")
		}
	}
	for i, r := range o.Reservations {
		if r < 0 {
			bad(fmt.Sprintf("Reservations[%s]", Purpose(i)), r, "must be >= 0 (0 means served from the shared region)")
		}
	}
	switch o.Pin {
	case PinAuto, PinRequired, PinOff:
	default:
		bad("Pin", int(o.Pin), "must be PinAuto (0), PinRequired (1) or PinOff (2)")
	}
	return errors.Join(errs...)
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }
