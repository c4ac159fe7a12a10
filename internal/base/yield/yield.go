// Package yield lets zinf's background work give way to the caller's
// compute.
//
// Go schedules goroutines on GOMAXPROCS processors with no priorities. A
// parallel compute kernel (the GoMLX backend's matrix products, for one)
// splits an operation into one piece per processor and waits for the last
// piece; when one processor is busy with zinf's own work (a checksum, a
// gradient sum, an optimizer update), the piece meant for it waits in a run
// queue until that work blocks or is preempted, up to 10 ms later, and the
// whole operation waits with it. On the project's 2-core test machine one
// goroutine of such work beside the compute made it 48-88% slower, not the
// few percent its CPU time would take.
//
// Begin marks compute that background work should give way to, until its
// End. Background loops call Point between chunks of tens of
// microseconds: while compute runs and some goroutine is waiting for a
// processor (runtime/metrics' /sched/goroutines/runnable), Point sleeps
// briefly, so that the waiting goroutine gets the processor and the work
// goes on when a processor is free. With no compute marked, Point only
// loads a counter: work that is all background (a benchmark of the I/O
// path, an optimizer step between forward passes) runs as before.
// Pausing changes when work runs, never what it computes.
package yield

import (
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Pause is how long Point sleeps when it gives way: long enough for the
// processor to be taken by a waiting goroutine (a few microseconds), short
// against a compute kernel's pieces (milliseconds).
const Pause = 50 * time.Microsecond

// Chunk is the bytes of streamed memory a background loop handles between
// two Points: about 15-60 µs of a checksum, a sum or a copy.
const Chunk = 256 << 10

var (
	active atomic.Int32
	pauses atomic.Int64
)

// Begin marks the start of compute that background work gives way to;
// each Begin needs its End. Marks nest and may overlap across goroutines.
func Begin() { active.Add(1) }

// End marks the end of compute begun by Begin.
func End() {
	if active.Add(-1) < 0 {
		panic("yield: End without Begin")
	}
}

// Active says whether compute is marked now.
func Active() bool { return active.Load() > 0 }

// Pauses returns how many times Point has given way since the process
// started.
func Pauses() int64 { return pauses.Load() }

const runnable = "/sched/goroutines/runnable:goroutines"

// samples recycles Point's metrics.Sample (metrics.Read needs a slice; a
// shared one would race).
var samples = sync.Pool{New: func() any {
	s := []metrics.Sample{{Name: runnable}}
	return &s
}}

// Point is where background work may give way: while compute is marked and
// a goroutine waits for a processor, it sleeps for Pause. It costs a load
// with no compute marked and about 0.1 µs with.
func Point() {
	if active.Load() <= 0 {
		return
	}
	sp := samples.Get().(*[]metrics.Sample)
	metrics.Read(*sp)
	v := (*sp)[0].Value
	samples.Put(sp)
	if v.Kind() == metrics.KindUint64 && v.Uint64() > 0 {
		pauses.Add(1)
		time.Sleep(Pause)
	}
}

// Copy is copy(dst, src), in chunks of Chunk bytes with a Point between
// them while compute is marked.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	for len(src) > 2*Chunk && Active() {
		copy(dst[:Chunk], src[:Chunk])
		dst, src = dst[Chunk:], src[Chunk:]
		Point()
	}
	copy(dst, src)
	return n
}
