package zinf

import (
	"sync/atomic"

	"github.com/zinfio/zinf/internal/base/yield"
)

// BeginCompute marks compute the caller runs on this machine's cores (a
// forward or backward pass of a parallel CPU kernel, as GoMLX's Go backend
// runs them), until the end function it returns is called. Meanwhile
// zinf's own work in the background (checksums of what is swapped, gradient
// sums, optimizer updates) pauses between chunks of tens of microseconds
// whenever a goroutine waits for a processor, and goes on when one is
// free.
//
// Go's scheduler has no priorities: a kernel that splits an operation into
// one piece per processor waits for its last piece, and a piece whose
// processor runs zinf's work waits for that work to block or be preempted
// (up to 10 ms). On a 2-core machine one goroutine of memory copies beside
// the compute made it 56-72% slower, and with these pauses 12-22%
// (BENCHMARKS.md, "Background work that gives way"). Pausing changes when zinf's work runs,
// never what it computes. zgomlx marks every executor call; a training loop
// that computes on the CPU by other means marks its own. Calls nest and may
// overlap across goroutines; end may be called more than once.
func BeginCompute() (end func()) {
	yield.Begin()
	var ended atomic.Bool
	return func() {
		if ended.CompareAndSwap(false, true) {
			yield.End()
		}
	}
}
