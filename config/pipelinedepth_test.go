package config_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestPipelineDepthAuto: zinf.pipeline_depth is "auto" unless a number is
// given (Zinf.PipelineDepthAuto, the depth left at 1 as its floor); both
// survive MarshalJSON and Parse, and another string is refused naming the
// key and what is allowed.
func TestPipelineDepthAuto(t *testing.T) {
	for _, tc := range []struct {
		text  string
		depth int
		auto  bool
	}{
		{`{}`, 1, true},
		{`{"zinf": {"pipeline_depth": "auto"}}`, 1, true},
		{`{"zinf": {"pipeline_depth": 1}}`, 1, false},
		{`{"zinf": {"pipeline_depth": 4}}`, 4, false},
		{`{"zinf": {"pipeline_depth": 0}}`, 0, false},
	} {
		c, err := config.Parse([]byte(tc.text))
		if err != nil {
			t.Fatalf("%s: %v", tc.text, err)
		}
		if c.Zinf.PipelineDepth != tc.depth || c.Zinf.PipelineDepthAuto != tc.auto || len(c.Warnings) != 0 {
			t.Errorf("%s: depth %d auto %v warnings %q, want depth %d auto %v and no warning", tc.text, c.Zinf.PipelineDepth, c.Zinf.PipelineDepthAuto, c.Warnings, tc.depth, tc.auto)
		}
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := config.Parse(out)
		if err != nil {
			t.Fatalf("%s: parsing its marshalled form: %v", tc.text, err)
		}
		if back.Zinf.PipelineDepth != tc.depth || back.Zinf.PipelineDepthAuto != tc.auto {
			t.Errorf("%s: marshalled and parsed again: depth %d auto %v", tc.text, back.Zinf.PipelineDepth, back.Zinf.PipelineDepthAuto)
		}
	}
	if d := config.Default(); !d.Zinf.PipelineDepthAuto || d.Zinf.PipelineDepth != 1 {
		t.Errorf("Default(): depth %d auto %v, want 1 and auto", d.Zinf.PipelineDepth, d.Zinf.PipelineDepthAuto)
	}
	for _, bad := range []string{`"deep"`, `17`, `-1`} {
		_, err := config.Parse([]byte(`{"zinf": {"pipeline_depth": ` + bad + `}}`))
		if err == nil || !strings.Contains(err.Error(), "zinf.pipeline_depth") || !strings.Contains(err.Error(), bad) {
			t.Errorf("pipeline_depth %s: %v, want an error naming the key and the value", bad, err)
		}
	}
}
