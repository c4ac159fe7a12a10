package optimizer

import (
	"slices"
	"time"
)

// SubGroupTiming is one sub-group's way through a step's pipeline: when
// it reached each stage, as offsets from the start of the step (BeginStep,
// or Step's start). A zero offset means the stage was not reached (the
// step failed or was aborted first, or the stage does not apply: no store,
// no gradient read). Consecutive fields bound the waits a step is made of:
//
//   - Buffered-Ahead: waiting for a buffer set and pinned memory
//     (backpressure from BufferCount and the pool);
//   - GradRead-ReadIssued: the synchronous gradient read, overlapping the
//     record read;
//   - Picked-GradRead: read ahead, waiting for the update goroutine;
//   - ReadDone-ReadIssued: the record read in flight (ReadDone is when its
//     I/O completed, not when the update goroutine noticed);
//   - Updated-max(Picked, ReadDone): the update itself (Adam, checksum
//     verification, copies);
//   - WriteIssued-Updated: waiting for a write-behind slot;
//   - WriteDone-WriteIssued: checksumming and submitting the write-behind,
//     and the write in flight (WriteDone is when its I/O completed);
//   - Retired: staging waited for and every buffer given back.
//
// The fields are plain offsets so that a timeline or trace can be drawn
// from them (one row per sub-group, or one span per stage).
type SubGroupTiming struct {
	Tensor   string
	SubGroup int
	// RecordBytes and GradBytes are the bytes the sub-group's record and
	// gradient reads moved (RecordBytes is also what its write-behind
	// writes; 0 with states in pinned memory).
	RecordBytes, GradBytes int64

	Ahead, Buffered, ReadIssued, GradRead, Picked, ReadDone, Updated, WriteIssued, WriteDone, Retired time.Duration
}

// completedAt is implemented by waiters that know when their I/O completed
// (*swapper.Pending); for others the moment Wait returned stands in.
type completedAt interface{ CompletedAt() time.Time }

// since is the offset of now from the start of the step.
func (r *stepRun) since() time.Duration { return time.Since(r.start) }

// doneOffset is the offset at which w's I/O completed, given that Wait
// returned at waited.
func (r *stepRun) doneOffset(w any, waited time.Duration) time.Duration {
	if c, ok := w.(completedAt); ok {
		if t := c.CompletedAt(); !t.IsZero() {
			return min(t.Sub(r.start), waited)
		}
	}
	return waited
}

// record files it's timing once it has retired.
func (r *stepRun) record(it *item) {
	it.tm.Retired = r.since()
	it.tm.Tensor, it.tm.SubGroup = it.sg.t.name, it.sg.j
	r.tlMu.Lock()
	r.timeline = append(r.timeline, it.tm)
	r.tlMu.Unlock()
}

// timelineStats returns the step's timings ordered by the moment the
// read-ahead took each sub-group up, and the pipeline's I/O gaps: the
// time between the first I/O's start and the last one's end during which
// none of the step's record reads, gradient reads or write-behinds was in
// flight. Call it after done.
func (r *stepRun) timelineStats() ([]SubGroupTiming, time.Duration) {
	tl := r.timeline
	slices.SortFunc(tl, func(a, b SubGroupTiming) int { return int(a.Ahead - b.Ahead) })
	type span struct{ from, to time.Duration }
	spans := make([]span, 0, 2*len(tl))
	for _, t := range tl {
		if t.ReadIssued > 0 {
			end := max(t.ReadDone, t.GradRead)
			if end > 0 {
				spans = append(spans, span{t.ReadIssued, end})
			}
		}
		if t.WriteIssued > 0 && t.WriteDone > 0 {
			spans = append(spans, span{t.WriteIssued, t.WriteDone})
		}
	}
	if len(spans) == 0 {
		return tl, 0
	}
	slices.SortFunc(spans, func(a, b span) int { return int(a.from - b.from) })
	var gaps time.Duration
	end := spans[0].to
	for _, s := range spans[1:] {
		if s.from > end {
			gaps += s.from - end
		}
		end = max(end, s.to)
	}
	return tl, gaps
}
