package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
)

// sizeFlag accepts "1GiB", "64MiB", "1e9" or plain bytes.
type sizeFlag struct{ v *int64 }

func (s sizeFlag) String() string {
	if s.v == nil {
		return ""
	}
	return config.Size(*s.v).String()
}

func (s sizeFlag) Set(v string) error {
	n, err := config.ParseSize(v)
	if err != nil {
		return err
	}
	*s.v = n
	return nil
}

func sizeVar(fs *flag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	fs.Var(sizeFlag{p}, name, usage)
}

// engineFlags are the aio options every I/O subcommand takes.
type engineFlags struct {
	backend      string
	blockSize    int64
	queueDepth   int
	parallel     int
	singleSubmit bool
	serialEvents bool
	direct       string
}

func (e *engineFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.backend, "backend", aio.BackendAuto, "I/O backend: auto, uring, libaio, posix")
	sizeVar(fs, &e.blockSize, "block-size", 1<<20, "I/O block size (e.g. 1MiB)")
	// The engine's and the config's default, so that a measurement without
	// flags measures what training runs with.
	fs.IntVar(&e.queueDepth, "queue-depth", aio.DefaultQueueDepth, "pieces in flight per worker")
	fs.IntVar(&e.parallel, "parallel", 1, "intra-op parallelism: workers (rings) per request")
	fs.BoolVar(&e.singleSubmit, "single-submit", false, "submit one piece per system call (DeepNVMe single_submit)")
	fs.BoolVar(&e.serialEvents, "no-overlap-events", false, "wait for a whole batch before submitting the next (DeepNVMe overlap_events=false)")
	fs.StringVar(&e.direct, "direct", "optional", "O_DIRECT policy: required, optional, off")
}

// options converts the flags, reporting every invalid one at once. Zero is
// rejected rather than passed on, where aio would read it as "default".
func (e *engineFlags) options() (aio.Options, error) {
	var errs []error
	d, err := aio.ParseDirectPolicy(e.direct)
	if err != nil {
		errs = append(errs, fmt.Errorf("--direct: %w", err))
	}
	if e.blockSize <= 0 || e.blockSize > 1<<30 {
		errs = append(errs, fmt.Errorf("--block-size %d is invalid (allowed: a power of two or a multiple of 4KiB, at most 1GiB)", e.blockSize))
	}
	if err := intIn("--queue-depth", e.queueDepth, 1, aio.MaxQueueDepth); err != nil {
		errs = append(errs, err)
	}
	if err := intIn("--parallel", e.parallel, 1, aio.MaxIntraOpParallelism); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return aio.Options{}, errors.Join(errs...)
	}
	o := aio.Options{Backend: e.backend, BlockSizeBytes: int(e.blockSize), QueueDepth: e.queueDepth,
		IntraOpParallelism: e.parallel, SingleSubmit: e.singleSubmit, SerialEvents: e.serialEvents, Direct: d}
	return o, nil
}

// positive and notNegative check a numeric flag, naming it.
func positive[T int | float64](flagName string, v T) error {
	if v <= 0 {
		return fmt.Errorf("%s %v is invalid: it must be at least 1", flagName, v)
	}
	return nil
}

func notNegative[T int | float64](flagName string, v T) error {
	if v < 0 {
		return fmt.Errorf("%s %v is invalid: it must not be negative", flagName, v)
	}
	return nil
}
