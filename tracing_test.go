package zinf

import (
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
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

// TestOptimizerStepEvents: each sub-group's read, update and write become
// OptRead, OptUpdate and OptWrite events at the step's start plus their
// offsets, with their bytes; stages not reached emit nothing.
func TestOptimizerStepEvents(t *testing.T) {
	var got []trace.Event
	var tr tracer
	tr.init(trace.Func(func(e trace.Event) { got = append(got, e) }), 2, 1)
	tr.step.Store(4)
	start := time.Now()
	ms := time.Millisecond
	tr.optimizerStep(start, []subGroupSpans{
		{tensor: "w", subGroup: 0, readFrom: 1 * ms, readTo: 3 * ms, updateFrom: 3 * ms, updateTo: 4 * ms, writeFrom: 4 * ms, writeTo: 7 * ms, readBytes: 160, writeBytes: 120},
		{tensor: "w", subGroup: 1, readFrom: 2 * ms, readTo: 5 * ms}, // failed after its read
	})
	want := []struct {
		k        trace.Kind
		sg       int32
		from, to time.Duration
		bytes    int64
	}{{trace.OptRead, 0, ms, 3 * ms, 160}, {trace.OptUpdate, 0, 3 * ms, 4 * ms, 0}, {trace.OptWrite, 0, 4 * ms, 7 * ms, 120}, {trace.OptRead, 1, 2 * ms, 5 * ms, 0}}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		e := got[i]
		if e.Kind != w.k || e.SubGroup != w.sg || e.Name != "w" || e.Rank != 2 || e.Step != 4 || e.Bytes != w.bytes ||
			!e.Start.Equal(start.Add(w.from)) || !e.End.Equal(start.Add(w.to)) {
			t.Errorf("event %d: %+v, want %+v", i, e, w)
		}
	}
	// From the optimizer's stats: once per step, however often asked (an
	// fp16 step skipped leaves the previous step's stats in place).
	got = nil
	st := optimizer.StepStats{Start: start.Add(time.Second), Timeline: []optimizer.SubGroupTiming{{Tensor: "b", SubGroup: 2,
		RecordBytes: 120, GradBytes: 40, Buffered: ms, ReadIssued: 2 * ms, GradRead: 4 * ms, ReadDone: 3 * ms, Picked: 3 * ms,
		Updated: 6 * ms, WriteIssued: 7 * ms, WriteDone: 9 * ms}}}
	tr.optimizerStats(&st)
	tr.optimizerStats(&st)
	s0 := start.Add(time.Second)
	if len(got) != 3 || got[0].Kind != trace.OptRead || !got[0].Start.Equal(s0.Add(2*ms)) || !got[0].End.Equal(s0.Add(4*ms)) || got[0].Bytes != 160 ||
		!got[1].Start.Equal(s0.Add(4*ms)) || !got[1].End.Equal(s0.Add(6*ms)) || got[2].Bytes != 120 || !got[2].End.Equal(s0.Add(9*ms)) {
		t.Fatalf("from stats: %+v", got)
	}
	var off tracer
	off.init(nil, 0, 1)
	if a := testing.AllocsPerRun(100, func() { off.optimizerStep(start, nil); off.optimizerStats(&st) }); a != 0 {
		t.Fatalf("tracing off: %v allocations", a)
	}
}
