package tracecheck

import (
	"strings"
	"testing"
)

// TestValidate feeds the validator good files and files with one defect
// each, and checks that every defect is caught with a message naming it.
func TestValidate(t *testing.T) {
	good := []string{
		`[]`,
		`{"traceEvents":[]}`,
		`[{"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"p"}},
		  {"name":"a","cat":"c","ph":"X","ts":0,"dur":10,"pid":0,"tid":1},
		  {"name":"b","ph":"X","ts":2,"dur":3,"pid":0,"tid":1},
		  {"name":"c","ph":"X","ts":10,"dur":1,"pid":0,"tid":1},
		  {"name":"d","ph":"B","ts":11,"pid":0,"tid":2},
		  {"name":"e","ph":"B","ts":12,"pid":0,"tid":2},
		  {"ph":"E","ts":13,"pid":0,"tid":2},
		  {"name":"d","ph":"E","ts":14,"pid":0,"tid":2},
		  {"name":"r","ph":"i","s":"t","ts":14,"pid":0,"tid":2}]`,
	}
	for _, g := range good {
		s, err := Validate([]byte(g))
		if err != nil {
			t.Fatalf("%s: %v", g, err)
		}
		_ = s
	}
	s, _ := Validate([]byte(good[2]))
	if len(s.Spans) != 6 || s.ProcessNames[0] != "p" {
		t.Fatalf("summary: %d spans, processes %v", len(s.Spans), s.ProcessNames)
	}
	if s.Spans[3].Name != "e" || s.Spans[3].Dur != 1 || s.Spans[4].Name != "d" || s.Spans[4].Dur != 3 {
		t.Fatalf("begin/end pairs: %+v %+v", s.Spans[3], s.Spans[4])
	}
	bad := map[string]string{
		`nope`:          "neither",
		`{"events":[]}`: "traceEvents",
		`[1]`:           "not an object",
		`[{"name":"a","ph":"Q","ts":0,"pid":0,"tid":0}]`:                                                              "phase",
		`[{"ph":"X","ts":0,"dur":1,"pid":0,"tid":0}]`:                                                                 "without a name",
		`[{"name":"a","ph":"X","ts":0,"dur":1,"pid":"x","tid":0}]`:                                                    "integers",
		`[{"name":"a","ph":"X","ts":0,"dur":1,"pid":0.5,"tid":0}]`:                                                    "integers",
		`[{"name":"a","ph":"X","dur":1,"pid":0,"tid":0}]`:                                                             "ts",
		`[{"name":"a","ph":"X","ts":-1,"dur":1,"pid":0,"tid":0}]`:                                                     "ts",
		`[{"name":"a","ph":"X","ts":0,"pid":0,"tid":0}]`:                                                              "dur",
		`[{"name":"a","ph":"X","ts":0,"dur":-2,"pid":0,"tid":0}]`:                                                     "dur",
		`[{"name":"a","ph":"X","ts":5,"dur":1,"pid":0,"tid":0},{"name":"b","ph":"X","ts":4,"dur":1,"pid":0,"tid":0}]`: "before the thread's previous",
		`[{"name":"a","ph":"X","ts":0,"dur":5,"pid":0,"tid":0},{"name":"b","ph":"X","ts":4,"dur":5,"pid":0,"tid":0}]`: "overlaps",
		`[{"name":"a","ph":"B","ts":0,"pid":0,"tid":0}]`:                                                              "has no end",
		`[{"name":"a","ph":"E","ts":0,"pid":0,"tid":0}]`:                                                              "no begin",
		`[{"name":"a","ph":"B","ts":0,"pid":0,"tid":0},{"name":"b","ph":"E","ts":1,"pid":0,"tid":0}]`:                 "closes begin",
		`[{"name":"a","ph":"i","s":"x","ts":0,"pid":0,"tid":0}]`:                                                      "scope",
		`[{"name":"thread_name","ph":"M","pid":0,"tid":0,"args":{}}]`:                                                 "without args.name",
		`[{"name":"colour","ph":"M","pid":0,"tid":0,"args":{"name":"x"}}]`:                                            "metadata event",
		`[{"name":"a","ph":"X","ts":0,"dur":1,"pid":0,"tid":0,"args":[1]}]`:                                           "args is not an object",
	}
	for in, want := range bad {
		_, err := Validate([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error containing %q", in, err, want)
		}
	}
}
