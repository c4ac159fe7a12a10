package config

import (
	"errors"
	"strings"
	"testing"
)

// TestNVMeTBW: zinf.nvme_tbw takes a size in decimal units as ratings are
// given, survives a round trip, is left out of files that do not set it,
// and a negative or non-size value is a problem naming the key.
func TestNVMeTBW(t *testing.T) {
	c, err := Parse([]byte(`{"zinf": {"nvme_tbw": "600TB"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Zinf.NVMeTBW != 600e12 {
		t.Fatalf("nvme_tbw = %d, want 6e14", c.Zinf.NVMeTBW)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out)
	if err != nil || back.Zinf.NVMeTBW != 600e12 {
		t.Fatalf("round trip: %v, %d:\n%s", err, back.Zinf.NVMeTBW, out)
	}
	d, _ := Parse([]byte(`{}`))
	if out, _ := d.MarshalJSON(); strings.Contains(string(out), "nvme_tbw") {
		t.Errorf("a default config writes nvme_tbw:\n%s", out)
	}
	for _, in := range []string{`{"zinf": {"nvme_tbw": "-1TB"}}`, `{"zinf": {"nvme_tbw": "lots"}}`, `{"zinf": {"nvme_tbw": true}}`} {
		_, err := Parse([]byte(in))
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(err.Error(), "zinf.nvme_tbw") {
			t.Errorf("%s: %v", in, err)
		}
	}
}
