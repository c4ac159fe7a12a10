package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
)

// TestTimeoutKeys: the zinf section's timeouts have their documented
// defaults, read durations as strings or numbers of seconds, and
// round-trip through MarshalJSON (written only when not the default).
func TestTimeoutKeys(t *testing.T) {
	c, err := config.Parse([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	z := c.Zinf
	if z.PinnedStallTimeout != config.Duration(2*time.Minute) || z.CommStallTimeout != config.Duration(10*time.Minute) ||
		z.CommHeartbeatTimeout != config.Duration(10*time.Second) {
		t.Fatalf("defaults: %v %v %v", z.PinnedStallTimeout, z.CommStallTimeout, z.CommHeartbeatTimeout)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "timeout") {
		t.Errorf("the defaults are written:\n%s", out)
	}
	c, err = config.Parse([]byte(`{"zinf": {"pinned_stall_timeout": "90s", "comm_stall_timeout": 150, "comm_heartbeat_timeout": "2.5s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	z = c.Zinf
	if z.PinnedStallTimeout != config.Duration(90*time.Second) || z.CommStallTimeout != config.Duration(150*time.Second) ||
		z.CommHeartbeatTimeout != config.Duration(2500*time.Millisecond) {
		t.Fatalf("parsed: %v %v %v", z.PinnedStallTimeout, z.CommStallTimeout, z.CommHeartbeatTimeout)
	}
	out, err = c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if b := back.Zinf; b.PinnedStallTimeout != z.PinnedStallTimeout || b.CommStallTimeout != z.CommStallTimeout || b.CommHeartbeatTimeout != z.CommHeartbeatTimeout {
		t.Fatalf("round trip: %v %v %v\n%s", b.PinnedStallTimeout, b.CommStallTimeout, b.CommHeartbeatTimeout, out)
	}
}

// TestTimeoutKeysRefused: every bad value is reported by its key, with
// the value and what is allowed.
func TestTimeoutKeysRefused(t *testing.T) {
	for _, c := range []struct {
		json string
		want []string
	}{
		{`{"pinned_stall_timeout": "0s"}`, []string{"zinf.pinned_stall_timeout", `"0s"`, "out of range", "from 1s to 24h0m0s"}},
		{`{"pinned_stall_timeout": -5}`, []string{"zinf.pinned_stall_timeout", "out of range"}},
		{`{"pinned_stall_timeout": "25h"}`, []string{"zinf.pinned_stall_timeout", "out of range"}},
		{`{"pinned_stall_timeout": "soon"}`, []string{"zinf.pinned_stall_timeout", `"soon"`, "is not a duration", `"90s"`}},
		{`{"pinned_stall_timeout": "10"}`, []string{"zinf.pinned_stall_timeout", "is not a duration"}},
		{`{"comm_stall_timeout": true}`, []string{"zinf.comm_stall_timeout", "not a duration"}},
		{`{"comm_stall_timeout": 1e300}`, []string{"zinf.comm_stall_timeout", "out of range"}},
		{`{"comm_heartbeat_timeout": "500ms"}`, []string{"zinf.comm_heartbeat_timeout", "out of range", "from 1s to 1h0m0s"}},
		{`{"comm_heartbeat_timeout": "2h"}`, []string{"zinf.comm_heartbeat_timeout", "out of range"}},
		{`{"comm_heartbeat_timeout": {}}`, []string{"zinf.comm_heartbeat_timeout", "not a duration"}},
	} {
		_, err := config.Parse([]byte(`{"zinf": ` + c.json + `}`))
		if err == nil {
			t.Errorf("%s: accepted", c.json)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", c.json, err, w)
			}
		}
	}
}
