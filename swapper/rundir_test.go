package swapper_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper"
)

// runDirChildEnv names the path a child process makes a run directory in
// (TestRunDirChildProcess); the child then waits to be killed.
const runDirChildEnv = "ZINF_SWAPPER_RUNDIR_CHILD"

// TestRunDirChildProcess is the child of TestRunDirKilled, not a test by
// itself: it makes a run directory, writes a file in it, says "ready" and
// sleeps until killed.
func TestRunDirChildProcess(t *testing.T) {
	dir := os.Getenv(runDirChildEnv)
	if dir == "" {
		t.Skip("runs only as the child of TestRunDirKilled")
	}
	d, err := swapper.NewRunDir(dir, "compare", quiet)
	if err == nil {
		err = os.WriteFile(filepath.Join(d.Path(), "data"), make([]byte, 1<<20), 0o600)
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// TestRunDirKilled: a tool's run directory left by a SIGKILLed process is
// listed by FindStale (its name, pid and bytes) and removed by the next
// NewRunDir in the path; a live one, and a user's directory of the same
// name shape without a lock, are left alone. Close removes the directory.
func TestRunDirKilled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRunDirChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), runDirChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child did not get ready (watchdog or failure): %q, %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	pid := cmd.Process.Pid
	left := entries(t, dir)
	if len(left) != 1 || !strings.HasPrefix(left[0], fmt.Sprintf("zinf-compare-%d-", pid)) {
		t.Fatalf("the killed run should have left its directory: %v", left)
	}
	dead := filepath.Join(dir, left[0])
	stale, err := swapper.FindStale(dir)
	if err != nil || len(stale) != 1 || stale[0].Dir != dead || stale[0].Name != "compare" || stale[0].PID != pid || stale[0].Bytes < 1<<20 {
		t.Fatalf("FindStale = %+v, %v; want %s (compare, pid %d, at least 1 MiB)", stale, err, dead, pid)
	}
	user := filepath.Join(dir, "zinf-compare-1-2")
	if err := os.Mkdir(user, 0o755); err != nil {
		t.Fatal(err)
	}

	live, err := swapper.NewRunDir(dir, "tune", quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := os.Lstat(dead); !os.IsNotExist(err) {
		t.Fatalf("NewRunDir left the dead run's %s: %v", dead, err)
	}
	if _, err := os.Stat(user); err != nil {
		t.Fatalf("a user's directory was touched: %v", err)
	}
	if stale, err := swapper.FindStale(dir); err != nil || len(stale) != 0 {
		t.Fatalf("FindStale = %+v, %v; want none (the live run's is held)", stale, err)
	}
	next, err := swapper.NewRunDir(dir, "tune", quiet)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live.Path()); err != nil {
		t.Fatalf("a live run's directory was removed: %v", err)
	}
	p := next.Path()
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Fatalf("Close left %s: %v", p, err)
	}
	if _, err := swapper.NewRunDir(dir, "a/b", quiet); err == nil {
		t.Fatal("a name with a slash was accepted")
	}
}
