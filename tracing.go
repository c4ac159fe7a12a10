package zinf

import (
	"sync/atomic"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/trace"
)

// tracer is the Runtime's side of the trace seam (Options.Trace): the
// loop's compute and waits and each optimizer step. Every method starts
// with the nil check, so with tracing off (sink nil) a call costs that
// check and no clock read or allocation.
type tracer struct {
	sink trace.Sink
	rank int32
	// step is the number of steps completed: events of the step in
	// progress carry it (the stores' events too, through trace.Tagged).
	step atomic.Int64
	// pass is what the current pass is called ("forward", "backward",
	// "pass"); layerAt when each layer's BeginLayer returned. Touched by
	// the loop's goroutine only.
	pass    string
	layerAt []time.Time
	// optStart is the start of the last optimizer step traced, so that a
	// step the optimizer did not take (an fp16 overflow skipped) does not
	// trace the one before it again.
	optStart time.Time
}

func (t *tracer) init(sink trace.Sink, rank, layers int) {
	if sink == nil {
		return
	}
	t.sink, t.rank = sink, int32(rank)
	t.pass = "pass"
	t.layerAt = make([]time.Time, layers)
}

// store is the sink a swap store of this runtime reports to.
func (t *tracer) store(where string) trace.Sink {
	return trace.Tagged(t.sink, int(t.rank), where, &t.step)
}

func (t *tracer) setPass(p string) {
	if t.sink != nil {
		t.pass = p
	}
}

// setPassOrder names a pass by its order: "forward" when it visits the
// layers in increasing order, "backward" in decreasing order, else "pass".
func (t *tracer) setPassOrder(order []int) {
	if t.sink == nil {
		return
	}
	up, down := true, true
	for i := 1; i < len(order); i++ {
		up = up && order[i] > order[i-1]
		down = down && order[i] < order[i-1]
	}
	switch {
	case len(order) > 1 && up:
		t.pass = "forward"
	case len(order) > 1 && down:
		t.pass = "backward"
	default:
		t.pass = "pass"
	}
}

// layerBegun records a barrier's wait (from t0) and, when the layer was
// begun, the start of its compute.
func (t *tracer) layerBegun(l int, t0 time.Time, err error) {
	if t.sink == nil {
		return
	}
	now := time.Now()
	t.sink.Record(trace.Event{Kind: trace.Wait, Failed: err != nil, Rank: t.rank, Step: t.step.Load(), Layer: int32(l), SubGroup: -1,
		Where: "layer", Start: t0, End: now})
	if err == nil {
		t.layerAt[l] = now
	}
}

// layerEnded records layer l's compute, from its BeginLayer's return.
func (t *tracer) layerEnded(l int) {
	if t.sink == nil || t.layerAt[l].IsZero() {
		return
	}
	t.sink.Record(trace.Event{Kind: trace.Compute, Rank: t.rank, Step: t.step.Load(), Layer: int32(l), SubGroup: -1,
		Where: t.pass, Start: t.layerAt[l], End: time.Now()})
	t.layerAt[l] = time.Time{}
}

// gradWait records the loop's wait in AccumulateGrad.
func (t *tracer) gradWait(name string, t0 time.Time, err error) {
	if t.sink == nil {
		return
	}
	t.sink.Record(trace.Event{Kind: trace.Wait, Failed: err != nil, Rank: t.rank, Step: t.step.Load(), Layer: -1, SubGroup: -1,
		Name: name, Where: "gradient", Start: t0, End: time.Now()})
}

// stepDone records an optimizer step (Runtime.Step) from t0; a step that
// succeeded moves the step counter on.
func (t *tracer) stepDone(t0 time.Time, err error) {
	if t.sink == nil {
		return
	}
	t.sink.Record(trace.Event{Kind: trace.Step, Failed: err != nil, Rank: t.rank, Step: t.step.Load(), Layer: -1, SubGroup: -1,
		Start: t0, End: time.Now()})
	if err == nil {
		t.step.Add(1)
	}
}

// rollback records a speculative step discarded: the time from start
// spent discarding it (d 0: an instant).
func (t *tracer) rollback(start time.Time, d time.Duration) {
	if t.sink == nil {
		return
	}
	t.sink.Record(trace.Event{Kind: trace.Rollback, Rank: t.rank, Step: t.step.Load(), Layer: -1, SubGroup: -1,
		Start: start, End: start.Add(d)})
}

// subGroupSpans is one optimizer sub-group's way through a step, as
// offsets from the step's start: its state (and gradient) read, its
// update and its write-behind (zero where a stage did not happen), with
// the bytes read and written.
type subGroupSpans struct {
	tensor                string
	subGroup              int
	readFrom, readTo      time.Duration
	updateFrom, updateTo  time.Duration
	writeFrom, writeTo    time.Duration
	readBytes, writeBytes int64
}

// optimizerDone records the optimizer's last step (see optimizerStats)
// after Runtime.Step.
func (t *tracer) optimizerDone(o *optimizer.Optimizer) {
	if t.sink == nil || o == nil {
		return
	}
	st := o.Stats().Last
	t.optimizerStats(&st)
}

// optimizerStats records the optimizer step st describes (the optimizer's
// Stats().Last, taken after Runtime.Step): each sub-group's read, update
// and write from its timeline (optimizer.SubGroupTiming), once per step.
func (t *tracer) optimizerStats(st *optimizer.StepStats) {
	if t.sink == nil || st.Start.IsZero() || !st.Start.After(t.optStart) {
		return
	}
	t.optStart = st.Start
	sgs := make([]subGroupSpans, len(st.Timeline))
	for i, tm := range st.Timeline {
		s := &sgs[i]
		s.tensor, s.subGroup = tm.Tensor, tm.SubGroup
		// The read: the record's (from its issue to its I/O's end) with
		// the gradient's beside it; with states in pinned memory, the
		// gradient's alone, from the buffers taken.
		s.readFrom, s.readTo = tm.ReadIssued, max(tm.ReadDone, tm.GradRead)
		if tm.ReadIssued == 0 && tm.GradRead > 0 {
			s.readFrom = tm.Buffered
		}
		s.readBytes = tm.RecordBytes + tm.GradBytes
		// The update begins once it is picked and both reads are in.
		s.updateFrom, s.updateTo = max(tm.Picked, tm.ReadDone, tm.GradRead), tm.Updated
		s.writeFrom, s.writeTo, s.writeBytes = tm.WriteIssued, tm.WriteDone, tm.RecordBytes
	}
	t.optimizerStep(st.Start, sgs)
}

// optimizerStep records each sub-group's read, update and write of the
// optimizer step that began at start, as trace.OptRead, OptUpdate and
// OptWrite events of the step in progress (trace.Event.Step: the step
// counter before the step's end moved it on).
func (t *tracer) optimizerStep(start time.Time, sgs []subGroupSpans) {
	if t.sink == nil {
		return
	}
	step := t.step.Load()
	emit := func(k trace.Kind, s *subGroupSpans, from, to time.Duration, bytes int64) {
		if to <= 0 || to < from {
			return
		}
		t.sink.Record(trace.Event{Kind: k, Rank: t.rank, Step: step, Layer: -1, SubGroup: int32(s.subGroup), Bytes: bytes,
			Name: s.tensor, Start: start.Add(from), End: start.Add(to)})
	}
	for i := range sgs {
		s := &sgs[i]
		emit(trace.OptRead, s, s.readFrom, s.readTo, s.readBytes)
		emit(trace.OptUpdate, s, s.updateFrom, s.updateTo, 0)
		emit(trace.OptWrite, s, s.writeFrom, s.writeTo, s.writeBytes)
	}
}
