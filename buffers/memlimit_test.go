package buffers_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/memlimit"
)

// TestPoolBeyondMemory: a pool larger than this process may still
// allocate (here a faked MemAvailable of 64 MiB) is refused before
// anything is mapped, wrapping ErrMemory and naming the capacity, what is
// available and the limit; one that fits is made.
func TestPoolBeyondMemory(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc", "meminfo"), []byte("MemTotal: 1048576 kB\nMemAvailable: 65536 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer memlimit.Override(memlimit.Source{Root: root, Rlimit: func(int) (uint64, bool) { return 0, false }})()
	_, err := buffers.NewPool(buffers.Options{CapacityBytes: 128 << 20})
	if !errors.Is(err, buffers.ErrMemory) {
		t.Fatalf("a 128 MiB pool with 64 MiB available: %v, want ErrMemory", err)
	}
	for _, w := range []string{"Options.CapacityBytes 128 MiB (134217728 bytes)", "64 MiB (67108864 bytes)", "MemAvailable"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 32 << 20})
	if err != nil {
		t.Fatalf("a 32 MiB pool with 64 MiB available: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
