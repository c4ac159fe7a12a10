package plan_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
)

// TestForGeneration: the batch grows until the KV cache budget stops it;
// the step is the longer of the weight reads (at the measured bandwidth)
// and the compute, so tokens per second grow with the batch while weight
// I/O bounds the step.
func TestForGeneration(t *testing.T) {
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	bw := plan.Bandwidth{Paths: []plan.PathBandwidth{{Path: "/nvme", ReadBps: 2e9, WriteBps: 1e9}}}
	in := plan.GenerationInput{Layers: 8, WeightBytes: 4e9, KVBytesPerSequence: 1 << 20,
		ComputeFixed: 100 * time.Millisecond, ComputePerSequence: 30 * time.Millisecond, MaxBatch: 1000}
	// 100 MiB of cache in memory: 12 sequences of 8 MiB.
	c.Zinf.KVCache = config.KVCache{Device: config.KVCacheMemory, Bytes: 100 << 20}
	p, err := plan.ForGeneration(c, bw, in)
	if err != nil {
		t.Fatal(err)
	}
	if p.Batch != 12 || p.Limit != "zinf.kv_cache.bytes" || p.KV.CacheBytes != 12*8<<20 {
		t.Fatalf("plan %+v: want a batch of 12 set by zinf.kv_cache.bytes", p)
	}
	// 4 GB at 2 GB/s: 2 s of weight reads; compute 0.1 + 12 x 0.03 s.
	if p.WeightIO != 2*time.Second || p.Compute != 460*time.Millisecond || p.Step != 2*time.Second || p.Bound != "weight I/O" || p.TokensPerSecond != 6 {
		t.Fatalf("plan %+v: want a 2 s weight-I/O-bound step, 6 tokens/s", p)
	}
	if s := p.String(); !strings.Contains(s, "batch 12 (zinf.kv_cache.bytes): predicted 6.00 tokens/s") {
		t.Fatalf("String: %s", s)
	}
	// No budget: every sequence; compute-bound at 1000 sequences.
	c.Zinf.KVCache = config.KVCache{Device: config.KVCacheMemory}
	if p, err = plan.ForGeneration(c, bw, in); err != nil || p.Batch != 1000 || p.Bound != "compute" || p.Step != 30100*time.Millisecond {
		t.Fatalf("unbounded: %+v, %v", p, err)
	}
	// On NVMe the cache's reads and writes count.
	c.Zinf.KVCache = config.KVCache{Device: config.KVCacheNVMe}
	in.MaxBatch = 64
	if p, err = plan.ForGeneration(c, bw, in); err != nil || p.KVIO == 0 || p.Step != p.WeightIO+p.KVIO {
		t.Fatalf("nvme: %+v, %v", p, err)
	}
	// Not even one sequence fits: refused with the figure.
	c.Zinf.KVCache = config.KVCache{Device: config.KVCacheCPU, Bytes: 1 << 20}
	if _, err := plan.ForGeneration(c, bw, in); err == nil || !strings.Contains(err.Error(), "not even a batch of 1 fits") || !strings.Contains(err.Error(), "needs 8MiB") {
		t.Fatalf("too small: %v", err)
	}
}
