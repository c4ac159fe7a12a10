package metrics

import (
	"errors"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/blockdev"
	"github.com/zinfio/zinf/swapper"
)

// Collector is a prometheus.Collector over zinf runtimes (the ranks of a
// job in this process). It is safe for concurrent use.
type Collector struct {
	mu   sync.Mutex
	rts  []*zinf.Runtime
	devs map[string]string // swap path -> disk name, found once
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector over rts (more can be set later with Set).
func New(rts ...*zinf.Runtime) *Collector {
	c := &Collector{devs: map[string]string{}}
	c.Set(rts...)
	return c
}

// Set replaces the runtimes read at each scrape; Set() with none before
// the runtimes are closed. Counters of a runtime set again start from its
// own totals, which Prometheus treats as the counter it was.
func (c *Collector) Set(rts ...*zinf.Runtime) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rts = append([]*zinf.Runtime(nil), rts...)
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"rank"}, labels...), nil)
}

var (
	nvmeBytes = desc("zinf_nvme_bytes_total", "Bytes the swap stores moved to (op=write) and from (op=read) NVMe, per store, path and disk, as the device transferred them (padded to its alignment).",
		"store", "path", "device", "op")
	nvmeOps = desc("zinf_nvme_ops_total", "I/O requests the swap stores completed on NVMe, per store, path and disk.",
		"store", "path", "device", "op")
	nvmeErrors  = desc("zinf_nvme_errors_total", "Swap store operations that failed, per store and op.", "store", "op")
	nvmeCRC     = desc("zinf_nvme_checksum_failures_total", "Swap-ins whose bytes did not match the checksum written with them.", "store")
	nvmeLatency = desc("zinf_nvme_latency_seconds", "Latency of successful swap store operations, from submission to completion.", "store", "op")
	nvmeLive    = desc("zinf_nvme_live_bytes", "Bytes of the current versions of the tensors a swap store holds (padded).", "store")
	nvmeFile    = desc("zinf_nvme_file_bytes", "Length the swap store's files have reached, summed over paths.", "store")

	pinnedBytes    = desc("zinf_cpu_pinned_bytes", "Pinned host memory held now, per purpose.", "purpose")
	pinnedReserved = desc("zinf_cpu_pinned_reserved_bytes", "Pinned host memory reserved per purpose (0: served from the shared region).", "purpose")
	pinnedCap      = desc("zinf_cpu_pinned_capacity_bytes", "The pinned pool's capacity.")
	pinnedPeak     = desc("zinf_cpu_pinned_peak_bytes", "The most pinned memory held at once.")
	pinnedLocked   = desc("zinf_cpu_pinned_locked", "1 when the pinned pool is locked in RAM (mlock), else 0.")
	pinnedWaits    = desc("zinf_cpu_pinned_waits_total", "Pinned memory acquisitions that had to wait for a release.")
	cacheHits      = desc("zinf_cpu_param_cache_hits_total", "Parameter swap-ins served by the CPU cache (max_in_cpu) without NVMe I/O.")
	cacheMisses    = desc("zinf_cpu_param_cache_misses_total", "Parameter swap-ins that had to read NVMe.")
	cacheBytes     = desc("zinf_cpu_param_cache_bytes", "Pinned bytes the parameter cache holds.")
	gradServed     = desc("zinf_grad_served_bytes_total", "Gradient bytes read (by the optimizer) from the pinned copy of a write-behind still in flight, instead of waiting for the write and reading them back from NVMe.")
	preempted      = desc("zinf_param_preempted_bytes_total", "Prefetched parameter bytes given back before use to make room for a waited-for swap-in (read again when needed): a pool too tight for the prefetch window.")

	gpuUsed  = desc("zinf_gpu_used_bytes", "Device memory allocated through the runtime's device.", "device")
	gpuParam = desc("zinf_gpu_param_bytes", "Device bytes of parameters living on, or swapped into, the device.")

	ioWait   = desc("zinf_io_wait_seconds_total", "Time spent waiting for I/O: where=loop (layer barriers, gradient hand-off), param_swap_in, grad_write_behind, optimizer_read, optimizer_write.", "where")
	steps    = desc("zinf_steps_total", "Optimizer steps the runtime completed.")
	optSteps = desc("zinf_optimizer_steps_total", "Optimizer steps by outcome: committed, failed, aborted.", "outcome")
	optTime  = desc("zinf_optimizer_seconds_total", "The optimizer steps' time by part: elapsed, compute (the update), read_wait, write_wait, idle (waiting for tensors handed over), commit, drain, io_gaps (none of the step's I/O in flight between its first read and last write).", "part")
	optBytes = desc("zinf_optimizer_bytes_total", "Optimizer state bytes moved by steps (op=read, write) and gradient bytes read (op=grad_read).", "op")
	prefetch = desc("zinf_prefetch_total", "Layer barriers by outcome: hit (prefetched in time) or demand_miss (fetched on demand).", "outcome")

	trainSteps   = desc("zinf_train_steps_total", "Training steps by outcome: applied, skipped (fp16 overflow), clipped (applied with clipped gradients), speculated (update begun during backward), committed (speculated and kept).", "outcome")
	rollbacks    = desc("zinf_rollbacks_total", "Speculative steps rolled back (begun during backward, then discarded because the step was clipped, skipped or its learning rate changed).")
	rollbackTime = desc("zinf_rollback_seconds_total", "Time steps spent discarding speculative updates.")
	lossScale    = desc("zinf_loss_scale", "The current fp16 loss scale (1 without fp16).")
)

var all = []*prometheus.Desc{nvmeBytes, nvmeOps, nvmeErrors, nvmeCRC, nvmeLatency, nvmeLive, nvmeFile,
	pinnedBytes, pinnedReserved, pinnedCap, pinnedPeak, pinnedLocked, pinnedWaits, cacheHits, cacheMisses, cacheBytes, preempted, gradServed,
	gpuUsed, gpuParam, ioWait, steps, optSteps, optTime, optBytes, prefetch, trainSteps, rollbacks, rollbackTime, lossScale}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range all {
		ch <- d
	}
}

// device names the disk under a swap path ("none" where there is no
// block device, e.g. tmpfs).
func (c *Collector) device(path string) string {
	if d, ok := c.devs[path]; ok {
		return d
	}
	name := "none"
	if d, err := blockdev.Of(path); err == nil {
		name = d.Name
	} else if !errors.Is(err, blockdev.ErrNoDevice) {
		name = "unknown"
	}
	c.devs[path] = name
	return name
}

// Collect reads every runtime's counters.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rt := range c.rts {
		c.collect(ch, rt)
	}
}

func (c *Collector) collect(ch chan<- prometheus.Metric, rt *zinf.Runtime) {
	rank := strconv.Itoa(rt.Rank)
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{rank}, labels...)...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{rank}, labels...)...)
	}
	m := rt.Metrics()
	for _, s := range []struct {
		name string
		st   *swapper.Store
	}{{"param", rt.ParamStore}, {"grad", rt.GradStore}, {"optim", rt.OptimStore}} {
		if s.st == nil {
			continue
		}
		st := s.st.Stats()
		for _, p := range st.Paths {
			dev := c.device(p.Path)
			counter(nvmeBytes, float64(p.BytesRead), s.name, p.Path, dev, "read")
			counter(nvmeBytes, float64(p.BytesWritten), s.name, p.Path, dev, "write")
			counter(nvmeOps, float64(p.Reads), s.name, p.Path, dev, "read")
			counter(nvmeOps, float64(p.Writes), s.name, p.Path, dev, "write")
		}
		counter(nvmeErrors, float64(st.ReadErrors), s.name, "read")
		counter(nvmeErrors, float64(st.WriteErrors), s.name, "write")
		counter(nvmeCRC, float64(st.ChecksumFailures), s.name)
		for op, l := range map[string]swapper.Latency{"read": st.ReadLatency, "write": st.WriteLatency} {
			ch <- histogram(nvmeLatency, l, rank, s.name, op)
		}
		gauge(nvmeLive, float64(st.LiveBytes), s.name)
		gauge(nvmeFile, float64(st.FileBytes), s.name)
	}

	ps := m.Pool
	for p := buffers.Purpose(0); p < buffers.NumPurposes; p++ {
		gauge(pinnedBytes, float64(ps.InUseBytesByPurpose[p]), p.String())
		gauge(pinnedReserved, float64(ps.ReservedBytes[p]), p.String())
	}
	gauge(pinnedCap, float64(ps.CapacityBytes))
	gauge(pinnedPeak, float64(ps.PeakInUseBytes))
	locked := 0.0
	if ps.Pinned {
		locked = 1
	}
	gauge(pinnedLocked, locked)
	counter(pinnedWaits, float64(ps.Waits))
	counter(cacheHits, float64(m.Params.CacheHits))
	counter(cacheMisses, float64(m.Params.CacheMisses))
	gauge(cacheBytes, float64(m.Params.CachedBytes))
	counter(preempted, float64(m.Params.PreemptedBytes))
	counter(gradServed, float64(m.Grads.ServedBytes))

	dev := m.DeviceName
	gauge(gpuUsed, float64(m.DeviceUsedBytes), dev)
	gauge(gpuParam, float64(m.Params.DeviceBytes))

	tot := m.Optimizer.Total
	for where, d := range map[string]float64{"loop": m.IOWait.Seconds(), "param_swap_in": m.Params.IOWait.Seconds(),
		"grad_write_behind": m.Grads.WriteWait.Seconds(), "optimizer_read": tot.ReadWait.Seconds(), "optimizer_write": tot.WriteWait.Seconds()} {
		counter(ioWait, d, where)
	}
	counter(steps, float64(m.Steps))
	counter(optSteps, float64(m.Optimizer.Steps), "committed")
	counter(optSteps, float64(m.Optimizer.FailedSteps), "failed")
	counter(optSteps, float64(m.Optimizer.AbortedSteps), "aborted")
	for part, d := range map[string]float64{"elapsed": tot.Elapsed.Seconds(), "compute": tot.Compute.Seconds(), "read_wait": tot.ReadWait.Seconds(),
		"write_wait": tot.WriteWait.Seconds(), "idle": tot.Idle.Seconds(), "commit": tot.Commit.Seconds(), "drain": tot.Drain.Seconds(),
		"io_gaps": tot.IOGaps.Seconds()} {
		counter(optTime, d, part)
	}
	counter(optBytes, float64(tot.BytesRead), "read")
	counter(optBytes, float64(tot.BytesWritten), "write")
	counter(optBytes, float64(tot.GradBytes), "grad_read")
	counter(prefetch, float64(m.Schedule.Hits), "hit")
	counter(prefetch, float64(m.Schedule.DemandMisses), "demand_miss")
	tr := m.Train
	for outcome, n := range map[string]int{"applied": tr.Applied, "skipped": tr.Skipped, "clipped": tr.Clipped, "speculated": tr.Speculated, "committed": tr.Commits} {
		counter(trainSteps, float64(n), outcome)
	}
	counter(rollbacks, float64(tr.Rollbacks))
	counter(rollbackTime, tr.RollbackTime.Seconds())
	gauge(lossScale, tr.LossScale)
}

// histogram converts a store latency histogram (non-cumulative buckets)
// to a Prometheus one (cumulative, bounds in seconds).
func histogram(d *prometheus.Desc, l swapper.Latency, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(swapper.LatencyBounds))
	var cum uint64
	for i, b := range swapper.LatencyBounds {
		cum += uint64(l.Buckets[i])
		buckets[b.Seconds()] = cum
	}
	return prometheus.MustNewConstHistogram(d, uint64(l.Count), l.Sum.Seconds(), buckets, labels...)
}
