package zinf

// Open's measurements: what the plan takes from the machine (the memory
// the pinned pool may take, the swap stores' geometry, the NVMe
// bandwidth), read from the checked inputs' settings alone.

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/trace"
)

// ParamChecksumBytes is the bytes one checksum covers in the parameter
// swap store (with zinf.checksums; swapper.StoreOptions.ChecksumBytes):
// reading a few rows of a streamed tensor (ReadParamRows) reads and
// verifies 16 KiB around each, not the 1 MiB stripe. The gradient and
// optimizer stores checksum a sub-group's gradient bytes at most
// (plan.SubGroupChecksumBytes); the others each stripe.
const ParamChecksumBytes = 16 << 10

// measure takes from the machine what the plan depends on: it refuses a
// pinned pool beyond the memory this process may take, opens the I/O
// engine and the swap stores (their geometry is their device's alignment;
// they record into the timeline) and gets the NVMe bandwidth (configured,
// from a tune result, cached or probed; see NVMeBandwidth), leaving the
// probe's measurements to cache once the run goes ahead.
func (r *Runtime) measure(s *plan.Settings, opts Options) (m plan.Measured, pending []pendingProbe, err error) {
	if err := checkPoolMemory(int64(s.PinnedBytes)); err != nil {
		return m, nil, err
	}
	if err := r.openStores(s, opts.Engine, opts.Faults, opts.Trace); err != nil {
		return m, nil, err
	}
	m.ParamStore, m.GradStore, m.OptimStore = r.ParamStore, r.GradStore, r.OptimStore
	if opts.Bandwidth != nil {
		m.Bandwidth = *opts.Bandwidth
	} else if m.Bandwidth, pending, err = measureBandwidth(context.Background(), s.Bandwidth, nil, opts.NoBandwidthProbe, true, r.log); err != nil {
		return m, nil, err
	}
	return m, pending, nil
}

// checkPoolMemory refuses a pinned pool (zinf.tiers.cpu_pinned_bytes)
// larger than this process may still allocate: the tightest of
// MemAvailable, the memory cgroup's limit less its usage and ulimit -v
// less the address space mapped (memlimit.Available). It runs before
// anything is built: the pool is mapped and locked whole, and one beyond
// the memory is OOM-killed (a cgroup) or dies in a Go fatal out-of-memory
// (ulimit -v). The error wraps buffers.ErrMemory.
func checkPoolMemory(pool int64) error {
	lim, ok := memlimit.Available()
	if !ok || pool <= lim.Bytes {
		return nil
	}
	return fmt.Errorf("zinf: zinf.tiers.cpu_pinned_bytes = %s is more than the %s of memory this process may still take (%s): lower zinf.tiers.cpu_pinned_bytes: %w",
		units.FormatBytesExact(pool), units.FormatBytesExact(lim.Bytes), lim.What, buffers.ErrMemory)
}

// openStores starts the timeline (Options.Trace), which the stores record
// into, and opens the I/O engine (unless Options.Engine gives one, else
// with Options.Faults) and the swap stores the settings ask for, on it.
func (r *Runtime) openStores(s *plan.Settings, engine aio.Engine, faults aio.FaultHook, sink trace.Sink) (err error) {
	r.trace.init(sink, r.Rank, len(r.model.Layers))
	if r.Engine = engine; r.Engine == nil {
		eo := s.Engine
		eo.Faults, eo.Logger = faults, r.log
		r.Engine, err = aio.New(eo)
		if err != nil {
			return fmt.Errorf("zinf: I/O engine: %w", err)
		}
		r.ownEngine = true
	}
	warnRAMPaths(s.NVMePaths, r.log)
	// openStore opens the swap store name ("param", "optim" or "grad") with
	// the settings' options o, on the runtime's engine, recording into its
	// timeline.
	openStore := func(name string, o swapper.StoreOptions) (*swapper.Store, error) {
		o.Engine, o.Name, o.Logger, o.Trace = r.Engine, fmt.Sprintf("%s-rank%d", name, r.Rank), r.log, r.trace.store(name)
		if name == "param" {
			o.ChecksumBytes = ParamChecksumBytes
		}
		st, err := swapper.OpenStore(o)
		if err != nil {
			return nil, fmt.Errorf("zinf: %s swap store: %w", name, err)
		}
		return st, nil
	}
	if s.ParamStore.Paths != nil {
		if r.ParamStore, err = openStore("param", s.ParamStore); err != nil {
			return err
		}
	}
	if s.OptimStore.Paths != nil {
		if r.OptimStore, err = openStore("optim", s.OptimStore); err != nil {
			return err
		}
		if r.GradStore, err = openStore("grad", s.OptimStore); err != nil {
			return err
		}
	}
	return nil
}
