package zinf

// Open's measurements: what the plan takes from the machine (the memory
// the pinned pool may take, the NVMe bandwidth), read from the checked
// inputs' settings alone.

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/plan"
)

// measure takes from the machine what the plan depends on: it refuses a
// pinned pool beyond the memory this process may take and gets the NVMe
// bandwidth (configured, from a tune result, cached or probed; see
// NVMeBandwidth), leaving the probe's measurements to cache once the run
// goes ahead. The swap stores' geometry is computed from the settings
// (plan.GeometryOf): nothing is opened; build opens the stores.
func (r *Runtime) measure(s *plan.Settings, opts Options) (m plan.Measured, pending []pendingProbe, err error) {
	if err := checkPoolMemory(int64(s.PinnedBytes)); err != nil {
		return m, nil, err
	}
	m.Stores = plan.GeometryOf(s)
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
