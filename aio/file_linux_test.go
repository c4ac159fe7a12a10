package aio

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// captureLog returns a logger writing to a buffer.
func captureLog() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

// withoutDirect makes open(2) refuse O_DIRECT with EINVAL, as a filesystem
// without direct I/O does.
func withoutDirect(t *testing.T) {
	old := openFn
	openFn = func(path string, flag int, perm uint32) (int, error) {
		if flag&unix.O_DIRECT != 0 {
			return -1, unix.EINVAL
		}
		return old(path, flag, perm)
	}
	t.Cleanup(func() { openFn = old })
}

func checkNoDirectPolicies(t *testing.T, dir string) {
	t.Helper()
	noDirectWarned.Delete(noDirectKey(dir))
	log, out := captureLog()
	// optional: falls back with one warning and works.
	f, err := OpenFile(filepath.Join(dir, "a"), os.O_RDWR|os.O_CREATE, 0o644, DirectOptional, log)
	if err != nil {
		t.Fatalf("optional on a filesystem without O_DIRECT: %v", err)
	}
	if f.Direct() || f.Alignment() != 1 {
		t.Fatalf("fallback file: direct=%v align=%d", f.Direct(), f.Alignment())
	}
	g, err := OpenFile(filepath.Join(dir, "b"), os.O_RDWR|os.O_CREATE, 0o644, DirectOptional, log)
	if err != nil {
		t.Fatal(err)
	}
	// Another directory on the same filesystem (each swap store makes
	// its own run directory): still the one warning.
	sub := filepath.Join(dir, "run-2")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	h, err := OpenFile(filepath.Join(sub, "c"), os.O_RDWR|os.O_CREATE, 0o644, DirectOptional, log)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	if n := strings.Count(out.String(), "refuses O_DIRECT"); n != 1 {
		t.Fatalf("want exactly one warning per filesystem, got %d:\n%s", n, out)
	}
	e, err := New(Options{Backend: BackendPosix, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// Unaligned I/O works on the buffered fallback.
	src := []byte("seventeen bytes!!")
	if _, err := e.WriteAt(context.Background(), f, src, 3); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	if _, err := e.ReadAt(context.Background(), f, dst, 3); err != nil || !bytes.Equal(src, dst) {
		t.Fatalf("fallback round trip: %v %q", err, dst)
	}
	f.Close()
	g.Close()
	// required: fails, says why, creates nothing.
	p := filepath.Join(dir, "c")
	_, err = OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644, DirectRequired, log)
	if !errors.Is(err, ErrNoDirect) || !strings.Contains(err.Error(), "refuses O_DIRECT") || !strings.Contains(err.Error(), "required") {
		t.Fatalf("required: want a clear ErrNoDirect, got %v", err)
	}
}

// TestNoDirectSeam simulates a filesystem without O_DIRECT through the open
// seam, on any machine.
func TestNoDirectSeam(t *testing.T) {
	withoutDirect(t)
	checkNoDirectPolicies(t, t.TempDir())
}

// TestNoDirectRamfs uses a real filesystem without O_DIRECT. tmpfs gained
// O_DIRECT in Linux 6.6, so ramfs (which never had it) is mounted when
// running as root; elsewhere /dev/shm is tried.
func TestNoDirectRamfs(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		if probeDirect("/dev/shm") {
			t.Skipf("cannot mount ramfs (%v) and /dev/shm supports O_DIRECT on this kernel; TestNoDirectSeam covers the logic", err)
		}
		dir = t.TempDir()
		dir, _ = os.MkdirTemp("/dev/shm", "zinf-nodirect")
		defer os.RemoveAll(dir)
	} else {
		defer unix.Unmount(dir, 0)
	}
	if probeDirect(dir) {
		t.Fatalf("%s unexpectedly supports O_DIRECT", dir)
	}
	checkNoDirectPolicies(t, dir)
}

func probeDirect(dir string) bool {
	p := filepath.Join(dir, ".probe")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT, 0o600)
	if err != nil {
		return false
	}
	unix.Close(fd)
	os.Remove(p)
	return true
}

// TestAlignmentFromDevice checks the alignment comes from the filesystem or
// device, not a constant: it must be a power of two >= 512 and match the
// block device's logical block size or statx's DIO alignment.
func TestAlignmentFromDevice(t *testing.T) {
	dir := t.TempDir()
	f, err := OpenFile(filepath.Join(dir, "x"), os.O_RDWR|os.O_CREATE, 0o644, DirectRequired, nil)
	if err != nil {
		t.Skipf("no O_DIRECT on %s: %v", dir, err)
	}
	defer f.Close()
	a := f.Alignment()
	if a < 512 || a&(a-1) != 0 {
		t.Fatalf("alignment %d is not a plausible sector size", a)
	}
	var stx unix.Statx_t
	if err := unix.Statx(f.fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx); err == nil && stx.Mask&unix.STATX_DIOALIGN != 0 && stx.Dio_offset_align > 0 {
		if want := int(max(stx.Dio_offset_align, stx.Dio_mem_align)); a != want {
			t.Fatalf("alignment %d, statx says %d", a, want)
		}
	}
	t.Logf("O_DIRECT alignment on %s: %d", dir, a)
}

// TestReadOnlyAndMissing checks clear errors for a missing directory and a
// read-only file.
func TestReadOnlyAndMissing(t *testing.T) {
	_, err := OpenFile("/nonexistent-zinf/x", os.O_RDWR|os.O_CREATE, 0o644, DirectOptional, nil)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "/nonexistent-zinf/x") {
		t.Fatalf("missing dir: %v", err)
	}
	p := filepath.Join(t.TempDir(), "ro")
	os.WriteFile(p, make([]byte, 4096), 0o444)
	f, err := OpenFile(p, os.O_RDONLY, 0, DirectOff, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e, _ := New(Options{Backend: BackendPosix, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer e.Close()
	_, err = e.WriteAt(context.Background(), f, make([]byte, 10), 0)
	if !errors.Is(err, unix.EBADF) || !strings.Contains(err.Error(), p) {
		t.Fatalf("write to read-only fd: %v", err)
	}
}

// TestProbeDirLeavesNothing: probing a directory without O_DIRECT under
// the required policy fails and leaves no probe file behind.
func TestProbeDirLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount ramfs here (%v); the named-probe path needs a filesystem without O_TMPFILE+O_DIRECT", err)
	}
	defer unix.Unmount(dir, 0)
	if _, _, err := ProbeDir(dir, DirectRequired); !errors.Is(err, ErrNoDirect) {
		t.Fatalf("want ErrNoDirect, got %v", err)
	}
	if align, direct, err := ProbeDir(dir, DirectOptional); err != nil || direct || align != 1 {
		t.Fatalf("optional: align %d direct %v err %v", align, direct, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("probe left %d entries", len(ents))
	}
}

// TestTmpfileWithoutDirect: an unnamed file (O_TMPFILE, path naming the
// directory) on a filesystem without O_DIRECT falls back like a named one,
// and the warning and the error name that directory and its filesystem,
// not the directory's parent (a probe's fallback used to warn a second
// time, for the parent's filesystem).
func TestTmpfileWithoutDirect(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount ramfs here: %v", err)
	}
	defer unix.Unmount(dir, 0)
	// A ramfs mounted by an earlier test may have had this device number
	// and been warned about already.
	noDirectWarned.Clear()
	log, out := captureLog()
	f, err := OpenFile(dir, os.O_RDWR|unix.O_TMPFILE, 0o600, DirectOptional, log)
	if err != nil {
		t.Fatalf("O_TMPFILE in %s (ramfs): %v", dir, err)
	}
	f.Close()
	if f.Direct() {
		t.Fatal("ramfs gave an O_DIRECT file")
	}
	if w := out.String(); !strings.Contains(w, "dir="+dir+" ") || !strings.Contains(w, "fs=ramfs") {
		t.Fatalf("the fallback warning should name %s on ramfs:\n%s", dir, w)
	}
	_, err = OpenFile(dir, os.O_RDWR|unix.O_TMPFILE, 0o600, DirectRequired, log)
	if !errors.Is(err, ErrNoDirect) || !strings.Contains(err.Error(), "(ramfs)") {
		t.Fatalf("required O_DIRECT on ramfs: %v, want ErrNoDirect naming ramfs", err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("the directory after a refused unnamed open: %v, %v", fi, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("unnamed opens left %v", ents)
	}
}
