package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/zinfio/zinf/internal/base/memlimit"
)

// FakeCgroup makes memlimit read a cgroup v2 memory limit of limit bytes
// with used bytes in use (cgroup /job under a fake /sys/fs/cgroup), plenty
// of MemAvailable (1 TiB) and no rlimit, until the test ends.
func FakeCgroup(t testing.TB, limit, used int64) {
	t.Helper()
	root := t.TempDir()
	for p, c := range map[string]string{
		"proc/meminfo":                     "MemAvailable: 1073741824 kB\n",
		"proc/self/cgroup":                 "0::/job\n",
		"sys/fs/cgroup/job/memory.max":     strconv.FormatInt(limit, 10) + "\n",
		"sys/fs/cgroup/job/memory.current": strconv.FormatInt(used, 10) + "\n",
	} {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(memlimit.Override(memlimit.Source{Root: root, Rlimit: func(int) (uint64, bool) { return 0, false }}))
}
