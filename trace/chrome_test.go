package trace_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/test/tracecheck"
	"github.com/zinfio/zinf/trace"
)

// randomEvents makes n events of every kind over two ranks, many of them
// overlapping (I/O in flight, pipelined sub-groups), as a run produces.
func randomEvents(rng *rand.Rand, base time.Time, n int) []trace.Event {
	wheres := map[trace.Kind][]string{trace.Compute: {"forward", "backward"}, trace.Wait: {"layer", "gradient"},
		trace.Read: {"param", "grad", "optim"}, trace.Write: {"param", "grad", "optim"}}
	out := make([]trace.Event, n)
	for i := range out {
		k := trace.Kind(1 + rng.IntN(9))
		start := base.Add(time.Duration(rng.Int64N(int64(time.Second))))
		d := time.Duration(rng.Int64N(int64(20 * time.Millisecond)))
		if k == trace.Rollback && rng.IntN(2) == 0 {
			d = 0
		}
		e := trace.Event{Kind: k, Rank: int32(rng.IntN(2)), Step: int64(rng.IntN(3)), Layer: int32(rng.IntN(8)), SubGroup: int32(rng.IntN(4)),
			Bytes: rng.Int64N(1 << 24), Name: fmt.Sprintf("layer%03d.weight", rng.IntN(8)), Start: start, End: start.Add(d), Failed: rng.IntN(10) == 0}
		if w := wheres[k]; w != nil {
			e.Where = w[rng.IntN(len(w))]
		}
		out[i] = e
	}
	return out
}

// TestChromeWriter records random events from several goroutines and
// checks the file against the trace-event format (tracecheck), that every
// event is in it once on a track of its kind and rank, and that
// ReadChrome gives the events back.
func TestChromeWriter(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	base := time.Now()
	events := randomEvents(rng, base, 3000)
	var buf bytes.Buffer
	w := trace.NewChromeWriter(&buf, trace.ChromeOptions{Base: base})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(events); i += 4 {
				w.Record(events[i])
			}
		}()
	}
	wg.Wait()
	w.Record(trace.Event{}) // an invalid kind is dropped
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w.Record(events[0]) // after Close: dropped
	if w.Events() != int64(len(events)) {
		t.Fatalf("%d events written, %d recorded", w.Events(), len(events))
	}
	sum, err := tracecheck.Validate(buf.Bytes())
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	if len(sum.Spans) != len(events) {
		t.Fatalf("%d spans in the file, %d recorded", len(sum.Spans), len(events))
	}
	if sum.ProcessNames[0] != "zinf rank 0" || sum.ProcessNames[1] != "zinf rank 1" {
		t.Fatalf("process names %v", sum.ProcessNames)
	}
	// Every span sits on a thread named for its kind's track.
	for _, sp := range sum.Spans {
		name := sum.ThreadNames[sp.Pid][sp.Tid]
		want := map[string]string{"compute": "loop", "step": "loop", "rollback": "loop", "wait": "waits",
			"optimizer read": "optimizer read", "optimizer update": "optimizer update", "optimizer write": "optimizer write"}[sp.Cat]
		if want == "" {
			want = sp.Args["where"].(string) + " I/O"
		}
		if name != want && !bytes.HasPrefix([]byte(name), []byte(want+" ")) {
			t.Fatalf("%s event %q on thread %q, want track %q", sp.Cat, sp.Name, name, want)
		}
	}
	got, err := trace.ReadChrome(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	key := func(e trace.Event, t0 time.Time) string {
		return fmt.Sprintf("%v/%d/%d/%d/%d/%d/%s/%s/%d/%d/%v", e.Kind, e.Rank, e.Step, e.Layer, e.SubGroup, e.Bytes, e.Name, e.Where,
			e.Start.Sub(t0), e.End.Sub(e.Start), e.Failed)
	}
	var want, have []string
	for _, e := range events {
		if e.Kind != trace.Compute && e.Kind != trace.Wait {
			e.Layer = -1
		}
		if e.Kind != trace.OptRead && e.Kind != trace.OptUpdate && e.Kind != trace.OptWrite {
			e.SubGroup = -1
		}
		want = append(want, key(e, base))
	}
	for _, e := range got {
		have = append(have, key(e, time.Time{}))
	}
	sort.Strings(want)
	sort.Strings(have)
	if fmt.Sprint(want) != fmt.Sprint(have) {
		for i := range want {
			if i >= len(have) || want[i] != have[i] {
				t.Fatalf("read back differs at %d: %s vs %s", i, want[i], have[min(i, len(have)-1)])
			}
		}
		t.Fatalf("read back %d events, wrote %d", len(have), len(want))
	}
}

// TestChromeWriterSteps keeps the first steps only.
func TestChromeWriterSteps(t *testing.T) {
	var buf bytes.Buffer
	base := time.Now()
	w := trace.NewChromeWriter(&buf, trace.ChromeOptions{Steps: 2, Base: base})
	for s := range int64(5) {
		w.Record(trace.Event{Kind: trace.Step, Step: s, Start: base.Add(time.Duration(s) * time.Second), End: base.Add(time.Duration(s)*time.Second + time.Millisecond)})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := trace.ReadChrome(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Step != 0 || got[1].Step != 1 {
		t.Fatalf("kept %+v", got)
	}
}

// TestReadChromeTruncated: a run killed before Close leaves a file without
// its end; ReadChrome returns its whole events. Input that is not a trace
// is refused.
func TestReadChromeTruncated(t *testing.T) {
	var buf bytes.Buffer
	base := time.Now()
	w := trace.NewChromeWriter(&buf, trace.ChromeOptions{Base: base})
	for i := range 10 {
		at := base.Add(time.Duration(i) * time.Millisecond)
		w.Record(trace.Event{Kind: trace.Compute, Layer: int32(i), Where: "forward", Start: at, End: at.Add(time.Microsecond)})
	}
	w.Close()
	full := buf.Bytes()
	cut := full[:bytes.LastIndex(full, []byte("\n]"))-10]
	got, err := trace.ReadChrome(bytes.NewReader(cut))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 9 {
		t.Fatalf("%d events from the truncated file, want 9", len(got))
	}
	for _, in := range []string{"", "{}", `{"a":1}`, `"x"`, `[1,`} {
		if _, err := trace.ReadChrome(bytes.NewReader([]byte(in))); !errors.Is(err, trace.ErrNotTrace) && in != `[1,` {
			t.Errorf("%q: %v, want ErrNotTrace", in, err)
		}
	}
	obj := append([]byte(`{"displayTimeUnit":"ms","traceEvents":`), full...)
	obj = append(obj, '}')
	if got, err := trace.ReadChrome(bytes.NewReader(obj)); err != nil || len(got) != 10 {
		t.Fatalf("object form: %d events, %v", len(got), err)
	}
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n -= len(p); f.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

// TestChromeWriterError: a write error is returned by Close.
func TestChromeWriterError(t *testing.T) {
	w := trace.NewChromeWriter(&failWriter{n: 100}, trace.ChromeOptions{})
	now := time.Now()
	for range 1000 {
		w.Record(trace.Event{Kind: trace.Read, Name: "x", Where: "param", Start: now, End: now})
	}
	if err := w.Close(); err == nil || !bytes.Contains([]byte(err.Error()), []byte("disk full")) {
		t.Fatalf("Close: %v", err)
	}
}

// TestTagged stamps rank, where and step; Tagged(nil) is nil, so tracing
// off stays a nil check.
func TestTagged(t *testing.T) {
	if trace.Tagged(nil, 1, "param", nil) != nil {
		t.Fatal("Tagged(nil) is not nil")
	}
	var got []trace.Event
	var step atomic.Int64
	step.Store(7)
	s := trace.Tagged(trace.Func(func(e trace.Event) { got = append(got, e) }), 3, "param", &step)
	s.Record(trace.Event{Kind: trace.Read})
	s.Record(trace.Event{Kind: trace.Wait, Where: "layer"})
	if got[0].Rank != 3 || got[0].Where != "param" || got[0].Step != 7 || got[1].Where != "layer" {
		t.Fatalf("%+v", got)
	}
	if allocs := testing.AllocsPerRun(100, func() { s.Record(trace.Event{Kind: trace.Read, Name: "x"}) }); allocs > 1 {
		// got grows (amortized); the call itself passes a value.
		t.Fatalf("%v allocations per Record", allocs)
	}
}
