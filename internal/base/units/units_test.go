package units_test

import (
	"math"
	"testing"

	"github.com/zinfio/zinf/internal/base/units"
)

func TestFormatBytes(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {512, "512 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{8 << 20, "8.0 MiB"}, {3 << 30, "3.0 GiB"}, {1 << 50, "1.0 PiB"}, {-2048, "-2.0 KiB"},
		{math.MaxInt64, "8.0 EiB"}, {math.MinInt64, "-9223372036854775808 B"},
	} {
		if got := units.FormatBytes(c.n); got != c.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	if got := units.FormatBytesExact(8 << 20); got != "8 MiB (8388608 bytes)" {
		t.Errorf("FormatBytesExact(8MiB) = %q", got)
	}
	if got := units.FormatBytesExact(3 << 29); got != "1.5 GiB (1610612736 bytes)" {
		t.Errorf("FormatBytesExact(1.5GiB) = %q", got)
	}
	if got := units.FormatBytesExact(100); got != "100 bytes" {
		t.Errorf("FormatBytesExact(100) = %q", got)
	}
}
