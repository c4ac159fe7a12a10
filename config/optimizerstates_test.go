package config_test

import (
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestOptimizerStatesKey: zinf.optimizer_states defaults to fp32, takes
// bf16 and 8bit, round-trips through MarshalJSON (written only when not
// fp32) with zinf.optimizer_states_fp32, and a bad word, an empty
// pattern or a rule without compressed states is refused with the key,
// the value and what is allowed.
func TestOptimizerStatesKey(t *testing.T) {
	c, err := config.Parse([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Zinf.OptimizerStates != config.OptimizerStatesFP32 {
		t.Fatalf("default %q, want fp32", c.Zinf.OptimizerStates)
	}
	if out, err := c.MarshalJSON(); err != nil || strings.Contains(string(out), "optimizer_states") {
		t.Errorf("the default is written (%v):\n%s", err, out)
	}
	for _, w := range []config.OptimizerStates{config.OptimizerStatesBF16, config.OptimizerStates8Bit} {
		c, err := config.Parse([]byte(`{"zinf": {"optimizer_states": "` + string(w) + `", "optimizer_states_fp32": ["*embed*"]}}`))
		if err != nil {
			t.Fatalf("%s: %v", w, err)
		}
		if c.Zinf.OptimizerStates != w {
			t.Fatalf("parsed %q, want %q", c.Zinf.OptimizerStates, w)
		}
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := config.Parse(out)
		if err != nil || back.Zinf.OptimizerStates != w || len(back.Zinf.OptimizerStatesFP32) != 1 || back.Zinf.OptimizerStatesFP32[0] != "*embed*" {
			t.Fatalf("round trip of %s: %v, %q %q", w, err, back.Zinf.OptimizerStates, back.Zinf.OptimizerStatesFP32)
		}
	}
	for _, c := range []struct{ json, want string }{
		{`{"zinf": {"optimizer_states": "int4"}}`, `zinf.optimizer_states`},
		{`{"zinf": {"optimizer_states": "int4"}}`, `"int4"`},
		{`{"zinf": {"optimizer_states": "int4"}}`, `fp32, bf16, 8bit`},
		{`{"zinf": {"optimizer_states": 8}}`, `zinf.optimizer_states`},
		{`{"zinf": {"optimizer_states": "8bit"}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}`, `is for Adam and AdamW; optimizer.type is SGD`},
		{`{"zinf": {"optimizer_states": "8bit", "optimizer_states_fp32": ["*embed*", ""]}}`, `zinf.optimizer_states_fp32: "" is empty`},
	} {
		_, err := config.Parse([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %s", c.json, err, c.want)
		}
	}
}
