// Package metrics exports zinf runtimes' counters as Prometheus metrics,
// through github.com/prometheus/client_golang. It is a package of its own
// so that the rest of zinf does not depend on client_golang: the runtime,
// its stores and swappers keep plain counters (Runtime.Metrics,
// swapper.StoreStats) and a Collector reads them at each scrape.
//
// Register a Collector in your own registry:
//
//	c := metrics.New(rt)              // one or more runtimes (ranks)
//	prometheus.MustRegister(c)        // or reg.MustRegister(c)
//
// or let Serve run an HTTP endpoint with it (what `zinf train
// --metrics-addr` does):
//
//	srv, err := metrics.Serve("127.0.0.1:9400", metrics.NewRegistry(c))
//	defer srv.Close(ctx)
//
// What is exported, per rank (label "rank"):
//
//   - NVMe tier: bytes and operations per store ("param", "grad",
//     "optim"), path and disk (label "device", the kernel's name of the
//     disk under the path; "none" on tmpfs), read or write —
//     zinf_nvme_bytes_total, zinf_nvme_ops_total (device bytes, padded to
//     the alignment: what wears an SSD); errors, checksum failures;
//     latency histograms per store and op (zinf_nvme_latency_seconds);
//     live and file bytes. sum by (device) (rate(zinf_nvme_bytes_total{op="write"}[1d]))
//     is what the devices are written per second, the figure an
//     endurance rating (TBW) is spent by.
//   - CPU tier: pinned memory in use, reserved and peak per purpose
//     (zinf_cpu_pinned_bytes{purpose}), capacity, whether it is locked,
//     blocked acquisitions; the parameter cache (max_in_cpu) hits, misses
//     and bytes.
//   - GPU tier: device memory in use, parameter bytes on the device.
//   - Waits: zinf_io_wait_seconds_total{where}: the loop's (layer
//     barriers and gradient hand-off), parameter swap-ins, gradient
//     write-behind, the optimizer's reads and writes.
//   - Steps: optimizer steps, failed and aborted ones, the optimizer's
//     time by part (zinf_optimizer_seconds_total{part}), prefetch hits and
//     demand misses; training steps applied, skipped, clipped, speculated
//     and committed (zinf_train_steps_total{outcome}), speculative steps
//     rolled back and the time that took (zinf_rollbacks_total,
//     zinf_rollback_seconds_total), the fp16 loss scale.
//
// Collect is safe while the runtimes train (Runtime.Metrics and the store
// counters are); call Set(nil) before closing them.
package metrics
