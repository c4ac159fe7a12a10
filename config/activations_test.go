package config_test

import (
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestActivationKeys: zinf.activations parses, is validated by name and
// survives a round trip; DeepSpeed's activation_checkpointing is read for
// cpu_checkpointing, its other keys accepted, a typo in it reported.
func TestActivationKeys(t *testing.T) {
	c, err := config.Parse([]byte(`{"activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true, "number_checkpoints": 4, "profile": false},
		"zinf": {"activations": {"device": "nvme", "memory_bytes": "1MiB", "cpu_bytes": "8MiB"}, "schedule": "layer-major"}}`))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Zinf.Activations
	if !c.CPUCheckpointing || a.Device != config.ActivationsNVMe || a.MemoryBytes != 1<<20 || a.CPUBytes != 8<<20 || c.Zinf.Schedule != config.ScheduleLayerMajor {
		t.Fatalf("parsed %+v, cpu_checkpointing %v, schedule %q", a, c.CPUCheckpointing, c.Zinf.Schedule)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(out)
	if err != nil {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
	if back.Zinf.Activations != a || !back.CPUCheckpointing || back.Zinf.Schedule != config.ScheduleLayerMajor {
		t.Fatalf("after a round trip %+v, %v, %q:\n%s", back.Zinf.Activations, back.CPUCheckpointing, back.Zinf.Schedule, out)
	}
	for _, bad := range []struct{ js, want string }{
		{`{"zinf": {"activations": {"device": "disk"}}}`, `zinf.activations.device: "disk" is not allowed (allowed: auto, memory, cpu, nvme)`},
		{`{"zinf": {"schedule": "zig-zag"}}`, `zinf.schedule: "zig-zag" is not allowed (allowed: auto, layer-major, micro-batch-major)`},
		{`{"activation_checkpointing": {"cpu_checkpoint": true}}`, `activation_checkpointing.cpu_checkpoint: unknown key`},
	} {
		_, err := config.Parse([]byte(bad.js))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.js, err, bad.want)
		}
	}
}
