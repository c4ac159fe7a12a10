// Package doctor reports what this machine supports for zinf and why: the
// I/O backends, O_DIRECT and alignment per path, free space, the memlock
// limit that decides whether pinned memory can be locked, CPUs, and the GPU
// side (CUDA driver, device, cuFile). It backs `zinf doctor`.
package doctor

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/swapper"
)

var discard = slog.New(slog.DiscardHandler)

// Check is one line of the report.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Unusable marks a swap path zinf cannot use at all (missing, not a
	// directory, not writable); a path without O_DIRECT is only not OK.
	Unusable bool `json:"unusable,omitempty"`
	// Stale lists, on a "stale <path>" check, the swap space that runs
	// which are gone left in the path (see swapper.FindStale).
	Stale []swapper.StaleRun `json:"stale,omitempty"`
}

// Report is the whole diagnosis.
type Report struct {
	Checks []Check `json:"checks"`
}

func (r *Report) add(name string, ok bool, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
}

// Run diagnoses the machine for the given swap paths.
func Run(paths []string) *Report {
	r := &Report{}
	var uts unix.Utsname
	unix.Uname(&uts)
	r.add("system", true, "%s %s, %s, %d CPUs", unix.ByteSliceToString(uts.Sysname[:]), unix.ByteSliceToString(uts.Release[:]), runtime.Version(), runtime.NumCPU())
	for _, b := range aio.Backends {
		if err := aio.Available(b); err != nil {
			r.add("backend "+b, false, "%v", err)
		} else {
			r.add("backend "+b, true, "available")
		}
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err == nil {
		if lim.Cur == unix.RLIM_INFINITY {
			r.add("memlock", true, "unlimited: the pinned pool can be locked")
		} else {
			detail := fmt.Sprintf("limit %s (hard %s)", config.Size(int64(lim.Cur)), hard(uint64(lim.Max)))
			capOK := os.Geteuid() == 0
			if capOK {
				detail += "; running as root (CAP_IPC_LOCK): locking is allowed regardless"
			} else {
				detail += "; a larger pinned pool runs unpinned with a warning — raise it with `ulimit -l unlimited` or LimitMEMLOCK=infinity"
			}
			r.add("memlock", capOK || lim.Cur >= 1<<30, "%s", detail)
		}
	}
	r.memory()
	r.registered()
	for _, p := range paths {
		r.path(p)
	}
	if info, err := cuda.Probe(cuda.Options{}); err != nil {
		r.add("cuda", false, "%v", err)
	} else {
		r.add("cuda", true, "device %d: %s, %s total, %s free, driver CUDA %s (%s)", info.Ordinal, info.Name,
			config.Size(info.TotalBytes), config.Size(info.FreeBytes), info.DriverVersionString(), info.Library)
	}
	if err := gds.AvailableFor(gds.Options{Paths: paths}); err != nil {
		r.add("cufile", false, "%v", err)
	} else if len(paths) > 0 {
		r.add("cufile", true, "GPUDirect Storage available: cuFile registers a file in %s", strings.Join(paths, ", "))
	} else {
		r.add("cufile", true, "GPUDirect Storage available (no --path: file registration not checked)")
	}
	return r
}

// memory reports what this process may still allocate, by the tightest
// limit (memlimit.Available: MemAvailable, the memory cgroup's limit less
// its usage, ulimit -v less the address space mapped), and every other
// limit that applies: the pinned pool (zinf.tiers.cpu_pinned_bytes, per
// rank) must fit in it, or zinf refuses it.
func (r *Report) memory() {
	all := memlimit.Source{}.All()
	lim, ok := memlimit.Source{}.Available()
	if !ok {
		r.add("memory", false, "no figure: neither /proc/meminfo, a memory cgroup nor ulimit -v could be read, so pinned pool sizes are not checked")
		return
	}
	var others []string
	for _, l := range all {
		if l.What != lim.What {
			others = append(others, fmt.Sprintf("%s: %s", l.What, units.FormatBytes(l.Bytes)))
		}
	}
	detail := fmt.Sprintf("%s may still be allocated, by %s; the pinned pool (zinf.tiers.cpu_pinned_bytes, per rank) must fit in it", units.FormatBytes(lim.Bytes), lim.What)
	if len(others) > 0 {
		detail += " (also: " + strings.Join(others, "; ") + ")"
	}
	r.add("memory", true, "%s", detail)
}

// registered reports whether io_uring takes registered buffers and fixed
// files here, by registering 2 MiB of memory with a one-ring engine: the
// pinned pool is registered the same way, and is moved with plain reads
// and writes where this fails (typically a memlock limit below the pool
// without CAP_IPC_LOCK).
func (r *Report) registered() {
	const name = "registered"
	if err := aio.Available(aio.BackendUring); err != nil {
		r.add(name, false, "no io_uring registered buffers: %v", err)
		return
	}
	e, err := aio.New(aio.Options{Backend: aio.BackendUring, QueueDepth: 1, Logger: discard})
	if err != nil {
		r.add(name, false, "%v", err)
		return
	}
	defer e.Close()
	mem, err := unix.Mmap(-1, 0, 2<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		r.add(name, false, "mapping a test buffer: %v", err)
		return
	}
	defer unix.Munmap(mem)
	if err := e.RegisterMemory(mem); err != nil {
		r.add(name, false, "io_uring refused registered buffers: %v; the pinned pool is moved with plain reads and writes", err)
		return
	}
	e.UnregisterMemory(mem)
	r.add(name, true, "io_uring registered buffers work: the pinned pool is registered with each ring (READ_FIXED/WRITE_FIXED)")
}

func hard(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return config.Size(int64(v)).String()
}

func (r *Report) path(p string) {
	name := "path " + p
	unusable := func(format string, args ...any) {
		r.add(name, false, format, args...)
		r.Checks[len(r.Checks)-1].Unusable = true
	}
	st, err := os.Stat(p)
	if err != nil {
		unusable("%v", err)
		return
	}
	if !st.IsDir() {
		unusable("not a directory")
		return
	}
	if err := unix.Access(p, unix.W_OK); err != nil {
		unusable("not writable: %v", err)
		return
	}
	space := spaceOf(p)
	align, direct, err := aio.ProbeDir(p, aio.DirectOptional)
	switch {
	case err != nil:
		r.add(name, false, "probe failed: %v", err)
	case direct:
		r.add(name, true, "O_DIRECT yes, alignment %d bytes, %s", align, space)
	default:
		r.add(name, false, "O_DIRECT no (buffered fallback under policy \"optional\"; \"required\" fails), %s", space)
	}
	r.stale(p)
}

// spaceOf says how much space p has and, for a RAM-backed filesystem, that
// what is swapped there stays in memory: swapping to it saves no RAM.
func spaceOf(p string) string {
	var sfs unix.Statfs_t
	if err := unix.Statfs(p, &sfs); err != nil {
		return fmt.Sprintf("free space unknown (%v)", err)
	}
	free := config.Size(int64(sfs.Bavail) * int64(sfs.Bsize))
	switch ramBacked(&sfs) {
	case "ramfs":
		return "RAM-backed (ramfs): data lives in memory and swapping there saves none; free space not reported (ramfs has no limit but RAM)"
	case "tmpfs":
		return fmt.Sprintf("RAM-backed (tmpfs): data lives in memory (or swap) and swapping there saves none; %s free under the mount's size limit", free)
	}
	if sfs.Blocks == 0 {
		return "free space not reported by the filesystem"
	}
	return fmt.Sprintf("%s free", free)
}

// stale reports the swap space that dead runs left in p.
func (r *Report) stale(p string) {
	name := "stale " + p
	runs, err := swapper.FindStale(p)
	if err != nil {
		r.add(name, false, "%v", err)
		return
	}
	if len(runs) == 0 {
		r.add(name, true, "no scratch space (swap stores, tools' data files) left by runs that are gone")
		return
	}
	host, _ := os.Hostname()
	var total int64
	var list []string
	for _, s := range runs {
		total += s.Bytes
		who := fmt.Sprintf("pid %d", s.PID)
		if s.PID == 0 {
			who = "pid unknown"
		}
		if s.Host != "" && s.Host != host {
			who += " on host " + s.Host + ", not removed automatically"
		}
		if s.Incomplete {
			who += ", killed while making it"
		}
		list = append(list, fmt.Sprintf("%s (%s, %s, %s)", s.Dir, runKind(s.Name), who, config.Size(s.Bytes)))
	}
	r.add(name, false, "%d run(s) that are gone left %s (%d bytes): %s; the next zinf run in this path (one that opens a swap store, or bench-io, tune, ckpt bench, bench-scale) removes them",
		len(runs), config.Size(total), total, strings.Join(list, ", "))
	r.Checks[len(r.Checks)-1].Stale = runs
}

// runKind says what left a run directory, from its name: a tool's own
// (swapper.NewRunDir) or a swap store's.
func runKind(name string) string {
	switch name {
	case "compare":
		return "zinf bench-io"
	case "tune":
		return "zinf tune"
	case "ckpt-bench":
		return "zinf ckpt bench"
	case "bench-scale-probe":
		return "zinf bench-scale's probe"
	case "generate":
		return "zinf-generate"
	}
	return "swap store " + name
}

// Unusable returns the paths zinf cannot use at all.
func (r *Report) Unusable() []string {
	var out []string
	for _, c := range r.Checks {
		if c.Unusable {
			out = append(out, strings.TrimPrefix(c.Name, "path "))
		}
	}
	return out
}

// Write prints the report as a table.
func (r *Report) Write(w io.Writer) error {
	for _, c := range r.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "no  "
		}
		if _, err := fmt.Fprintf(w, "%s %-16s %s\n", mark, c.Name, strings.TrimSpace(c.Detail)); err != nil {
			return err
		}
	}
	return nil
}
