package trace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"time"
)

// ChromeOptions configure a ChromeWriter.
type ChromeOptions struct {
	// Steps, when > 0, keeps only the events of the first Steps optimizer
	// steps (Event.Step < Steps), so a long run's trace stays small.
	// Default 0: every event.
	Steps int64
	// Base is the instant timestamps count from. Default: when the writer
	// was created.
	Base time.Time
}

// ChromeWriter is a Sink that writes a Chrome trace-event file (the JSON
// array format that chrome://tracing, Perfetto and speedscope load): one
// process per rank, one thread per track (the loop, its waits, the
// optimizer's read, update and write stages, each store's I/O), complete
// ("X") events with durations in microseconds.
//
// Events are written as they arrive, not kept in memory, so a trace costs
// no memory that grows with the run. Spans that overlap in time (several
// reads in flight, a pipeline of sub-groups) are spread over numbered
// lanes of their track, so that the events of one thread never overlap and
// their timestamps never decrease: a lane takes a span only when it starts
// after the lane's last span ended. A run killed before Close leaves a
// file without the closing bracket, which the trace viewers accept.
//
// Methods are safe for concurrent use. Close writes the end of the file;
// it does not close w.
type ChromeWriter struct {
	mu     sync.Mutex
	w      *bufio.Writer
	base   time.Time
	steps  int64
	tracks map[trackKey]*track
	tids   map[int32]int // next thread id per process
	events int64
	first  bool
	closed bool
	err    error
	buf    []byte
}

type trackKey struct {
	rank int32
	name string
}

type track struct {
	sort  int
	lanes []lane
}

type lane struct {
	tid     int
	lastEnd time.Duration
}

// NewChromeWriter starts a trace on w.
func NewChromeWriter(w io.Writer, o ChromeOptions) *ChromeWriter {
	if o.Base.IsZero() {
		o.Base = time.Now()
	}
	c := &ChromeWriter{w: bufio.NewWriterSize(w, 64<<10), base: o.Base, steps: o.Steps,
		tracks: map[trackKey]*track{}, tids: map[int32]int{}, first: true}
	_, c.err = c.w.WriteString("[")
	return c
}

// Events returns the number of events written so far (metadata excluded).
func (c *ChromeWriter) Events() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events
}

// trackOf names the track an event is drawn on and its place among the
// rank's tracks.
func trackOf(e *Event) (string, int) {
	switch e.Kind {
	case Compute, Step, Rollback:
		return "loop", 0
	case Wait:
		return "waits", 1
	case OptUpdate:
		return "optimizer update", 2
	case OptRead:
		return "optimizer read", 3
	case OptWrite:
		return "optimizer write", 4
	case Read, Write:
		switch e.Where {
		case "param":
			return "param I/O", 5
		case "grad":
			return "grad I/O", 6
		case "optim":
			return "optim I/O", 7
		}
		return e.Where + " I/O", 8
	}
	return e.Kind.String(), 9
}

// chromeEvent is one line of the file.
type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   json.Number    `json:"ts"`
	Dur  json.Number    `json:"dur,omitempty"`
	S    string         `json:"s,omitempty"`
	Pid  int32          `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// Record writes e (see ChromeWriter). Invalid kinds and events after
// Close are dropped.
func (c *ChromeWriter) Record(e Event) {
	if !e.Kind.Valid() || (c.steps > 0 && e.Step >= c.steps) {
		return
	}
	start, end := e.Start.Sub(c.base), e.End.Sub(c.base)
	start = max(start, 0)
	end = max(end, start)
	name, prio := trackOf(&e)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.err != nil {
		return
	}
	key := trackKey{e.Rank, name}
	t := c.tracks[key]
	if t == nil {
		if _, ok := c.tids[e.Rank]; !ok {
			c.meta(chromeEvent{Name: "process_name", Ph: "M", Pid: e.Rank, Args: map[string]any{"name": fmt.Sprintf("zinf rank %d", e.Rank)}})
			c.meta(chromeEvent{Name: "process_sort_index", Ph: "M", Pid: e.Rank, Args: map[string]any{"sort_index": e.Rank}})
			c.tids[e.Rank] = 1
		}
		t = &track{sort: prio}
		c.tracks[key] = t
	}
	// The first lane this span fits on after the lane's last span; an
	// instant fits where it does not start before that span's end.
	li := -1
	for i := range t.lanes {
		if start >= t.lanes[i].lastEnd {
			li = i
			break
		}
	}
	if li < 0 {
		tid := c.tids[e.Rank]
		c.tids[e.Rank] = tid + 1
		label := name
		if len(t.lanes) > 0 {
			label = fmt.Sprintf("%s %d", name, len(t.lanes)+1)
		}
		t.lanes = append(t.lanes, lane{tid: tid})
		li = len(t.lanes) - 1
		c.meta(chromeEvent{Name: "thread_name", Ph: "M", Pid: e.Rank, Tid: tid, Args: map[string]any{"name": label}})
		c.meta(chromeEvent{Name: "thread_sort_index", Ph: "M", Pid: e.Rank, Tid: tid, Args: map[string]any{"sort_index": t.sort*1000 + len(t.lanes)}})
	}
	l := &t.lanes[li]
	l.lastEnd = end
	ev := chromeEvent{Name: eventName(&e), Cat: e.Kind.String(), Pid: e.Rank, Tid: l.tid, Ts: micros(start), Args: eventArgs(&e, end-start)}
	if e.Kind == Rollback && end == start {
		ev.Ph, ev.S = "i", "t"
	} else {
		ev.Ph, ev.Dur = "X", micros(end-start)
	}
	c.write(ev)
	c.events++
}

func (c *ChromeWriter) meta(ev chromeEvent) {
	ev.Ts = "0"
	c.write(ev)
}

func (c *ChromeWriter) write(ev chromeEvent) {
	b, err := json.Marshal(ev)
	if err != nil {
		c.err = err
		return
	}
	c.buf = c.buf[:0]
	if !c.first {
		c.buf = append(c.buf, ",\n"...)
	} else {
		c.buf = append(c.buf, '\n')
	}
	c.first = false
	c.buf = append(c.buf, b...)
	if _, err := c.w.Write(c.buf); err != nil {
		c.err = err
	}
}

// micros formats d in microseconds with nanosecond precision.
func micros(d time.Duration) json.Number {
	return json.Number(strconv.FormatFloat(float64(d)/1e3, 'f', 3, 64))
}

// eventName is the label a viewer shows on the span.
func eventName(e *Event) string {
	switch e.Kind {
	case Compute:
		return fmt.Sprintf("%s L%d", e.Where, e.Layer)
	case Wait:
		if e.Where == "layer" {
			return fmt.Sprintf("wait L%d", e.Layer)
		}
		return fmt.Sprintf("wait %s %s", e.Where, e.Name)
	case Read, Write:
		return fmt.Sprintf("%s %s", e.Kind, e.Name)
	case OptRead, OptUpdate, OptWrite:
		return fmt.Sprintf("%s %s[%d]", e.Kind.String()[len("optimizer "):], e.Name, e.SubGroup)
	case Step:
		if e.Failed {
			return fmt.Sprintf("step %d (failed)", e.Step+1)
		}
		return fmt.Sprintf("step %d", e.Step+1)
	case Rollback:
		return fmt.Sprintf("rollback step %d", e.Step+1)
	}
	return e.Kind.String()
}

func eventArgs(e *Event, d time.Duration) map[string]any {
	a := map[string]any{"step": e.Step + 1}
	if e.Where != "" {
		a["where"] = e.Where
	}
	if e.Layer >= 0 && (e.Kind == Compute || e.Kind == Wait) {
		a["layer"] = e.Layer
	}
	if e.Name != "" {
		a["tensor"] = e.Name
	}
	if e.SubGroup >= 0 && (e.Kind == OptRead || e.Kind == OptUpdate || e.Kind == OptWrite) {
		a["sub_group"] = e.SubGroup
	}
	if e.Bytes > 0 {
		a["bytes"] = e.Bytes
		if d > 0 && (e.Kind == Read || e.Kind == Write || e.Kind == OptRead || e.Kind == OptWrite) {
			a["GB/s"] = math.Round(float64(e.Bytes)/d.Seconds()/1e6) / 1e3
		}
	}
	if e.Failed {
		a["failed"] = true
	}
	return a
}

// Close ends the file (the closing bracket) and flushes it. It returns the
// first write error met, if any; events recorded after it are dropped.
func (c *ChromeWriter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.err
	}
	c.closed = true
	if c.err == nil {
		_, c.err = c.w.WriteString("\n]\n")
	}
	if err := c.w.Flush(); err != nil && c.err == nil {
		c.err = err
	}
	if c.err != nil {
		c.err = fmt.Errorf("trace: writing the trace: %w", c.err)
	}
	return c.err
}
