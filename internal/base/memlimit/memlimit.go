// Package memlimit reads how much memory this process may still take: the
// tightest of the kernel's estimate of what can be allocated without
// swapping (MemAvailable), the memory cgroup's limit less its usage
// (cgroup v2 memory.max, v1 memory.limit_in_bytes, at the process's cgroup
// and every ancestor), and the address-space limit (ulimit -v: RLIMIT_AS)
// less what the process already maps (VmSize). RLIMIT_DATA is not read:
// the race detector's shadow mappings count in the data segment figure
// the kernel reports but not against the limit, so no figure would be true.
// The pinned pool (buffers.NewPool) and the command line's size checks
// refuse a size beyond it before allocating, instead of being OOM-killed
// (a cgroup) or dying in a Go fatal out-of-memory (ulimit -v).
//
// Every figure is read from files under a root ("/" normally) and from
// getrlimit, both replaceable (Source), so that tests fake any limit
// without a real cgroup. Where nothing can be read there is no figure, and
// callers check nothing rather than guess.
package memlimit

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/base/units"
)

// Limit is what the process may still allocate under one limit, or the
// tightest of them (Available).
type Limit struct {
	// Bytes is what may still be allocated (0 when the limit is already
	// reached).
	Bytes int64
	// What names the limit and its figures in words, for messages:
	// "MemAvailable in /proc/meminfo", "the memory cgroup's memory.max of
	// 2 GiB (...) less the 1.5 GiB (...) it uses (/sys/fs/cgroup/x)".
	What string
}

// Source is where the figures come from.
type Source struct {
	// Root is the directory the proc and sys files are read under: ""
	// is "/". Tests point it at a tree of fake files.
	Root string
	// Rlimit returns a resource's soft limit (unix.RLIMIT_AS); ok is
	// false for none (unlimited or unreadable). nil reads getrlimit.
	Rlimit func(resource int) (cur uint64, ok bool)
}

var override atomic.Pointer[Source]

// Override makes Available read s until restore is called: a test's fake
// limits, seen by the packages that check against them (buffers, the
// command line). Tests only.
func Override(s Source) (restore func()) {
	old := override.Swap(&s)
	return func() { override.Store(old) }
}

// Available returns the tightest limit on what this process may still
// allocate; ok is false when no figure could be read.
func Available() (Limit, bool) {
	if s := override.Load(); s != nil {
		return s.Available()
	}
	return Source{}.Available()
}

// Available returns the tightest of s.All.
func (s Source) Available() (Limit, bool) {
	all := s.All()
	if len(all) == 0 {
		return Limit{}, false
	}
	best := all[0]
	for _, l := range all[1:] {
		if l.Bytes < best.Bytes {
			best = l
		}
	}
	return best, true
}

// All returns every limit that applies and could be read, MemAvailable
// first.
func (s Source) All() []Limit {
	var out []Limit
	if n, ok := s.memAvailable(); ok {
		out = append(out, Limit{Bytes: n, What: "MemAvailable in /proc/meminfo"})
	}
	out = append(out, s.cgroups()...)
	out = append(out, s.rlimits()...)
	return out
}

func (s Source) path(p string) string {
	if s.Root == "" {
		return p
	}
	return filepath.Join(s.Root, p)
}

// maxProcFile bounds what is read of a proc or cgroup file: ours are a few
// kilobytes (a cgroup file one number).
const maxProcFile = 1 << 20

func (s Source) read(p string) ([]byte, error) {
	f, err := os.Open(s.path(p))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(&limitedReader{f: f, n: maxProcFile})
	return b.Bytes(), err
}

type limitedReader struct {
	f *os.File
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("%s is longer than %d bytes", l.f.Name(), maxProcFile)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.f.Read(p)
	l.n -= int64(n)
	return n, err
}

// field returns a "Name:   N kB" field of a proc file in bytes.
func (s Source) field(file, name string) (int64, bool) {
	data, err := s.read(file)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == name+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 || kb > math.MaxInt64/1024 {
				return 0, false
			}
			return kb * 1024, true
		}
	}
	return 0, false
}

func (s Source) memAvailable() (int64, bool) { return s.field("/proc/meminfo", "MemAvailable") }

// number reads a cgroup file holding one number ("max" or a value past
// 2^62, which cgroup v1 writes for no limit, is none).
func (s Source) number(p string) (int64, bool) {
	b, err := s.read(p)
	if err != nil {
		return 0, false
	}
	v := strings.TrimSpace(string(b))
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n >= 1<<62 {
		return 0, false
	}
	return int64(n), true
}

// cgroups returns the memory cgroup limits of the process's cgroup and its
// ancestors, v2 and v1: each limit less the usage at its level.
func (s Source) cgroups() []Limit {
	data, err := s.read("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	var out []Limit
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// "hierarchy-ID:controller-list:cgroup-path"
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			for _, mnt := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
				out = append(out, s.levels(mnt, parts[2], "memory.max", "memory.current", "cgroup v2")...)
			}
		case hasController(parts[1], "memory"):
			out = append(out, s.levels("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes", "memory.usage_in_bytes", "cgroup v1")...)
		}
	}
	return out
}

func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// levels reads limit and usage files at the cgroup path under the mount
// point mnt and at each ancestor up to mnt. Inside a cgroup namespace the
// path may be "/" while the mount shows the namespace's own cgroup, which
// the mount point itself then covers.
func (s Source) levels(mnt, cg, limitFile, usageFile, kind string) []Limit {
	cg = filepath.Clean("/" + cg)
	if strings.Contains(cg, "..") {
		return nil
	}
	var out []Limit
	for dir := filepath.Join(mnt, cg); ; dir = filepath.Dir(dir) {
		if lim, ok := s.number(filepath.Join(dir, limitFile)); ok {
			used, _ := s.number(filepath.Join(dir, usageFile))
			out = append(out, Limit{Bytes: max(lim-used, 0),
				What: fmt.Sprintf("the memory %s's %s of %s less the %s it uses (%s)", kind, limitFile, units.FormatBytesExact(lim), units.FormatBytesExact(used), dir)})
		}
		if dir == mnt || len(dir) <= len(mnt) {
			break
		}
	}
	return out
}

// rlimits returns RLIMIT_AS less the address space mapped (VmSize).
func (s Source) rlimits() []Limit {
	get := s.Rlimit
	if get == nil {
		get = getrlimit
	}
	cur, ok := get(unix.RLIMIT_AS)
	if !ok || cur >= math.MaxInt64 {
		return nil
	}
	used, _ := s.field("/proc/self/status", "VmSize")
	return []Limit{{Bytes: max(int64(cur)-used, 0),
		What: fmt.Sprintf("ulimit -v (RLIMIT_AS) of %s less the %s of address space this process maps (VmSize in /proc/self/status)",
			units.FormatBytesExact(int64(cur)), units.FormatBytesExact(used))}}
}

func getrlimit(res int) (uint64, bool) {
	var l unix.Rlimit
	if err := unix.Getrlimit(res, &l); err != nil {
		return 0, false
	}
	cur := uint64(l.Cur) // int64 on some systems
	if cur == uint64(unix.RLIM_INFINITY) {
		return 0, false
	}
	return cur, true
}
