package config_test

import (
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestPreallocateKey: zinf.preallocate defaults to true, reads false,
// round-trips through MarshalJSON (written only when false), and a value
// that is not a boolean is refused naming the key.
func TestPreallocateKey(t *testing.T) {
	c, err := config.Parse([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Zinf.Preallocate || !config.Default().Zinf.Preallocate {
		t.Fatal("zinf.preallocate does not default to true")
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "preallocate") {
		t.Errorf("the default is written:\n%s", out)
	}
	c, err = config.Parse([]byte(`{"zinf": {"preallocate": false}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Zinf.Preallocate {
		t.Fatal(`"preallocate": false parsed as true`)
	}
	out, err = c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if back.Zinf.Preallocate {
		t.Fatalf("false did not survive a round trip:\n%s", out)
	}
	_, err = config.Parse([]byte(`{"zinf": {"preallocate": "yes"}}`))
	if err == nil || !strings.Contains(err.Error(), "zinf.preallocate") {
		t.Fatalf(`"preallocate": "yes": %v, want an error naming zinf.preallocate`, err)
	}
}
