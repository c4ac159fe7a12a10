// Package tracecheck validates a file against the Chrome trace-event
// format (the "Trace Event Format" document chrome://tracing and Perfetto
// implement): the tests of zinf's trace writer and of `zinf train --trace`
// use it so that no test depends on a browser being installed.
//
// Checked: the file is JSON, either an array of events or an object whose
// "traceEvents" is one; every event is an object with a known phase
// ("ph"), a name, integer pid and tid, and a non-negative timestamp
// ("ts", microseconds; metadata events may leave it out); complete events
// ("X") carry a non-negative duration; instant events a valid scope;
// begin ("B") and end ("E") events match per thread, in stack order, never
// ending before they began; on each thread timestamps never decrease in
// file order and complete events nest properly (one inside another, or
// apart, never overlapping partly); metadata events name a process or
// thread or give a sort index; "args", when present, is an object.
package tracecheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
)

// Span is one complete event (an "X", or a matched "B"/"E" pair), or an
// instant (Dur 0).
type Span struct {
	Name, Cat, Ph string
	Pid, Tid      int64
	Ts, Dur       float64 // microseconds
	Args          map[string]any
}

// End is Ts + Dur.
func (s Span) End() float64 { return s.Ts + s.Dur }

// Summary is what a valid file holds.
type Summary struct {
	// Spans are the complete events, matched begin/end pairs and
	// instants, in file order (a pair at its end).
	Spans []Span
	// Phases counts events per phase.
	Phases map[string]int
	// ThreadNames maps pid -> tid -> the thread's name (metadata);
	// ProcessNames pid -> name.
	ThreadNames  map[int64]map[int64]string
	ProcessNames map[int64]string
}

var phases = map[string]bool{
	"B": true, "E": true, "X": true, "i": true, "I": true, "M": true, "C": true,
	"b": true, "e": true, "n": true, "s": true, "t": true, "f": true,
	"P": true, "O": true, "N": true, "D": true,
}

var metaNames = map[string]string{
	"process_name": "name", "thread_name": "name", "process_labels": "labels",
	"process_sort_index": "sort_index", "thread_sort_index": "sort_index",
}

// Validate checks data (see the package doc) and returns what it holds, or
// every problem found (up to 20), joined.
func Validate(data []byte) (*Summary, error) {
	var raw []json.RawMessage
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, errors.New("tracecheck: empty file")
	}
	switch trimmed[0] {
	case '[':
		if err := json.Unmarshal(trimmed, &raw); err != nil {
			return nil, fmt.Errorf("tracecheck: not a JSON array of events: %w", err)
		}
	case '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &obj); err != nil {
			return nil, fmt.Errorf("tracecheck: not a JSON object: %w", err)
		}
		te, ok := obj["traceEvents"]
		if !ok {
			return nil, errors.New("tracecheck: object without \"traceEvents\"")
		}
		if err := json.Unmarshal(te, &raw); err != nil {
			return nil, fmt.Errorf("tracecheck: \"traceEvents\" is not an array: %w", err)
		}
	default:
		return nil, errors.New("tracecheck: neither a JSON array nor an object")
	}
	s := &Summary{Phases: map[string]int{}, ThreadNames: map[int64]map[int64]string{}, ProcessNames: map[int64]string{}}
	var errs []error
	bad := func(i int, format string, a ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf("event %d: %s", i, fmt.Sprintf(format, a...)))
		}
	}
	type thread struct{ pid, tid int64 }
	lastTs := map[thread]float64{}
	open := map[thread][]Span{}     // B events awaiting their E
	complete := map[thread][]Span{} // X events, for the nesting check
	for i, r := range raw {
		var ev map[string]json.RawMessage
		if err := json.Unmarshal(r, &ev); err != nil {
			bad(i, "not an object: %v", err)
			continue
		}
		var ph string
		if err := json.Unmarshal(ev["ph"], &ph); err != nil || !phases[ph] {
			bad(i, "phase %s is missing or unknown", ev["ph"])
			continue
		}
		s.Phases[ph]++
		var sp Span
		sp.Ph = ph
		if err := json.Unmarshal(ev["name"], &sp.Name); (err != nil || sp.Name == "") && ph != "E" {
			bad(i, "%q event without a name", ph)
		}
		if c, ok := ev["cat"]; ok {
			if err := json.Unmarshal(c, &sp.Cat); err != nil {
				bad(i, "cat is not a string")
			}
		}
		var okPid, okTid bool
		sp.Pid, okPid = integer(ev["pid"])
		sp.Tid, okTid = integer(ev["tid"])
		if !okPid || !okTid {
			bad(i, "pid %s / tid %s must be integers", ev["pid"], ev["tid"])
			continue
		}
		if a, ok := ev["args"]; ok {
			if err := json.Unmarshal(a, &sp.Args); err != nil || sp.Args == nil {
				bad(i, "args is not an object")
			}
		}
		ts, hasTs := number(ev["ts"])
		if ph == "M" {
			key, ok := metaNames[sp.Name]
			if !ok {
				bad(i, "metadata event %q is not one of process_name, thread_name, process_labels, process_sort_index, thread_sort_index", sp.Name)
				continue
			}
			v, ok := sp.Args[key]
			if !ok {
				bad(i, "metadata %q without args.%s", sp.Name, key)
				continue
			}
			switch sp.Name {
			case "process_name":
				s.ProcessNames[sp.Pid], _ = v.(string)
			case "thread_name":
				if s.ThreadNames[sp.Pid] == nil {
					s.ThreadNames[sp.Pid] = map[int64]string{}
				}
				s.ThreadNames[sp.Pid][sp.Tid], _ = v.(string)
			}
			continue
		}
		if !hasTs || ts < 0 {
			bad(i, "%q event %q: ts %s must be a non-negative number", ph, sp.Name, ev["ts"])
			continue
		}
		sp.Ts = ts
		th := thread{sp.Pid, sp.Tid}
		if last, ok := lastTs[th]; ok && ts < last {
			bad(i, "%q event %q on pid %d tid %d: ts %.3f is before the thread's previous %.3f", ph, sp.Name, sp.Pid, sp.Tid, ts, last)
		}
		lastTs[th] = ts
		switch ph {
		case "X":
			d, ok := number(ev["dur"])
			if !ok || d < 0 {
				bad(i, "complete event %q: dur %s must be a non-negative number", sp.Name, ev["dur"])
				continue
			}
			sp.Dur = d
			complete[th] = append(complete[th], sp)
			s.Spans = append(s.Spans, sp)
		case "B":
			open[th] = append(open[th], sp)
		case "E":
			st := open[th]
			if len(st) == 0 {
				bad(i, "end event on pid %d tid %d with no begin", sp.Pid, sp.Tid)
				continue
			}
			b := st[len(st)-1]
			open[th] = st[:len(st)-1]
			if sp.Name != "" && sp.Name != b.Name {
				bad(i, "end event %q closes begin %q", sp.Name, b.Name)
			}
			b.Ph, b.Dur = "B/E", ts-b.Ts
			s.Spans = append(s.Spans, b)
		case "i", "I":
			if sc, ok := ev["s"]; ok {
				var scope string
				if json.Unmarshal(sc, &scope); scope != "g" && scope != "p" && scope != "t" {
					bad(i, "instant event %q: scope %s (allowed: g, p, t)", sp.Name, sc)
				}
			}
			s.Spans = append(s.Spans, sp)
		}
	}
	for th, st := range open {
		for _, b := range st {
			errs = append(errs, fmt.Errorf("begin event %q on pid %d tid %d at %.3f has no end", b.Name, th.pid, th.tid, b.Ts))
		}
	}
	// Complete events on one thread nest or stay apart.
	for th, xs := range complete {
		sort.SliceStable(xs, func(a, b int) bool {
			if xs[a].Ts != xs[b].Ts {
				return xs[a].Ts < xs[b].Ts
			}
			return xs[a].Dur > xs[b].Dur
		})
		var stack []Span
		for _, x := range xs {
			for len(stack) > 0 && stack[len(stack)-1].End() <= x.Ts {
				stack = stack[:len(stack)-1]
			}
			if len(stack) > 0 && x.End() > stack[len(stack)-1].End()+1e-6 {
				top := stack[len(stack)-1]
				errs = append(errs, fmt.Errorf("pid %d tid %d: %q [%.3f, %.3f] overlaps %q [%.3f, %.3f] partly", th.pid, th.tid, x.Name, x.Ts, x.End(), top.Name, top.Ts, top.End()))
				break
			}
			stack = append(stack, x)
		}
	}
	if len(errs) > 0 {
		return s, errors.Join(errs...)
	}
	return s, nil
}

func number(r json.RawMessage) (float64, bool) {
	if r == nil {
		return 0, false
	}
	var f float64
	if err := json.Unmarshal(r, &f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

func integer(r json.RawMessage) (int64, bool) {
	f, ok := number(r)
	if !ok || f != math.Trunc(f) {
		return 0, false
	}
	return int64(f), true
}
