package doctor_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/cmd/zinf/internal/doctor"
	"github.com/zinfio/zinf/swapper"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const childEnv = "ZINF_DOCTOR_STALE_CHILD"

// TestStaleChildProcess is the child of killedRun, not a test by itself:
// it opens a swap store, writes a tensor, says "ready" and sleeps until
// killed.
func TestStaleChildProcess(t *testing.T) {
	dir := os.Getenv(childEnv)
	if dir == "" {
		t.Skip("runs only as the child of a crash test")
	}
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		fail(err)
	}
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "grad-rank0", Logger: quiet})
	if err != nil {
		fail(err)
	}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 4 << 20, Logger: quiet})
	if err != nil {
		fail(err)
	}
	b, err := pool.Acquire(context.Background(), 2<<20, buffers.PurposeStaging)
	if err == nil {
		err = s.Write(context.Background(), "g", b.Bytes()[:2<<20])
	}
	if err != nil {
		fail(err)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// killedRun runs a child that opens a store in dir, and SIGKILLs it once
// it has written; it returns the child's pid.
func killedRun(t *testing.T, dir string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStaleChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child not ready (failed, or the watchdog fired): %q, %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	return cmd.Process.Pid
}

func check(t *testing.T, r *doctor.Report, name string) doctor.Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return doctor.Check{}
}

// TestStaleSwapSpace: doctor reports what a killed run left in a swap
// path, with its size and pid, and not a live store's directory; once a
// new store has cleaned the path, it reports none.
func TestStaleSwapSpace(t *testing.T) {
	dir := t.TempDir()
	pid := killedRun(t, dir)

	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	live, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "param-rank0", KeepStale: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	c := check(t, doctor.Run([]string{dir}), "stale "+dir)
	if c.OK || len(c.Stale) != 1 || c.Stale[0].PID != pid || c.Stale[0].Bytes < 2<<20 {
		t.Fatalf("stale check %+v: want one dead run of pid %d holding at least 2 MiB", c, pid)
	}
	dead := c.Stale[0].Dir
	if !strings.HasPrefix(filepath.Base(dead), fmt.Sprintf("zinf-grad-rank0-%d-", pid)) || !strings.Contains(c.Detail, dead) ||
		!strings.Contains(c.Detail, fmt.Sprintf("pid %d", pid)) || !strings.Contains(c.Detail, fmt.Sprintf("%d bytes", c.Stale[0].Bytes)) {
		t.Fatalf("the detail should name the directory, pid and bytes: %+v", c)
	}
	if strings.Contains(c.Detail, live.Paths()[0]) {
		t.Fatalf("a live store's directory reported stale: %s", c.Detail)
	}

	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Lstat(dead); !os.IsNotExist(err) {
		t.Fatalf("OpenStore left the dead run's directory: %v", err)
	}
	if c := check(t, doctor.Run([]string{dir}), "stale "+dir); !c.OK || len(c.Stale) != 0 {
		t.Fatalf("after cleanup: %+v", c)
	}
	if _, err := os.Stat(live.Paths()[0]); err != nil {
		t.Fatalf("the live store's directory is gone: %v", err)
	}
}

// TestRAMBackedPaths: tmpfs and ramfs keep swapped data in memory, and
// the report says so; ramfs reports no free space, and the report says
// that rather than "0B free".
func TestRAMBackedPaths(t *testing.T) {
	for _, fs := range []string{"tmpfs", "ramfs"} {
		dir := t.TempDir()
		if err := syscall.Mount(fs, dir, fs, 0, ""); err != nil {
			t.Skipf("cannot mount %s here (needs root): %v", fs, err)
		}
		t.Cleanup(func() { syscall.Unmount(dir, 0) })
		c := check(t, doctor.Run([]string{dir}), "path "+dir)
		if !strings.Contains(c.Detail, "RAM-backed ("+fs+")") || !strings.Contains(c.Detail, "data lives in memory") {
			t.Errorf("%s path: %q, want it called RAM-backed", fs, c.Detail)
		}
		if fs == "ramfs" && (strings.Contains(c.Detail, "0B free") || !strings.Contains(c.Detail, "free space not reported")) {
			t.Errorf("ramfs path: %q, want no free-space figure", c.Detail)
		}
		if fs == "tmpfs" && !strings.Contains(c.Detail, "free under the mount's size limit") {
			t.Errorf("tmpfs path: %q, want its free space", c.Detail)
		}
	}
}

// TestIncompleteRunDirCounted: an empty run directory older than
// swapper.IncompleteGrace, as a process killed between making it and its
// lock file leaves, is counted and said to be one.
func TestIncompleteRunDirCounted(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "zinf-act-rank0-999999-7")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * swapper.IncompleteGrace)
	if err := os.Chtimes(empty, old, old); err != nil {
		t.Fatal(err)
	}
	c := check(t, doctor.Run([]string{dir}), "stale "+dir)
	if c.OK || len(c.Stale) != 1 || c.Stale[0].Dir != empty || !c.Stale[0].Incomplete || c.Stale[0].PID != 999999 ||
		!strings.Contains(c.Detail, empty) || !strings.Contains(c.Detail, "killed while making it") {
		t.Fatalf("stale check %+v: want the empty run directory counted", c)
	}
}
