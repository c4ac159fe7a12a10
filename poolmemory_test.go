package zinf_test

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/testenv"
)

// TestOpenPoolBeyondCgroup: in a memory cgroup of 2 GiB with 512 MiB in
// use (faked), Open refuses a 3 GiB zinf.tiers.cpu_pinned_bytes before it
// builds anything (no swap store, no bandwidth probe in the NVMe
// directory), wrapping buffers.ErrMemory and naming the key, both figures
// and the cgroup file; it used to map and lock the whole pool, which the
// cgroup OOM-kills.
func TestOpenPoolBeyondCgroup(t *testing.T) {
	testenv.FakeCgroup(t, 2<<30, 512<<20) // 1.5 GiB left
	c, dir := testConfig(t)
	c.Zinf.Tiers.CPUPinnedBytes = 3 << 30
	_, err := zinf.Open(c, oneTensor("w", 5000), zinf.Options{})
	if !errors.Is(err, buffers.ErrMemory) {
		t.Fatalf("Open = %v, want buffers.ErrMemory", err)
	}
	for _, w := range []string{"zinf.tiers.cpu_pinned_bytes = 3 GiB", "1.5 GiB (1610612736 bytes) of memory", "cgroup v2", "/sys/fs/cgroup/job"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		slices.Sort(names)
		t.Fatalf("the refused Open left %v in %s", names, dir)
	}
}

// TestKVCacheBeyondMemory: with 1.5 GiB that the process may still take
// (a faked cgroup), OpenKVCache refuses a 4 GiB cache in memory and on the
// cpu tier before it takes any of it, wrapping buffers.ErrMemory and naming
// the tier, the figure, the limit and zinf.kv_cache; on NVMe (pinned
// staging of three layers) the same cache opens.
func TestKVCacheBeyondMemory(t *testing.T) {
	testenv.FakeCgroup(t, 2<<30, 512<<20) // 1.5 GiB left
	for _, dev := range []string{"memory", "cpu", "nvme"} {
		c, _ := testConfig(t)
		c.Zinf.KVCache.Device = config.KVCacheDevice(dev)
		rt, err := zinf.Open(c, oneTensor("w", 5000), zinf.Options{})
		if err != nil {
			t.Fatal(err)
		}
		layerBytes := int64(1 << 30)
		if dev == "nvme" {
			layerBytes = 64 << 20 // 3 x 64 MiB of staging; the refusal is what is tested above
		}
		kv, err := rt.OpenKVCache(4, layerBytes)
		if dev == "nvme" {
			if err != nil {
				t.Errorf("nvme: OpenKVCache = %v", err)
			} else if err := kv.Close(); err != nil {
				t.Error(err)
			}
		} else {
			if !errors.Is(err, buffers.ErrMemory) {
				t.Errorf("%s: OpenKVCache = %v, want buffers.ErrMemory", dev, err)
			} else {
				for _, w := range []string{"KV cache on " + dev, "needs 4GiB", "1536MiB", "zinf.kv_cache.device", "cgroup v2"} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not say %q", dev, err, w)
					}
				}
			}
		}
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
