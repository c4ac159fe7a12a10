package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// ErrNotTrace is returned by ReadChrome for input that is not a trace-event
// file.
var ErrNotTrace = errors.New("trace: not a Chrome trace-event file")

// maxTraceEvents bounds what ReadChrome accepts, so that a huge or hostile
// file is refused instead of exhausting memory.
const maxTraceEvents = 50_000_000

// ReadChrome reads back the events of a trace ChromeWriter wrote (either
// JSON form: an array of events, or an object with "traceEvents"; a file
// whose closing bracket is missing, as a killed run leaves it, is read up
// to its last whole event). Start and End count from the zero time.Time
// plus the file's timestamps. Metadata and events of other programs (a
// category that is not a Kind's name) are skipped.
func ReadChrome(r io.Reader) ([]Event, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotTrace, err)
	}
	if d, ok := tok.(json.Delim); ok && d == '{' {
		// Object form: find "traceEvents".
		for {
			k, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrNotTrace, err)
			}
			if k == json.Delim('}') {
				return nil, fmt.Errorf("%w: no traceEvents", ErrNotTrace)
			}
			if k == "traceEvents" {
				if tok, err = dec.Token(); err != nil {
					return nil, fmt.Errorf("%w: %v", ErrNotTrace, err)
				}
				break
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrNotTrace, err)
			}
		}
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("%w: it does not start with an array of events", ErrNotTrace)
	}
	kinds := map[string]Kind{}
	for k := Kind(1); k < numKinds; k++ {
		kinds[k.String()] = k
	}
	var out []Event
	for dec.More() {
		var ev struct {
			Cat  string  `json:"cat"`
			Ph   string  `json:"ph"`
			Ts   float64 `json:"ts"`
			Dur  float64 `json:"dur"`
			Pid  int32   `json:"pid"`
			Args struct {
				Step     int64  `json:"step"`
				Layer    *int32 `json:"layer"`
				SubGroup *int32 `json:"sub_group"`
				Tensor   string `json:"tensor"`
				Where    string `json:"where"`
				Bytes    int64  `json:"bytes"`
				Failed   bool   `json:"failed"`
			} `json:"args"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return out, nil // a killed run's file
			}
			return nil, fmt.Errorf("%w: event %d: %v", ErrNotTrace, len(out)+1, err)
		}
		k, ok := kinds[ev.Cat]
		if !ok || (ev.Ph != "X" && ev.Ph != "i") {
			continue
		}
		if len(out) >= maxTraceEvents {
			return nil, fmt.Errorf("trace: more than %d events; refusing to read further", maxTraceEvents)
		}
		start := time.Time{}.Add(time.Duration(math.Round(ev.Ts * 1e3)))
		e := Event{Kind: k, Failed: ev.Args.Failed, Rank: ev.Pid, Step: ev.Args.Step - 1, Layer: -1, SubGroup: -1,
			Bytes: ev.Args.Bytes, Name: ev.Args.Tensor, Where: ev.Args.Where, Start: start, End: start.Add(time.Duration(math.Round(ev.Dur * 1e3)))}
		if ev.Args.Layer != nil {
			e.Layer = *ev.Args.Layer
		}
		if ev.Args.SubGroup != nil {
			e.SubGroup = *ev.Args.SubGroup
		}
		out = append(out, e)
	}
	return out, nil
}
