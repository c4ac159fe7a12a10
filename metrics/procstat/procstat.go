// Package procstat reads this process's memory and disk counters from
// /proc, for the benchmarks and tools that report them beside zinf's own
// figures: peak and current resident set, the machine's memory, and the
// bytes the process made the block layer read and write. Every reader
// returns 0 (and false where it says so) where /proc has no such figure:
// not Linux, or a kernel without the field.
package procstat

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// maxKB bounds a figure read from /proc before it is scaled to bytes: a
// value beyond it is not a memory size (and would overflow int64 as bytes).
const maxKB = 1 << 53

// field reads the first number after "key:" in a /proc file whose lines are
// "Key: N [kB]", multiplied by unit; ok says it was there and well formed.
func field(path, key string, unit int64) (n int64, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ":")
		if !found || k != key {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			return 0, false
		}
		x, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil || x < 0 || x > maxKB {
			return 0, false
		}
		return x * unit, true
	}
	return 0, false
}

// Status reads a "Name: N kB" field of /proc/self/status in bytes
// (VmHWM, VmRSS, RssAnon, RssFile, ...).
func Status(name string) (int64, bool) { return field("/proc/self/status", name, 1024) }

// PeakRSS is the process's peak resident set (VmHWM) in bytes.
func PeakRSS() int64 { n, _ := Status("VmHWM"); return n }

// RSS is the process's current resident set (VmRSS) in bytes.
func RSS() int64 { n, _ := Status("VmRSS"); return n }

// ResetPeakRSS starts the peak resident set over from the current one
// (Linux: writing 5 to /proc/self/clear_refs), so that a peak read later
// covers what ran after it. Elsewhere it does nothing.
func ResetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// MemTotal is the machine's memory (MemTotal of /proc/meminfo) in bytes.
func MemTotal() int64 { n, _ := field("/proc/meminfo", "MemTotal", 1024); return n }

// IO is what this process has made the block layer read and write so far
// (/proc/self/io read_bytes and write_bytes): page-cache hits are not
// counted, O_DIRECT transfers are. ok is false where the file is missing.
func IO() (read, written int64, ok bool) {
	r, okR := field("/proc/self/io", "read_bytes", 1)
	w, okW := field("/proc/self/io", "write_bytes", 1)
	return r, w, okR && okW
}

// RunChild runs exe with args as a child process (its stderr passed
// through, so its progress shows) and decodes the JSON it prints on stdout
// into out: how the benchmarks measure each side in a fresh process, whose
// peak resident set and GC counters are its own.
func RunChild(exe string, args []string, out any) error {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("the child's result (%d bytes of stdout): %w", len(b), err)
	}
	return nil
}
