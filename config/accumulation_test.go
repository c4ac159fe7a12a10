package config_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestGradientAccumulationAuto: "auto" lets the planner pick the
// micro-batches (GradientAccumulationAuto, the count left at 1), a number
// stays the user's k, and both survive MarshalJSON and Parse.
func TestGradientAccumulationAuto(t *testing.T) {
	for _, tc := range []struct {
		text string
		k    int
		auto bool
	}{
		{`{"gradient_accumulation_steps": "auto"}`, 1, true},
		{`{"gradient_accumulation_steps": 6}`, 6, false},
		{`{"gradient_accumulation_steps": null}`, 1, false},
		{`{}`, 1, false},
	} {
		c, err := config.Parse([]byte(tc.text))
		if err != nil {
			t.Fatalf("%s: %v", tc.text, err)
		}
		if c.GradientAccumulationSteps != tc.k || c.GradientAccumulationAuto != tc.auto || len(c.Warnings) != 0 {
			t.Errorf("%s: k %d auto %v warnings %q, want k %d auto %v and no warning", tc.text, c.GradientAccumulationSteps, c.GradientAccumulationAuto, c.Warnings, tc.k, tc.auto)
		}
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := config.Parse(out)
		if err != nil {
			t.Fatalf("%s: parsing its marshalled form: %v", tc.text, err)
		}
		if back.GradientAccumulationSteps != tc.k || back.GradientAccumulationAuto != tc.auto {
			t.Errorf("%s: marshalled and parsed again: k %d auto %v", tc.text, back.GradientAccumulationSteps, back.GradientAccumulationAuto)
		}
	}
	// Any other string is refused, naming the key and what is allowed.
	if _, err := config.Parse([]byte(`{"gradient_accumulation_steps": "many"}`)); err == nil || !strings.Contains(err.Error(), "gradient_accumulation_steps") || !strings.Contains(err.Error(), `"auto"`) {
		t.Errorf(`"many": %v`, err)
	}
}
