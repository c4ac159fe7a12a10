package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/stream"
	"github.com/zinfio/zinf/gguf"
	"github.com/zinfio/zinf/metrics/procstat"
	"github.com/zinfio/zinf/swapper"
)

// sizeFlag is a byte count written as a size ("16GiB", "512MiB", 1e9).
type sizeFlag struct {
	n   int64
	set bool
}

func (s *sizeFlag) String() string {
	if s == nil || !s.set {
		return ""
	}
	return config.Size(s.n).String()
}

func (s *sizeFlag) Set(v string) error {
	n, err := config.ParseSize(v)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not a size (e.g. 512MiB, 16GiB, 0)", v)
	}
	s.n, s.set = n, true
	return nil
}

// StreamResult is what -stream measured: the weights kept in the pinned
// pool and streamed each step, what the timed steps read and waited, the
// plan's floor for such a step, and the process's peak RSS against the
// pool, the KV cache and 512 MiB.
type StreamResult struct {
	PoolBytes     int64 `json:"pool_bytes"`
	KeptTensors   int   `json:"kept_tensors"`
	KeptBytes     int64 `json:"kept_bytes"`
	StreamedBytes int64 `json:"streamed_bytes"` // weights each step reads from the file
	// StepReadBytes is what the timed steps read, per step; IOWaitMs
	// their median wait for weights, ComputeMs their median time less
	// that wait; ReadGBps the bytes over the decoding time.
	StepReadBytes int64   `json:"step_read_bytes"`
	IOWaitMs      float64 `json:"io_wait_median_ms"`
	ComputeMs     float64 `json:"compute_median_ms"`
	ReadGBps      float64 `json:"read_gb_per_s"`
	// PreemptedBytes are weights the timed steps read ahead and gave back
	// unused (read again: the pool is tight for the prefetch window);
	// DemandMisses the layers they found not prefetched; PrefetchDepth
	// the layers read ahead.
	PreemptedBytes int64 `json:"preempted_bytes"`
	DemandMisses   int64 `json:"demand_misses"`
	PrefetchDepth  int   `json:"prefetch_depth"`
	// PlanReadGBps is the NVMe read bandwidth the plan used; FloorMs the
	// plan's step (plan.ForGeneration: the longer of the streamed bytes at
	// that bandwidth and the measured compute), FloorBound which one it is.
	PlanReadGBps float64 `json:"plan_read_gb_per_s"`
	FloorMs      float64 `json:"floor_ms"`
	FloorBound   string  `json:"floor_bound"`
	// PeakRSSMiB is VmHWM; RSSBoundMiB the pool, the KV cache and 512 MiB.
	PeakRSSMiB  float64 `json:"peak_rss_mib"`
	RSSBoundMiB float64 `json:"rss_bound_mib"`
}

type streamOptions struct {
	cfgPath, dir string
	pool, keep   sizeFlag
}

// openStream opens the model for -stream: the config (the file, or the
// embedded default in a run directory), -pool and -max-in-cpu over it.
func openStream(ctx context.Context, path string, o streamOptions, stderr io.Writer) (*stream.Model, func(), error) {
	var cfg *config.Config
	if o.cfgPath != "" {
		c, err := config.Load(o.cfgPath)
		if err != nil {
			return nil, nil, fmt.Errorf("-config: %w", err)
		}
		cfg = c
	} else {
		cfg = config.Default()
		cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0 // stream every weight every step
	}
	cleanup := func() {}
	if o.cfgPath == "" || len(cfg.NVMePaths()) == 0 {
		dir := o.dir
		if dir == "" {
			// A locked run directory, as zinf's tools make theirs: one a
			// killed run left is removed by the next run, one a live run
			// holds is not.
			d, err := swapper.NewRunDir(os.TempDir(), "decode", nil)
			if err != nil {
				return nil, nil, err
			}
			dir = d.Path()
			cleanup = func() { d.Close() }
		}
		cfg.SetScratchDir(dir)
	} else if o.dir != "" {
		return nil, nil, fmt.Errorf("-dir %q: the config %s names its NVMe paths (%s)", o.dir, o.cfgPath, strings.Join(cfg.NVMePaths(), ", "))
	}
	if o.pool.set {
		cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(o.pool.n)
	}
	if o.cfgPath == "" {
		// The decoder computes on the host: the device tier the plan
		// checks a layer's working set against is the pool itself (the
		// embedded default's 256 MiB is a small GPU's share).
		cfg.Zinf.Tiers.GPUBytes = max(cfg.Zinf.Tiers.GPUBytes, cfg.Zinf.Tiers.CPUPinnedBytes)
		// The plan's floor rests on the probe's read bandwidth: 16 MiB
		// read back in a few milliseconds said 2.0-2.5 GB/s where the
		// steps read 3.5-4.6 GB/s.
		cfg.Zinf.Bandwidth.ProbeBytes = max(cfg.Zinf.Bandwidth.ProbeBytes, 256<<20)
	}
	if o.keep.set {
		cfg.ZeroOptimization.OffloadParam.MaxInCPU = o.keep.n / 2 // 2-byte words, as the runtime holds the file's bytes
	}
	if err := cfg.Validate(); err != nil {
		cleanup()
		return nil, nil, err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := stream.Open(ctx, path, cfg, stream.Options{Logger: log})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return m, func() { m.Close(); cleanup() }, nil
}

// typesOf lists the matrices' stored types and counts the parameters.
func typesOf(f *gguf.File, c decoder.Config) (string, int64) {
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		return "", 0
	}
	types := map[string]bool{}
	var params int64
	for _, n := range names {
		ti, ok := f.Tensor(n.Name)
		if !ok {
			continue
		}
		params += ti.Elements()
		if len(ti.Dims) == 2 {
			types[ti.Type.String()] = true
		}
	}
	tl := make([]string, 0, len(types))
	for t := range types {
		tl = append(tl, t)
	}
	sort.Strings(tl)
	return strings.Join(tl, ","), params
}

// loadWeights reads every weight into one buffer of a zinf pinned pool,
// each tensor at a 64-byte boundary (a cache line: the kernels' loads
// never straddle two tensors' lines). done gives the buffer back and
// closes the pool.
func loadWeights(ctx context.Context, f *gguf.File, c decoder.Config, pin buffers.PinPolicy) (mw decoder.ModelWeights, layers []decoder.LayerWeights, pinned bool, done func(), err error) {
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		return mw, nil, false, nil, err
	}
	var total int64
	for _, n := range names {
		ti, _ := f.Tensor(n.Name)
		b, err := f.DataBytes(ti)
		if err != nil {
			return mw, nil, false, nil, err
		}
		total += (b + 63) &^ 63
	}
	capacity := int64(1 << 21)
	for capacity < total {
		capacity *= 2
	}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: capacity, MinBufferBytes: 1 << 21, Pin: pin})
	if err != nil {
		return mw, nil, false, nil, err
	}
	buf, err := pool.Acquire(ctx, int(total), buffers.PurposeParams)
	if err != nil {
		pool.Close()
		return mw, nil, false, nil, err
	}
	done = func() { buf.Release(); pool.Close() }
	mem := buf.Bytes()
	alloc := func(n int) ([]byte, error) {
		s := mem[:n:n]
		mem = mem[(n+63)&^63:]
		return s, nil
	}
	if mw, layers, err = f.Weights(c, alloc); err != nil {
		done()
		return mw, nil, false, nil, err
	}
	return mw, layers, pool.Pinned(), done, nil
}

// streamResult gathers -stream's figures after the timed steps (st0: the
// stats before them).
func streamResult(m *stream.Model, st0 stream.Stats, batch, total int, computes []float64, decode time.Duration, kvBytes int64) (*StreamResult, error) {
	s := m.Stats()
	steps := len(computes)
	r := &StreamResult{PoolBytes: s.PinnedBytes, KeptTensors: s.KeptTensors, KeptBytes: s.KeptBytes, StreamedBytes: s.StreamedBytes}
	if steps > 0 {
		r.StepReadBytes = (s.BytesRead - st0.BytesRead) / int64(steps)
		r.IOWaitMs = float64(s.IOWait-st0.IOWait) / float64(steps) / 1e6
		r.PreemptedBytes, r.DemandMisses = s.PreemptedBytes-st0.PreemptedBytes, s.DemandMisses-st0.DemandMisses
		r.PrefetchDepth = s.PrefetchDepth
		c := slices.Clone(computes)
		sort.Float64s(c)
		r.ComputeMs = c[len(c)/2]
	}
	if decode > 0 {
		r.ReadGBps = float64(s.BytesRead-st0.BytesRead) / decode.Seconds() / 1e9
	}
	g, err := m.Floor(batch, total, time.Duration(r.ComputeMs*1e6))
	if err != nil {
		return nil, err
	}
	r.PlanReadGBps, r.FloorMs, r.FloorBound = g.ReadBps/1e9, float64(g.Step)/1e6, g.Bound
	r.PeakRSSMiB = float64(procstat.PeakRSS()) / (1 << 20)
	r.RSSBoundMiB = float64(s.PinnedBytes+kvBytes+512<<20) / (1 << 20)
	return r, nil
}
