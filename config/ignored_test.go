package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestIgnoredKeysTyped is the regression for DeepSpeed keys zinf does not
// use being accepted with any value ("train_batch_size": "eight", an
// object, a 15 MB string), where DeepSpeed refuses the file: each is
// checked for DeepSpeed's type, and strings in them are bounded, with a
// problem naming the key.
func TestIgnoredKeysTyped(t *testing.T) {
	big := strings.Repeat("x", 1<<20) // the issue used 15 MB; any length past the bound is the same case
	for _, c := range []struct{ in, key, want string }{
		{`{"train_batch_size": "eight"}`, "train_batch_size", `"eight" is a string, not an integer`},
		{`{"train_batch_size": {"a": 1}}`, "train_batch_size", "is an object, not an integer"},
		{`{"train_batch_size": 8.5}`, "train_batch_size", "8.5 is not an integer"},
		{`{"train_batch_size": "` + big + `"}`, "train_batch_size", "is a string, not an integer"},
		{`{"communication_data_type": "` + big + `"}`, "communication_data_type", "is a string of 1048576 bytes"},
		{`{"tensorboard": {"enabled": true, "output_path": "` + big + `"}}`, "tensorboard.output_path", "is a string of 1048576 bytes"},
		{`{"wall_clock_breakdown": "yes"}`, "wall_clock_breakdown", `"yes" is a string, not a boolean`},
		{`{"tensorboard": true}`, "tensorboard", "true is a boolean, not an object"},
		{`{"gradient_predivide_factor": "2"}`, "gradient_predivide_factor", `is a string, not a number`},
		{`{"zero_optimization": {"stage": 3, "overlap_comm": 1}}`, "zero_optimization.overlap_comm", "1 is a number, not a boolean"},
		{`{"zero_optimization": {"stage": 3, "reduce_bucket_size": true}}`, "zero_optimization.reduce_bucket_size", "true is a boolean, not an integer"},
		{`{"bf16": {"enabled": true, "immediate_grad_update": "no"}}`, "bf16.immediate_grad_update", "is a string, not a boolean"},
		{`{"optimizer": {"type": "Adam", "params": {"torch_adam": 1}}}`, "optimizer.params.torch_adam", "is a number, not a boolean"},
	} {
		_, err := config.Parse([]byte(c.in))
		var ce *config.Error
		if !errors.As(err, &ce) || len(ce.Problems) != 1 {
			t.Errorf("%.80s: %.300v, want one problem", c.in, err)
			continue
		}
		if p := ce.Problems[0]; p.Key != c.key || !strings.Contains(p.String(), c.want) {
			t.Errorf("%.80s: %.300s, want key %s and %q", c.in, p.String(), c.key, c.want)
		}
		if len(err.Error()) > 1000 {
			t.Errorf("%.80s: a message of %d bytes; the value is not quoted whole", c.in, len(err.Error()))
		}
	}
	// DeepSpeed's own forms: counts in exponent form, "auto" from Hugging
	// Face, null, objects with any content.
	ok := `{"train_batch_size": "auto", "steps_per_print": 1e3, "wall_clock_breakdown": false,
		"gradient_predivide_factor": 1.5, "communication_data_type": null, "tensorboard": {"enabled": true, "output_path": "/tmp/tb"},
		"zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": "auto", "overlap_comm": true},
		"optimizer": {"type": "Adam", "params": {"torch_adam": false, "fused": null}}}`
	c, err := config.Parse([]byte(ok))
	if err != nil {
		t.Fatalf("DeepSpeed's forms: %v", err)
	}
	if len(c.Ignored) == 0 {
		t.Errorf("Ignored is empty, want the DeepSpeed keys listed")
	}
}
