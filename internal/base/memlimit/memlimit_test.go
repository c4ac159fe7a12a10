package memlimit_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/base/memlimit"
)

// fakeRoot writes files (path -> content) under a fresh directory.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const meminfo = "MemTotal:       16384000 kB\nMemFree:         1000 kB\nMemAvailable:    8388608 kB\n" // 8 GiB available

func noRlimit(int) (uint64, bool) { return 0, false }

// TestTightest: each source alone, and the tightest of several, with the
// figures named in What.
func TestTightest(t *testing.T) {
	const gib = int64(1) << 30
	for _, c := range []struct {
		name   string
		files  map[string]string
		rlimAS uint64
		want   int64
		what   []string
	}{
		{"meminfo only", map[string]string{"proc/meminfo": meminfo}, 0, 8 * gib, []string{"MemAvailable"}},
		{"cgroup v2 leaf", map[string]string{
			"proc/meminfo":                         meminfo,
			"proc/self/cgroup":                     "0::/job/run\n",
			"sys/fs/cgroup/job/run/memory.max":     "3221225472\n", // 3 GiB
			"sys/fs/cgroup/job/run/memory.current": "1073741824\n", // 1 GiB
		}, 0, 2 * gib, []string{"cgroup v2", "memory.max", "3 GiB", "1 GiB", "sys/fs/cgroup/job/run"}},
		{"cgroup v2 ancestor tighter", map[string]string{
			"proc/meminfo":                         meminfo,
			"proc/self/cgroup":                     "0::/job/run\n",
			"sys/fs/cgroup/job/run/memory.max":     "max\n",
			"sys/fs/cgroup/job/run/memory.current": "1073741824\n",
			"sys/fs/cgroup/job/memory.max":         "2147483648\n", // 2 GiB
			"sys/fs/cgroup/job/memory.current":     "1610612736\n", // 1.5 GiB
		}, 0, gib / 2, []string{"cgroup v2", "sys/fs/cgroup/job)"}},
		{"cgroup v2 namespace root", map[string]string{
			"proc/meminfo":                 meminfo,
			"proc/self/cgroup":             "0::/\n",
			"sys/fs/cgroup/memory.max":     "2147483648\n",
			"sys/fs/cgroup/memory.current": "0\n",
		}, 0, 2 * gib, []string{"cgroup v2"}},
		{"cgroup v1", map[string]string{
			"proc/meminfo":     meminfo,
			"proc/self/cgroup": "5:cpu,cpuacct:/x\n4:memory:/x/y\n0::/\n",
			"sys/fs/cgroup/memory/x/y/memory.limit_in_bytes": "4294967296\n",
			"sys/fs/cgroup/memory/x/y/memory.usage_in_bytes": "1073741824\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":     "9223372036854771712\n", // v1's "no limit"
		}, 0, 3 * gib, []string{"cgroup v1", "memory.limit_in_bytes"}},
		{"ulimit -v", map[string]string{
			"proc/meminfo":     meminfo,
			"proc/self/status": "Name: zinf\nVmSize:  1048576 kB\nVmRSS: 10 kB\n", // 1 GiB mapped
		}, 3 << 30, 2 * gib, []string{"ulimit -v (RLIMIT_AS)", "3 GiB", "1 GiB", "VmSize"}},
		{"limit already reached", map[string]string{
			"proc/meminfo":     meminfo,
			"proc/self/status": "VmSize:  4194304 kB\n",
		}, 3 << 30, 0, []string{"RLIMIT_AS"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := memlimit.Source{Root: fakeRoot(t, c.files), Rlimit: noRlimit}
			if c.rlimAS > 0 {
				src.Rlimit = func(res int) (uint64, bool) { return c.rlimAS, res == unix.RLIMIT_AS }
			}
			got, ok := src.Available()
			if !ok || got.Bytes != c.want {
				t.Fatalf("Available = %+v, %v; want %d bytes", got, ok, c.want)
			}
			for _, w := range c.what {
				if !strings.Contains(got.What+" ", w) {
					t.Errorf("What %q does not say %q", got.What, w)
				}
			}
		})
	}
}

// TestNothingReadable: with no file and no rlimit there is no figure
// (callers then check nothing rather than guess); damaged files give none.
func TestNothingReadable(t *testing.T) {
	if l, ok := (memlimit.Source{Root: t.TempDir(), Rlimit: noRlimit}).Available(); ok {
		t.Fatalf("Available = %+v with nothing to read", l)
	}
	root := fakeRoot(t, map[string]string{
		"proc/meminfo":                 "MemAvailable: lots kB\n",
		"proc/self/cgroup":             "0::/../../etc\n",
		"sys/fs/cgroup/memory.max":     "-5\n",
		"sys/fs/cgroup/memory.current": "x\n",
	})
	if l, ok := (memlimit.Source{Root: root, Rlimit: noRlimit}).Available(); ok {
		t.Fatalf("Available = %+v from damaged files", l)
	}
}

// TestOverride: Available reads the override until it is restored.
func TestOverride(t *testing.T) {
	restore := memlimit.Override(memlimit.Source{Root: fakeRoot(t, map[string]string{"proc/meminfo": "MemAvailable: 1024 kB\n"}), Rlimit: noRlimit})
	if l, ok := memlimit.Available(); !ok || l.Bytes != 1<<20 {
		t.Fatalf("overridden Available = %+v, %v", l, ok)
	}
	restore()
	if l, ok := memlimit.Available(); ok && l.Bytes == 1<<20 {
		t.Fatalf("Available still overridden: %+v", l)
	}
}
