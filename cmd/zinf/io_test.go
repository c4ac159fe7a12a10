package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
)

// TestIOBadInput: each bad input fails with exit 1, an error naming the
// flag and value, and nothing written (no data file, no probe file).
func TestIOBadInput(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "dev")
	if code, _, errs := runCLI(t, "io", "--path", root, "--size", "4KiB", "--loops", "1", "--op", "write", "--direct", "off"); code != 0 {
		t.Fatalf("sanity run failed:\n%s", errs)
	}
	// The sanity run cleaned up after itself.
	if got := tree(t, root); !slices.Equal(got, []string{"."}) {
		t.Fatalf("a good run left %v", got)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	align, direct, err := aio.ProbeDir(dir, aio.DirectOptional)
	if err != nil {
		t.Fatal(err)
	}
	type tc struct {
		name string
		args []string
		want []string
	}
	cases := []tc{
		{"no path", []string{"--size", "1MiB"}, []string{"--path is required"}},
		{"nonexistent path", []string{"--path", filepath.Join(root, "nope")}, []string{"--path", "nope", "no such file or directory"}},
		{"path is a file", []string{"--path", "/proc/self/status"}, []string{"--path", "not a directory"}},
		{"zero size", []string{"--size", "0"}, []string{"--size 0", "positive"}},
		{"negative size", []string{"--size", "-1MiB"}, []string{"-size", `"-1MiB"`}},
		{"bad size", []string{"--size", "lots"}, []string{"-size", `"lots"`}},
		{"zero block size", []string{"--block-size", "0"}, []string{"--block-size 0"}},
		{"negative block size", []string{"--block-size", "-4096"}, []string{"-block-size", `"-4096"`}},
		{"block size 1000, direct required", []string{"--block-size", "1000", "--direct", "required"}, []string{"--block-size", "1000"}},
		{"block size too large", []string{"--block-size", "2GiB"}, []string{"--block-size", "2147483648"}},
		{"zero queue depth", []string{"--queue-depth", "0"}, []string{"--queue-depth 0"}},
		{"negative queue depth", []string{"--queue-depth", "-3"}, []string{"--queue-depth -3"}},
		{"huge queue depth", []string{"--queue-depth", "100000"}, []string{"--queue-depth", "100000"}},
		{"zero parallel", []string{"--parallel", "0"}, []string{"--parallel 0"}},
		{"huge parallel", []string{"--parallel", "1000"}, []string{"--parallel", "1000"}},
		{"zero loops", []string{"--loops", "0"}, []string{"--loops"}},
		{"negative loops", []string{"--loops", "-1"}, []string{"--loops -1"}},
		{"negative warmup", []string{"--warmup", "-1"}, []string{"--warmup -1"}},
		{"unknown backend", []string{"--backend", "spdk"}, []string{"--backend", `"spdk"`, "uring, libaio, posix"}},
		{"unknown op", []string{"--op", "copy"}, []string{"--op", `"copy"`}},
		{"unknown direct policy", []string{"--direct", "sometimes"}, []string{"--direct", `"sometimes"`}},
		{"file outside path", []string{"--file", "../escape.dat", "--op", "write"}, []string{"--file", "escape.dat"}},
		{"extra argument", []string{"--op", "write", "extra"}, []string{"unexpected arguments", "extra"}},
		{"everything at once", []string{"--size", "0", "--op", "copy", "--backend", "spdk", "--warmup", "-1"},
			[]string{"--size 0", `--op "copy"`, `"spdk"`, "--warmup -1"}},
	}
	if direct && align > 1 {
		// A power of two aio accepts, below the path's O_DIRECT alignment.
		small := fmt.Sprint(align / 2)
		cases = append(cases,
			tc{"block size below the alignment", []string{"--block-size", small, "--direct", "required"}, []string{"--block-size " + small, "alignment", fmt.Sprint(align)}},
			tc{"size not aligned", []string{"--size", fmt.Sprint(1<<20 + align/2), "--direct", "required"}, []string{"--size", "alignment"}})
	} else {
		t.Logf("no O_DIRECT alignment on %s: alignment cases skipped", dir)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"io", "--loops", "1", "--size", "1MiB"}
			if c.name != "no path" && !slices.Contains(c.args, "--path") {
				args = append(args, "--path", dir)
			}
			args = append(args, c.args...)
			before := tree(t, root)
			code, out, errs := runCLI(t, args...)
			if code == 0 {
				t.Fatalf("zinf %q succeeded:\n%s", args, out)
			}
			wantAll(t, "the error", errs, c.want...)
			if strings.Contains(errs, "panic") || strings.Contains(errs, "goroutine ") {
				t.Fatalf("zinf %q panicked:\n%s", args, errs)
			}
			if after := tree(t, root); !slices.Equal(before, after) {
				t.Fatalf("zinf %q changed the tree: %v -> %v", args, before, after)
			}
		})
	}
}

func TestIOReadOnlyPath(t *testing.T) {
	ro := readOnlyDir(t)
	for _, op := range []string{"write", "read"} {
		code, _, errs := runCLI(t, "io", "--path", ro, "--size", "1MiB", "--loops", "1", "--op", op)
		if code == 0 {
			t.Fatalf("%s on a read-only path succeeded", op)
		}
		wantAll(t, "the error", errs, "--path", ro, "not writable", "read-only")
		if got := tree(t, ro); !slices.Equal(got, []string{"."}) {
			t.Fatalf("read-only path now holds %v", got)
		}
	}
}

// ioJSON runs zinf io with --json and decodes its one object.
func ioJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	code, out, errs := runCLI(t, append([]string{"io", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("zinf io %q: exit %d:\n%s", args, code, errs)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value:\n%s", out)
	}
	return m
}

func checkIOJSON(t *testing.T, m map[string]any, op, backend string, size int64, loops int) {
	t.Helper()
	for _, k := range []string{"op", "backend", "bytes", "loops", "gbps_median", "gbps_min", "gbps_max"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("JSON lacks %q: %v", k, m)
		}
	}
	if m["op"] != op || m["backend"] != backend || m["bytes"] != float64(size) || m["loops"] != float64(loops) {
		t.Fatalf("op %v backend %v bytes %v loops %v; want %s %s %d %d", m["op"], m["backend"], m["bytes"], m["loops"], op, backend, size, loops)
	}
	med, lo, hi := m["gbps_median"].(float64), m["gbps_min"].(float64), m["gbps_max"].(float64)
	if !(lo > 0 && lo <= med && med <= hi) {
		t.Fatalf("GB/s min %v median %v max %v", lo, med, hi)
	}
	// GB is 1e9 bytes: the loop times the figures imply fit inside the
	// whole run's elapsed time (with GiB they would come out 7% longer).
	// This checks units, not speed.
	var implied float64
	for _, g := range m["gbps"].([]any) {
		implied += float64(size) / (g.(float64) * 1e9)
	}
	if el := m["elapsed_seconds"]; el != nil && implied > el.(float64)*(1+1e-9) {
		t.Fatalf("loop times implied by GB/s (1e9) sum to %vs, more than the %vs the run took", implied, el)
	}
}

// TestIOWriteThenRead: every backend writes then reads; 64MiB sizes are
// accepted; nothing is left behind.
func TestIOWriteThenRead(t *testing.T) {
	for _, b := range aio.Backends {
		t.Run(b, func(t *testing.T) {
			if err := aio.Available(b); err != nil {
				t.Skipf("backend %s unavailable here: %v", b, err)
			}
			dir := t.TempDir()
			size, sizeArg := int64(4<<20), "4MiB"
			if b == aio.BackendPosix {
				size, sizeArg = 64<<20, "64MiB" // once: the documented example size
			}
			for _, op := range []string{"write", "read"} {
				m := ioJSON(t, "--path", dir, "--size", sizeArg, "--op", op, "--backend", b, "--loops", "2", "--warmup", "0", "--block-size", "1MiB", "--queue-depth", "8")
				checkIOJSON(t, m, op, b, size, 2)
				if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
					t.Fatalf("after %s: %v left behind", op, got)
				}
			}
		})
	}
}

func TestIOModes(t *testing.T) {
	dir := t.TempDir()
	// --keep, then a read reuses the file, which stays.
	m := ioJSON(t, "--path", dir, "--size", "2MiB", "--op", "write", "--loops", "1", "--keep", "--file", "kept.dat", "--backend", "posix")
	checkIOJSON(t, m, "write", "posix", 2<<20, 1)
	m = ioJSON(t, "--path", dir, "--size", "2MiB", "--op", "read", "--loops", "1", "--file", "kept.dat", "--backend", "posix",
		"--single-submit", "--no-overlap-events", "--parallel", "2")
	checkIOJSON(t, m, "read", "posix", 2<<20, 1)
	if m["single_submit"] != true || m["overlap_events"] != false || m["parallel"] != float64(2) {
		t.Fatalf("submit flags not applied: %v", m)
	}
	if got := tree(t, dir); !slices.Equal(got, []string{".", "kept.dat"}) {
		t.Fatalf("tree %v, want the kept file only", got)
	}

	// --direct off: buffered, any size.
	m = ioJSON(t, "--path", dir, "--size", "1000000", "--op", "write", "--loops", "1", "--direct", "off", "--backend", "posix")
	checkIOJSON(t, m, "write", "posix", 1000000, 1)
	if m["direct"] != false || m["align_bytes"] != float64(1) {
		t.Fatalf("--direct off: direct %v align %v", m["direct"], m["align_bytes"])
	}

	// --naive: os.File I/O for contrast.
	for _, op := range []string{"write", "read"} {
		m = ioJSON(t, "--path", dir, "--size", "3MiB", "--op", op, "--loops", "1", "--naive")
		checkIOJSON(t, m, op, "naive-go", 3<<20, 1)
	}

	// Text output: a summary on stdout, a line per loop on stderr.
	code, out, errs := runCLI(t, "io", "--path", dir, "--size", "1MiB", "--op", "write", "--loops", "2", "--backend", "posix")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "stdout", out, "write ", "1048576 bytes x 2 loops", "backend posix", "GB/s: median")
	if n := strings.Count(errs, "write loop"); n != 2 {
		t.Fatalf("stderr has %d progress lines, want 2:\n%s", n, errs)
	}
	if got := tree(t, dir); !slices.Equal(got, []string{".", "kept.dat"}) {
		t.Fatalf("tree %v, want the kept file only", got)
	}
}

// TestIOOverwrite is the regression for zinf io --op write refusing the
// file an earlier run left (DeepNVMe's ds_io workflow writes the same file
// again): --overwrite rewrites it in place and keeps it. The protection
// stays for everything else: a symbolic link (its target untouched), a
// named pipe (no blocking), a file of another user, and any file without
// --overwrite.
func TestIOOverwrite(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "zinf-io-4194304.dat")
	write := func(extra ...string) (int, string) {
		args := append([]string{"io", "--path", dir, "--size", "4MiB", "--op", "write", "--loops", "1", "--warmup", "0", "--direct", "off"}, extra...)
		code, _, errs := runCLI(t, args...)
		return code, errs
	}
	if code, errs := write("--keep"); code != 0 {
		t.Fatalf("first write: exit %d:\n%s", code, errs)
	}
	before, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if code, errs := write(); code != 1 || !strings.Contains(errs, "--overwrite") {
		t.Fatalf("second write without --overwrite: exit %d, want 1 and a hint at --overwrite:\n%s", code, errs)
	}
	if code, errs := write("--overwrite"); code != 0 {
		t.Fatalf("second write with --overwrite: exit %d:\n%s", code, errs)
	}
	after, err := os.Stat(name)
	if err != nil {
		t.Fatalf("--overwrite removed the file: %v", err)
	}
	if !os.SameFile(before, after) || after.Size() != 4<<20 {
		t.Errorf("--overwrite replaced the file (%v, %d bytes), want it rewritten in place", os.SameFile(before, after), after.Size())
	}
	if code, _, errs := runCLI(t, "io", "--path", dir, "--size", "4MiB", "--op", "read", "--overwrite", "--loops", "1", "--direct", "off"); code != 1 || !strings.Contains(errs, "--overwrite applies to --op write") {
		t.Errorf("--op read --overwrite: exit %d:\n%s", code, errs)
	}

	// A link at the name: refused, its target untouched.
	os.Remove(name)
	target := filepath.Join(t.TempDir(), "precious")
	content := []byte("someone's data")
	if err := os.WriteFile(target, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
	if code, errs := write("--overwrite"); code != 1 || !strings.Contains(errs, "symbolic link") {
		t.Errorf("--overwrite of a link: exit %d, want 1 naming the link:\n%s", code, errs)
	}
	unchanged(t, target, content)
	linkIntact(t, name, target)

	// A named pipe at the name: refused at once.
	os.Remove(name)
	if err := unix.Mkfifo(name, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, errs := write("--overwrite"); code != 1 || !strings.Contains(errs, "not a regular file") {
		t.Errorf("--overwrite of a pipe: exit %d, want 1:\n%s", code, errs)
	}

	// Another user's file: refused, unchanged.
	os.Remove(name)
	if err := os.WriteFile(name, content, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(name, os.Geteuid()+4242, -1); err != nil {
		t.Logf("cannot give a file to another user here (%v): that case is not checked", err)
		return
	}
	if code, errs := write("--overwrite"); code != 1 || !strings.Contains(errs, "not to the user running zinf") {
		t.Errorf("--overwrite of another user's file: exit %d, want 1:\n%s", code, errs)
	}
	unchanged(t, name, content)
}
