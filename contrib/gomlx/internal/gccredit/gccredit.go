// Package gccredit paces the Go garbage collector as if a credit of
// bytes were live on the heap: zgomlx's Offloads take one so that
// training with its state in zinf collects about as often as training
// with that state on the Go heap.
//
// The Go garbage collector starts a cycle when the heap has grown by
// GOGC% of what was live after the last one (plus stacks and globals).
// Training in memory keeps the model's parameters and optimizer states
// live on the Go heap, so the GoMLX temporaries of a step are a small
// fraction of the heap and cycles are rare; offloaded, the state lives in
// zinf's pinned pool and on NVMe, the live heap is small, and the same
// temporaries (1.05x the bytes per step) bring about twice the cycles.
//
// A heap credit makes the collector pace as if the credit's bytes were
// live: with C bytes of credit and L live, GOGC is set to
// base * (L + C) / L (base: GOGC as it was), so the next cycle starts
// after the same growth as with C more bytes on the heap. The credit is
// re-evaluated at every Trainer commit (L moves) and when an Offload
// holding one closes; the last one to close restores GOGC. A pointer-free
// "ballast" allocation would do the same without touching GOGC, but Go
// clears an allocation that reuses memory the heap had before, which
// makes its pages resident: measured here, a 1 GiB ballast allocated
// after a freed one cost 1 GiB of RSS.
//
// Like GOGC itself, a credit trades memory for fewer cycles: between two
// collections the heap may grow by about base% of (L + C), as it would
// with the state on the heap.
package gccredit

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
)

// gcCredit is the process's credit: the sum of the credits taken.
var gcCredit struct {
	sync.Mutex
	total   int64            // bytes of credit held
	base    int              // GOGC before the first credit was taken
	set     int              // the GOGC the credit last set
	samples []metrics.Sample // liveSamples, read at each adjustment
}

// Take takes n bytes of credit (n > 0) and returns the bytes taken and
// a line saying what became of the request: none where a Go memory limit
// is set (GOMEMLIMIT paces the collector by the process's memory
// already) or the collector is off (GOGC=off).
func Take(n int64) (taken int64, status string) {
	if limit := debug.SetMemoryLimit(-1); limit != math.MaxInt64 {
		return 0, fmt.Sprintf("none: a Go memory limit is set (%d bytes), which paces the collector", limit)
	}
	gcCredit.Lock()
	defer gcCredit.Unlock()
	if gcCredit.total == 0 {
		base := debug.SetGCPercent(100)
		debug.SetGCPercent(base)
		if base < 0 {
			return 0, "none: the collector is off (GOGC=off)"
		}
		gcCredit.base, gcCredit.set = base, base
	}
	gcCredit.total += n
	adjustGCLocked()
	return n, fmt.Sprintf("%d bytes (GOGC %d scaled by the live heap)", n, gcCredit.base)
}

// Release gives back n bytes that Take took; the last release restores
// GOGC.
func Release(n int64) {
	if n == 0 {
		return
	}
	gcCredit.Lock()
	defer gcCredit.Unlock()
	gcCredit.total -= n
	if gcCredit.total == 0 {
		debug.SetGCPercent(gcCredit.base)
		return
	}
	adjustGCLocked()
}

// Adjust sets GOGC for the live heap now, if a credit is held (the live
// heap moves as training runs).
func Adjust() {
	gcCredit.Lock()
	defer gcCredit.Unlock()
	if gcCredit.total > 0 {
		adjustGCLocked()
	}
}

// liveSamples are what the collector counts as live: the heap marked at
// the last cycle, the stacks and the globals it scans.
var liveSamples = []string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// adjustGCLocked sets GOGC to base * (live + credit) / live (gcCredit
// held), when that moves it by more than 2%.
func adjustGCLocked() {
	if gcCredit.samples == nil {
		gcCredit.samples = make([]metrics.Sample, len(liveSamples))
		for i, name := range liveSamples {
			gcCredit.samples[i].Name = name
		}
	}
	s := gcCredit.samples
	metrics.Read(s)
	var live uint64
	for _, x := range s {
		if x.Value.Kind() == metrics.KindUint64 {
			live += x.Value.Uint64()
		}
	}
	live = max(live, 4<<20) // the collector's own floor for the heap goal
	pct := float64(gcCredit.base) * (float64(live) + float64(gcCredit.total)) / float64(live)
	want := int(min(pct, 1e9))
	if d := want - gcCredit.set; d*50 > gcCredit.set || -d*50 > gcCredit.set {
		debug.SetGCPercent(want)
		gcCredit.set = want
	}
}

// PhysicalMemory is the machine's memory (MemTotal), or 0.
func PhysicalMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) >= 2 && string(f[0]) == "MemTotal:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
