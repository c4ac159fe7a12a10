package zinf

import (
	"testing"
	"time"

	"github.com/zinfio/zinf/trace"
)

// TestTracerOffCostsNothing: with no sink every tracing call is a nil check
// (no allocation, no event); with a sink that keeps nothing the calls pass
// events by value and allocate nothing either.
func TestTracerOffCostsNothing(t *testing.T) {
	t0 := time.Now()
	calls := func(tr *tracer) func() {
		return func() {
			tr.setPass("forward")
			tr.setPassOrder([]int{2, 1, 0})
			tr.layerBegun(1, t0, nil)
			tr.gradWait("w", t0, nil)
			tr.layerEnded(1)
			tr.stepDone(t0, nil)
			tr.rollback(t0, 0)
		}
	}
	var off tracer
	off.init(nil, 0, 3)
	if a := testing.AllocsPerRun(1000, calls(&off)); a != 0 {
		t.Fatalf("tracing off: %v allocations per loop", a)
	}
	if off.store("param") != nil {
		t.Fatal("tracing off gives the stores a sink")
	}
	n := 0
	var on tracer
	on.init(trace.Func(func(trace.Event) { n++ }), 0, 3)
	if a := testing.AllocsPerRun(1000, calls(&on)); a != 0 {
		t.Fatalf("tracing on: %v allocations per loop", a)
	}
	if n == 0 {
		t.Fatal("tracing on recorded nothing")
	}
}
