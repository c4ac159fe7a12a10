package procstat_test

import (
	"os"
	"runtime"
	"testing"

	"github.com/zinfio/zinf/metrics/procstat"
)

// TestCounters: on Linux the resident set grows by what the process
// touches, the peak is at least the current figure, the machine's memory
// is at least the resident set, and a file written with fsync shows in the
// process's block-layer write counter.
func TestCounters(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	before := procstat.RSS()
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	after := procstat.RSS()
	if after-before < 32<<20 {
		t.Fatalf("RSS %d -> %d after touching 64 MiB", before, after)
	}
	if p := procstat.PeakRSS(); p < after {
		t.Fatalf("peak %d below current %d", p, after)
	}
	if m := procstat.MemTotal(); m < after {
		t.Fatalf("MemTotal %d below RSS %d", m, after)
	}
	runtime.KeepAlive(buf)

	_, w0, ok := procstat.IO()
	if !ok {
		t.Skip("/proc/self/io not readable here")
	}
	f, err := os.CreateTemp(t.TempDir(), "io")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(buf[:8<<20]); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	_, w1, _ := procstat.IO()
	if w1 == w0 {
		t.Skipf("write_bytes unchanged by a synced write: %s has no block device accounting (tmpfs?)", f.Name())
	}
	if w1-w0 < 8<<20 {
		t.Fatalf("write_bytes %d -> %d after 8 MiB written and synced", w0, w1)
	}
}

// TestStatusUnknownField: a field /proc/self/status does not have is
// reported missing, not zero with ok.
func TestStatusUnknownField(t *testing.T) {
	if n, ok := procstat.Status("NoSuchField"); ok || n != 0 {
		t.Fatalf("Status(NoSuchField) = %d, %v", n, ok)
	}
}

// TestRunChild: a child's JSON comes back decoded; a failing child and one
// that prints no JSON are errors.
func TestRunChild(t *testing.T) {
	var r struct{ Steps []float64 }
	if err := procstat.RunChild("/bin/sh", []string{"-c", `echo '{"Steps": [1.5, 2]}'`}, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Steps) != 2 || r.Steps[0] != 1.5 || r.Steps[1] != 2 {
		t.Fatalf("decoded %+v", r)
	}
	if err := procstat.RunChild("/bin/sh", []string{"-c", "exit 3"}, &r); err == nil {
		t.Fatal("a child that exits 3: no error")
	}
	if err := procstat.RunChild("/bin/sh", []string{"-c", "echo not json"}, &r); err == nil {
		t.Fatal("a child that prints no JSON: no error")
	}
}
