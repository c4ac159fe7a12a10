package config

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzParse checks that Parse never panics, that a config it accepts is
// valid, and that writing it out and reading it back gives the same config
// (MarshalJSON then Parse is a fixed point).
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.json"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add(defaultJSON)
	for _, s := range []string{
		`{}`,
		`{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}`,
		`{"zero_optimization": true}`,
		`{"zero_optimization": {"stage": 2, "cpu_offload": true, "cpu_offload_use_pin_memory": true}}`,
		`{"aio": {"block_size": "4MiB", "queue_depth": 1e2, "thread_count": 2, "use_gds": true}}`,
		`{"zinf": {"nvme_paths": ["/a", "/b"], "tiers": {"gpu_bytes": "1.5GB", "cpu_pinned_bytes": 1e9}, "rank": 1, "world_size": 2}}`,
		`{"zinf": {"pipeline_depth": 16, "gds": "auto", "device": "cuda", "direct": "off", "backend": "posix"}}`,
		`{"optimizer": {"type": "adamw", "params": {"lr": "auto", "betas": [0, 0.5], "eps": 1e-300}}}`,
		`{"bfloat16": {"enabled": true}, "train_micro_batch_size_per_gpu": 8}`,
		`{"aio": {"queue_depth": "eight"}, "zero_optimization": {"offload_parm": {}}}`,
		`{"a": {"a": {"a": [1, {"b": null}]}}}`,
		`{"zinf": {"swap_file_bytes": "9223372036854775807"}}`,
		"\xef\xbb\xbf{\"fp16\": {\"enabled\": false}}",
		`[1]`, `"x"`, ``, `{`, `{"aio": {"queue_depth": 8,}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, k := range []string{"RANK", "WORLD_SIZE"} {
			if _, ok := os.LookupEnv(k); ok {
				t.Skip("RANK / WORLD_SIZE set in the environment")
			}
		}
		c, err := Parse(data)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a config and an error")
			}
			if _, ok := err.(*Error); !ok {
				t.Fatalf("Parse error is %T", err)
			}
			if err.Error() == "" {
				t.Fatalf("empty error message")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config Validate rejects: %v", err)
		}
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatalf("MarshalJSON: %v", err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parse of\n%s\nfailed: %v", out, err)
		}
		if !reflect.DeepEqual(comparable(c), comparable(back)) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v\n%s", comparable(c), comparable(back), out)
		}
		out2, err := back.MarshalJSON()
		if err != nil || string(out2) != string(out) {
			t.Fatalf("second MarshalJSON differs:\n%s\n%s", out, out2)
		}
	})
}
