package plan

// Generation and its KV cache, planned: where a generation's attention
// key/value cache lives and what it takes there (ForKVCache), and the
// largest batch the cache's budget allows with its predicted tokens per
// second (ForGeneration). zinf.Runtime.OpenKVCache opens the cache a
// KVCache plan describes.

import (
	"errors"
	"fmt"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/swapper"
)

// KVCache is where a generation's attention key/value cache lives and
// what it takes there (zinf.kv_cache in the config; see ForKVCache).
type KVCache struct {
	// Device is the tier: memory, cpu (pinned) or nvme (auto resolved).
	Device config.KVCacheDevice
	// Layers and LayerBytes are the cache's shape: one entry of keys and
	// values per attention layer, of at most LayerBytes.
	Layers     int
	LayerBytes int64
	// CacheBytes is the whole cache: Layers x LayerBytes.
	CacheBytes int64
	// MemoryBytes is what it holds in ordinary memory (the memory tier).
	MemoryBytes int64
	// PinnedBytes is its pinned memory: the cache (cpu), or the layer
	// buffers it stages through (nvme: in use, read ahead, written behind).
	PinnedBytes int64
	// DiskBytes is the swap file space it needs (nvme; copy-on-write:
	// twice the cache).
	DiskBytes int64
	// BudgetBytes is zinf.kv_cache.bytes (0: none).
	BudgetBytes int64
}

// String is the plan in one line, as zinf plan prints it.
func (p KVCache) String() string {
	s := fmt.Sprintf("kv cache: %s, %d layers x %s = %s", p.Device, p.Layers, config.Size(p.LayerBytes), config.Size(p.CacheBytes))
	switch p.Device {
	case config.KVCacheMemory:
		s += " in memory"
	case config.KVCacheCPU:
		s += fmt.Sprintf(", pinned %s", config.Size(p.PinnedBytes))
	case config.KVCacheNVMe:
		s += fmt.Sprintf(" in swap files (%s of disk, copy-on-write), pinned staging %s (%d layers: in use, read ahead, written behind)",
			config.Size(p.DiskBytes), config.Size(p.PinnedBytes), KVCacheSlots(p.Layers))
	}
	if p.BudgetBytes > 0 {
		s += fmt.Sprintf("; zinf.kv_cache.bytes %s", config.Size(p.BudgetBytes))
	}
	return s
}

// KVCacheTooSmallError is a zinf.kv_cache.bytes below what the cache
// needs on its tier.
type KVCacheTooSmallError struct {
	Plan KVCache
	Need int64
}

// ErrKVCacheTooSmall is wrapped by KVCacheTooSmallError.
var ErrKVCacheTooSmall = errors.New("zinf: KV cache budget too small")

func (e *KVCacheTooSmallError) Error() string {
	p := e.Plan
	what := "the cache"
	switch p.Device {
	case config.KVCacheCPU:
		what = "the pinned cache"
	case config.KVCacheNVMe:
		what = fmt.Sprintf("the pinned staging of %d layers", KVCacheSlots(p.Layers))
	}
	advice := "raise zinf.kv_cache.bytes, lower the batch or the sequence length, or set zinf.kv_cache.device to nvme"
	if p.Device == config.KVCacheNVMe {
		// Already there: nvme stages through a few layers, which only a
		// larger budget or smaller layers fit.
		advice = "raise zinf.kv_cache.bytes, or lower the batch or the sequence length"
	}
	return fmt.Sprintf("zinf: zinf.kv_cache.bytes = %s is too small for this KV cache on %s (%d layers x %s): %s needs %s (%d bytes); %s",
		config.Size(p.BudgetBytes), p.Device, p.Layers, config.Size(p.LayerBytes), what, config.Size(e.Need), e.Need, advice)
}

func (e *KVCacheTooSmallError) Unwrap() error { return ErrKVCacheTooSmall }

// KVCacheSlots is the layer buffers the nvme tier of a KV cache of
// layers entries stages through.
func KVCacheSlots(layers int) int { return min(3, layers+1) }

// ForKVCache plans a KV cache of layers entries of layerBytes each on the
// tier cfg's zinf.kv_cache selects, refusing (a *KVCacheTooSmallError,
// naming the bytes needed) a budget the cache does not fit.
func ForKVCache(cfg *config.Config, layers int, layerBytes int64) (KVCache, error) {
	if cfg == nil {
		return KVCache{}, errors.New("zinf: ForKVCache: no config")
	}
	if layers <= 0 || layerBytes <= 0 || layerBytes > 1<<50 || int64(layers) > (1<<60)/layerBytes {
		return KVCache{}, fmt.Errorf("zinf: KV cache of %d layers x %d bytes (allowed: both > 0)", layers, layerBytes)
	}
	kc := cfg.Zinf.KVCache
	p := KVCache{Device: kc.Device, Layers: layers, LayerBytes: layerBytes, CacheBytes: int64(layers) * layerBytes, BudgetBytes: int64(kc.Bytes)}
	if p.Device == "" || p.Device == config.KVCacheAuto {
		p.Device = config.KVCacheMemory
		if p.BudgetBytes > 0 && p.CacheBytes > p.BudgetBytes {
			p.Device = config.KVCacheNVMe
		}
	}
	granule := int(GranuleBytes())
	span := func(n int64) int64 { return buffers.SpanBytes(n, granule) }
	padded := func(n int64) int64 {
		a := int64(swapper.DefaultDiskAlignment)
		return (n + a - 1) / a * a
	}
	var need int64
	switch p.Device {
	case config.KVCacheMemory:
		p.MemoryBytes = p.CacheBytes
		need = p.MemoryBytes
	case config.KVCacheCPU:
		p.PinnedBytes = int64(layers) * span(layerBytes)
		need = p.PinnedBytes
	case config.KVCacheNVMe:
		p.PinnedBytes = int64(KVCacheSlots(layers)) * span(padded(layerBytes))
		p.DiskBytes = 2 * int64(layers) * padded(layerBytes)
		need = p.PinnedBytes
		if len(cfg.NVMePaths()) == 0 {
			return p, errors.New(`zinf: zinf.kv_cache.device "nvme" needs an NVMe path (zinf.nvme_paths or an offload nvme_path)`)
		}
	default:
		return p, fmt.Errorf("zinf: zinf.kv_cache.device %q (allowed: auto, memory, cpu, nvme)", kc.Device)
	}
	if p.BudgetBytes > 0 && need > p.BudgetBytes && kc.Device == p.Device { // auto past its budget stages through what nvme needs
		return p, &KVCacheTooSmallError{Plan: p, Need: need}
	}
	return p, nil
}

// GenerationInput describes token generation for ForGeneration: one
// decoding step reads every streamed weight once, for the whole batch, and
// each sequence's keys and values once per layer.
type GenerationInput struct {
	// Layers is the attention layers (KV cache entries).
	Layers int
	// WeightBytes is what one decoding step reads from NVMe: the weights
	// streamed through the pinned pool.
	WeightBytes int64
	// KVBytesPerSequence is one layer's cache entry for one sequence at
	// the longest length it reaches.
	KVBytesPerSequence int64
	// ComputeFixed and ComputePerSequence are one decoding step's measured
	// compute: fixed, plus this much per sequence of the batch.
	ComputeFixed, ComputePerSequence time.Duration
	// MaxBatch bounds the batch: the sequences there are. Default 4096.
	MaxBatch int
}

// Generation is the batch ForGeneration picks and what it predicts.
type Generation struct {
	// Batch is the largest batch the KV cache budget (zinf.kv_cache)
	// allows, up to MaxBatch; Limit says which of the two set it.
	Batch int
	Limit string
	// KV is the KV cache at that batch.
	KV KVCache
	// WeightIO is one step's weight reads at the measured bandwidth,
	// KVIO its KV cache reads and writes (nvme tier), Compute its compute.
	WeightIO, KVIO, Compute time.Duration
	// Step is the predicted decoding step: weight and KV I/O overlap the
	// compute (prefetch), so the longer of the two.
	Step time.Duration
	// TokensPerSecond is Batch tokens per Step.
	TokensPerSecond float64
	// Bound names what sets the step: "weight I/O", "KV I/O" or "compute".
	Bound string
	// ReadBps and WriteBps are the NVMe bandwidth the prediction used.
	ReadBps, WriteBps float64
}

// String is the plan in one line.
func (p Generation) String() string {
	return fmt.Sprintf("batch %d (%s): predicted %.2f tokens/s, step %s = max(weight I/O %s + KV I/O %s at %.2f GB/s read / %.2f GB/s write, compute %s): %s-bound",
		p.Batch, p.Limit, p.TokensPerSecond, roundDur(p.Step), roundDur(p.WeightIO), roundDur(p.KVIO), p.ReadBps/1e9, p.WriteBps/1e9, roundDur(p.Compute), p.Bound)
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// ForGeneration picks the largest batch whose KV cache cfg's
// zinf.kv_cache allows (ForKVCache), up to in.MaxBatch, and predicts its
// decoding step and tokens per second from the NVMe bandwidth bw and the
// measured compute: the weights are read once per step whatever the batch,
// so tokens per second grow with the batch until compute or the KV cache's
// own I/O catches up with the weight reads.
func ForGeneration(cfg *config.Config, bw Bandwidth, in GenerationInput) (Generation, error) {
	if cfg == nil {
		return Generation{}, errors.New("zinf: ForGeneration: no config")
	}
	if in.Layers <= 0 || in.WeightBytes < 0 || in.KVBytesPerSequence <= 0 || in.ComputeFixed < 0 || in.ComputePerSequence < 0 || in.MaxBatch < 0 {
		return Generation{}, fmt.Errorf("zinf: ForGeneration: layers %d, weight bytes %d, KV bytes per sequence %d, compute %v + %v per sequence, max batch %d (allowed: layers and KV bytes > 0, none negative)",
			in.Layers, in.WeightBytes, in.KVBytesPerSequence, in.ComputeFixed, in.ComputePerSequence, in.MaxBatch)
	}
	maxB := in.MaxBatch
	if maxB == 0 {
		maxB = 4096
	}
	plan := func(b int) (KVCache, error) {
		return ForKVCache(cfg, in.Layers, int64(b)*in.KVBytesPerSequence)
	}
	kv, err := plan(1)
	if err != nil {
		return Generation{}, fmt.Errorf("zinf: not even a batch of 1 fits: %w", err)
	}
	// The largest batch that fits: KV needs grow with the batch.
	lo, hi := 1, maxB
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if _, err := plan(mid); err == nil {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	p := Generation{Batch: lo, Limit: "every sequence", ReadBps: bw.ReadBps(), WriteBps: bw.WriteBps()}
	if lo < maxB {
		p.Limit = "zinf.kv_cache.bytes"
	}
	if kv, err = plan(lo); err != nil {
		return Generation{}, err
	}
	p.KV = kv
	secs := func(bytes int64, bps float64) time.Duration {
		if bytes <= 0 || bps <= 0 {
			return 0
		}
		return time.Duration(float64(bytes) / bps * float64(time.Second))
	}
	p.WeightIO = secs(in.WeightBytes, p.ReadBps)
	if kv.Device == config.KVCacheNVMe {
		p.KVIO = secs(kv.CacheBytes, p.ReadBps) + secs(kv.CacheBytes, p.WriteBps)
	}
	p.Compute = in.ComputeFixed + time.Duration(p.Batch)*in.ComputePerSequence
	io := p.WeightIO + p.KVIO
	p.Step, p.Bound = p.Compute, "compute"
	if io > p.Compute {
		p.Step, p.Bound = io, "weight I/O"
		if p.KVIO > p.WeightIO {
			p.Bound = "KV I/O"
		}
	}
	if p.Step > 0 {
		p.TokensPerSecond = float64(p.Batch) / p.Step.Seconds()
	}
	return p, nil
}
