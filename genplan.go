package zinf

import (
	"errors"
	"fmt"
	"time"

	"github.com/zinfio/zinf/config"
)

// GenerationInput describes token generation for PlanGeneration: one
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

// GenerationPlan is the batch PlanGeneration picks and what it predicts.
type GenerationPlan struct {
	// Batch is the largest batch the KV cache budget (zinf.kv_cache)
	// allows, up to MaxBatch; Limit says which of the two set it.
	Batch int
	Limit string
	// KV is the KV cache at that batch.
	KV KVCachePlan
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
func (p GenerationPlan) String() string {
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

// PlanGeneration picks the largest batch whose KV cache cfg's
// zinf.kv_cache allows (PlanKVCache), up to in.MaxBatch, and predicts its
// decoding step and tokens per second from the NVMe bandwidth bw and the
// measured compute: the weights are read once per step whatever the batch,
// so tokens per second grow with the batch until compute or the KV cache's
// own I/O catches up with the weight reads.
func PlanGeneration(cfg *config.Config, bw Bandwidth, in GenerationInput) (GenerationPlan, error) {
	if cfg == nil {
		return GenerationPlan{}, errors.New("zinf: PlanGeneration: no config")
	}
	if in.Layers <= 0 || in.WeightBytes < 0 || in.KVBytesPerSequence <= 0 || in.ComputeFixed < 0 || in.ComputePerSequence < 0 || in.MaxBatch < 0 {
		return GenerationPlan{}, fmt.Errorf("zinf: PlanGeneration: layers %d, weight bytes %d, KV bytes per sequence %d, compute %v + %v per sequence, max batch %d (allowed: layers and KV bytes > 0, none negative)",
			in.Layers, in.WeightBytes, in.KVBytesPerSequence, in.ComputeFixed, in.ComputePerSequence, in.MaxBatch)
	}
	maxB := in.MaxBatch
	if maxB == 0 {
		maxB = 4096
	}
	plan := func(b int) (KVCachePlan, error) {
		return PlanKVCache(cfg, in.Layers, int64(b)*in.KVBytesPerSequence)
	}
	kv, err := plan(1)
	if err != nil {
		return GenerationPlan{}, fmt.Errorf("zinf: not even a batch of 1 fits: %w", err)
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
	p := GenerationPlan{Batch: lo, Limit: "every sequence", ReadBps: bw.ReadBps(), WriteBps: bw.WriteBps()}
	if lo < maxB {
		p.Limit = "zinf.kv_cache.bytes"
	}
	if kv, err = plan(lo); err != nil {
		return GenerationPlan{}, err
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
