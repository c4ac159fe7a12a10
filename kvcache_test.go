package zinf_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

func kvRuntime(t *testing.T, kv config.KVCache) *zinf.Runtime {
	t.Helper()
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = 1 << 20
	c.Zinf.KVCache = kv
	rt, err := zinf.Open(c, zinf.LayeredModel([]tensor.Desc{{Name: "w", Shape: []int{64}}}), zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if err := rt.Init(context.Background(), "w", make([]float32, 64)); err != nil {
		t.Fatal(err)
	}
	return rt
}

// fill writes a pattern of (pass, layer) into b.
func fill(b []byte, pass, layer int) {
	for i := range b {
		b[i] = byte(pass*31 + layer*7 + i*13)
	}
}

// TestKVCacheTiers: on each tier (memory, pinned, NVMe), every layer's
// entry reads back what the last pass wrote (zeros before the first),
// pass after pass, with entries that grow; the NVMe tier reads them back
// from its swap files, ahead of use.
func TestKVCacheTiers(t *testing.T) {
	const layers, layerBytes = 5, 10000
	for _, dev := range []config.KVCacheDevice{config.KVCacheMemory, config.KVCacheCPU, config.KVCacheNVMe} {
		t.Run(string(dev), func(t *testing.T) {
			ctx := context.Background()
			rt := kvRuntime(t, config.KVCache{Device: dev})
			c, err := rt.OpenKVCache(layers, layerBytes)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := c.Plan().Device; got != dev {
				t.Fatalf("planned on %s, want %s", got, dev)
			}
			want := make([]byte, layerBytes)
			for pass := range 4 {
				used := 3000 + pass*2000 // the entry grows pass by pass
				for l := range layers {
					b, err := c.Begin(ctx, l)
					if err != nil {
						t.Fatal(err)
					}
					if len(b) != layerBytes {
						t.Fatalf("entry of %d bytes, want %d", len(b), layerBytes)
					}
					clear(want)
					if pass > 0 {
						fill(want[:used-2000], pass-1, l)
					}
					if !bytes.Equal(b[:used-2000], want[:used-2000]) {
						t.Fatalf("pass %d layer %d: the entry does not hold what pass %d wrote", pass, l, pass-1)
					}
					fill(b[:used], pass, l)
					if err := c.End(l, used); err != nil {
						t.Fatal(err)
					}
				}
			}
			st := c.Stats()
			if dev == config.KVCacheNVMe {
				if st.Reads == 0 || st.BytesRead == 0 || st.Prefetched == 0 || st.Writes != 4*layers {
					t.Fatalf("nvme tier: %+v: the entries were not written to and read back from the swap files ahead of use", st)
				}
			} else if st.Reads != 0 || st.Writes != 0 {
				t.Fatalf("%s tier touched NVMe: %+v", dev, st)
			}
		})
	}
}

// TestKVCacheBudget: a budget the cache does not fit is refused at plan
// time with the bytes it needs; auto goes to NVMe past the budget.
func TestKVCacheBudget(t *testing.T) {
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	for _, tc := range []struct {
		dev  config.KVCacheDevice
		need string
	}{
		{config.KVCacheMemory, "the cache needs 32KB (32000 bytes)"},
		{config.KVCacheCPU, "the pinned cache needs 32KiB (32768 bytes)"},
		{config.KVCacheNVMe, "the pinned staging of 3 layers needs 24KiB (24576 bytes)"},
	} {
		c.Zinf.KVCache = config.KVCache{Device: tc.dev, Bytes: 8192}
		_, err := plan.ForKVCache(c, 4, 8000)
		var e *plan.KVCacheTooSmallError
		if !errors.As(err, &e) || !errors.Is(err, plan.ErrKVCacheTooSmall) || !strings.Contains(err.Error(), tc.need) || !strings.Contains(err.Error(), "zinf.kv_cache.bytes = 8KiB") {
			t.Fatalf("%s: %v, want a KVCacheTooSmallError saying %q", tc.dev, err, tc.need)
		}
		// The advice names only what would help: a cache already on nvme is
		// not told to move there.
		if advises := strings.Contains(err.Error(), "zinf.kv_cache.device to nvme"); advises != (tc.dev != config.KVCacheNVMe) {
			t.Errorf("%s: the advice to move to nvme is %v: %v", tc.dev, advises, err)
		}
		c.Zinf.KVCache.Bytes = config.Size(e.Need)
		if _, err := plan.ForKVCache(c, 4, 8000); err != nil {
			t.Fatalf("%s with the budget the error named: %v", tc.dev, err)
		}
	}
	c.Zinf.KVCache = config.KVCache{Device: config.KVCacheAuto, Bytes: 30000}
	p, err := plan.ForKVCache(c, 4, 8000)
	if err != nil || p.Device != config.KVCacheNVMe || p.DiskBytes != 2*4*8192 {
		t.Fatalf("auto past its budget: %+v, %v; want nvme with 64KiB of disk", p, err)
	}
	c.Zinf.KVCache.Bytes = 32000
	if p, err := plan.ForKVCache(c, 4, 8000); err != nil || p.Device != config.KVCacheMemory {
		t.Fatalf("auto within its budget: %+v, %v; want memory", p, err)
	}
	if _, err := config.Parse([]byte(`{"zinf": {"kv_cache": {"device": "gpu"}}}`)); err == nil || !strings.Contains(err.Error(), `zinf.kv_cache.device: "gpu" is not allowed (allowed: auto, memory, cpu, nvme)`) {
		t.Fatalf("bad device: %v", err)
	}
}
