package main

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/aio"
)

// TestBenchIO runs one tiny interleaved round against fio, when installed.
func TestBenchIO(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skipf("fio is not installed (apt-get install -y fio): %v", err)
	}
	dir := t.TempDir()
	if _, direct, err := aio.ProbeDir(dir, aio.DirectOptional); err != nil || !direct {
		t.Skipf("no O_DIRECT on %s, which the comparison requires", dir)
	}
	code, out, errs := runCLI(t, "bench-io", "--path", dir, "--size", "8MiB", "--rounds", "1")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "table", out, "zinf/fio", "GB = 1e9 bytes", "posix", "naive-go")
	wantAll(t, "progress", errs, "round 1/1")
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("bench-io left %v", got)
	}
}

func TestBenchIOBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--size", "8MiB"}, "--path is required"},
		{[]string{"--path", filepath.Join(dir, "nope"), "--fio", "/bin/true"}, "nope"},
		{[]string{"--path", dir, "--fio", filepath.Join(dir, "no-fio")}, "--fio"},
		{[]string{"--path", dir, "--rounds", "-1", "--fio", "/bin/true"}, "--rounds -1"},
	} {
		code, out, errs := runCLI(t, append([]string{"bench-io"}, c.args...)...)
		if code == 0 {
			t.Errorf("bench-io %q succeeded:\n%s", c.args, out)
			continue
		}
		if !strings.Contains(errs, c.want) {
			t.Errorf("bench-io %q: error does not mention %q:\n%s", c.args, c.want, errs)
		}
		if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
			t.Fatalf("bench-io %q left %v", c.args, got)
		}
	}
}
