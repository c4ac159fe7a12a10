package zgomlx

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

// AutoHeapCredit, as Options.HeapCredit, sizes the heap credit from the
// model: the bytes training in memory would keep live on the Go heap
// (Offload.InMemoryBytes: the parameters, and the optimizer's fp32
// master weights and states), at most a quarter of the machine's memory.
//
// It is the default: Options.HeapCredit 0 means AutoHeapCredit.
const AutoHeapCredit int64 = -1

// NoHeapCredit, as Options.HeapCredit, takes no credit: the collector
// paces by the small live heap of offloaded training (more cycles, less
// memory).
const NoHeapCredit int64 = -2

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

// gcCredit is the process's credit: the sum over the Offloads holding
// one.
var gcCredit struct {
	sync.Mutex
	total   int64            // bytes of credit held
	base    int              // GOGC before the first credit was taken
	set     int              // the GOGC the credit last set
	samples []metrics.Sample // liveSamples, read at each adjustment
}

// checkHeapCredit says whether n is an Options.HeapCredit allowed.
func checkHeapCredit(n int64) error {
	if n < 0 && n != AutoHeapCredit && n != NoHeapCredit {
		return fmt.Errorf("zgomlx: Options.HeapCredit %d: want 0 or AutoHeapCredit (%d: the default, what training in memory keeps live), NoHeapCredit (%d), or a number of bytes", n, AutoHeapCredit, NoHeapCredit)
	}
	return nil
}

// applyHeapCredit takes the credit Options.HeapCredit n asks for
// (checked by checkHeapCredit).
func (o *Offload) applyHeapCredit(n int64) {
	switch n {
	case NoHeapCredit:
		o.credit, o.creditStatus = 0, "none (Options.HeapCredit NoHeapCredit)"
		return
	case 0, AutoHeapCredit:
		n = o.InMemoryBytes()
		if mem := physicalMemory(); mem > 0 && n > mem/4 {
			n = mem / 4
		}
	}
	if limit := debug.SetMemoryLimit(-1); limit != math.MaxInt64 {
		// A memory limit (GOMEMLIMIT) paces the collector by the
		// process's memory already.
		o.creditStatus = fmt.Sprintf("none: a Go memory limit is set (%d bytes), which paces the collector", limit)
		return
	}
	gcCredit.Lock()
	defer gcCredit.Unlock()
	if gcCredit.total == 0 {
		base := debug.SetGCPercent(100)
		debug.SetGCPercent(base)
		if base < 0 {
			o.creditStatus = "none: the collector is off (GOGC=off)"
			return
		}
		gcCredit.base, gcCredit.set = base, base
	}
	gcCredit.total += n
	o.credit = n
	o.creditStatus = fmt.Sprintf("%d bytes (GOGC %d scaled by the live heap)", n, gcCredit.base)
	adjustGCLocked()
}

// releaseHeapCredit gives the Offload's credit back; the last one
// restores GOGC.
func (o *Offload) releaseHeapCredit() {
	if o.credit == 0 {
		return
	}
	gcCredit.Lock()
	defer gcCredit.Unlock()
	gcCredit.total -= o.credit
	o.credit = 0
	if gcCredit.total == 0 {
		debug.SetGCPercent(gcCredit.base)
		return
	}
	adjustGCLocked()
}

// adjustHeapCredit sets GOGC for the live heap now, if a credit is held.
func adjustHeapCredit() {
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

// InMemoryBytes is what training the registered variables in memory
// keeps live: the optimizer's fp32 master weights and rule states (Adam:
// 12 bytes per element) and, unless the parameters are fp32 (then they
// are the masters), the parameters in their dtype.
func (o *Offload) InMemoryBytes() int64 {
	n := o.rt.Optimizer.Stats().StateBytes
	if ps := int64(o.rt.DType.Size()); ps != 4 {
		for _, v := range o.vars {
			n += int64(v.numel) * ps
		}
	}
	return n
}

// HeapCredit returns the bytes of heap credit the Offload holds
// (Options.HeapCredit) and a line saying what became of the request.
func (o *Offload) HeapCredit() (int64, string) {
	return o.credit, o.creditStatus
}

// physicalMemory is the machine's memory (MemTotal), or 0.
func physicalMemory() int64 {
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
