package main

import (
	"bytes"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// runCLI runs the command line in-process and returns the exit code and what
// it printed.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// tree lists every file and directory under root (relative paths, sorted),
// to show that a rejected command wrote nothing.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// readOnlyDir mounts a read-only tmpfs: as root, permission bits would not
// stop a write.
func readOnlyDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot mount a read-only tmpfs here (needs root / CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	return dir
}

func wantAll(t *testing.T, what, text string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(text, p) {
			t.Errorf("%s does not mention %q:\n%s", what, p, text)
		}
	}
}

func TestUsage(t *testing.T) {
	all := []string{"io", "bench-io", "tune", "doctor", "plan", "train", "infer"}

	code, out, errs := runCLI(t)
	if code != 2 || out != "" {
		t.Fatalf("no arguments: exit %d, stdout %q; want 2 and usage on stderr", code, out)
	}
	wantAll(t, "usage without arguments", errs, append([]string{"Usage: zinf <command>"}, all...)...)

	for _, h := range []string{"-h", "--help", "help"} {
		code, out, errs = runCLI(t, h)
		if code != 0 || errs != "" {
			t.Fatalf("%s: exit %d, stderr %q", h, code, errs)
		}
		wantAll(t, h, out, all...)
	}

	code, out, errs = runCLI(t, "frobnicate", "--path", "x")
	if code != 2 || out != "" {
		t.Fatalf("unknown command: exit %d, stdout %q", code, out)
	}
	wantAll(t, "unknown command", errs, `unknown command "frobnicate"`, "Commands:", "io")
}

func TestCommandHelp(t *testing.T) {
	for _, args := range [][]string{{"io", "-h"}, {"help", "io"}, {"io", "--help"}} {
		code, _, errs := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d", args, code)
		}
		wantAll(t, strings.Join(args, " "), errs, "-path", "-block-size", "-backend", "-direct")
	}
	for _, name := range []string{"tune", "doctor", "plan", "train", "infer", "bench-io"} {
		if code, _, errs := runCLI(t, name, "-h"); code != 0 || !strings.Contains(errs, "Usage of zinf "+name) {
			t.Errorf("%s -h: exit %d:\n%s", name, code, errs)
		}
	}
	code, _, errs := runCLI(t, "io", "--no-such-flag")
	if code == 0 || !strings.Contains(errs, "no-such-flag") {
		t.Fatalf("unknown flag: exit %d:\n%s", code, errs)
	}
}
