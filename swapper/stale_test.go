package swapper_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// staleChildEnv names the swap path a child process opens a store in
// (TestStaleChildProcess); the child then waits to be killed.
const staleChildEnv = "ZINF_SWAPPER_STALE_CHILD"

// TestStaleChildProcess is the child of startDeadRun, not a test by
// itself: it opens a store, writes a tensor, says "ready" and sleeps until
// killed.
func TestStaleChildProcess(t *testing.T) {
	dir := os.Getenv(staleChildEnv)
	if dir == "" {
		t.Skip("runs only as the child of a crash test")
	}
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "param-rank0", Logger: quiet})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 4 << 20, Logger: quiet})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	b, err := pool.Acquire(context.Background(), 1<<20, buffers.PurposeStaging)
	if err == nil {
		err = s.Write(context.Background(), "w", b.Bytes()[:1<<20])
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// startDeadRun runs a child process that opens a store in dir and writes
// 1 MiB, kills it with SIGKILL once it is ready, and returns its pid.
func startDeadRun(t *testing.T, dir string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStaleChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), staleChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child did not get ready (watchdog or failure): %q, %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	return cmd.Process.Pid
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestStaleRunIsFoundAndRemoved(t *testing.T) {
	dir := t.TempDir()
	pid := startDeadRun(t, dir)
	left := entries(t, dir)
	if len(left) != 1 || !strings.HasPrefix(left[0], fmt.Sprintf("zinf-param-rank0-%d-", pid)) {
		t.Fatalf("the killed run should have left its directory: %v", left)
	}
	deadDir := filepath.Join(dir, left[0])

	// Things that are not a dead run's: a live store, a user directory of
	// the same name shape without a lock, one whose lock is not ours, and
	// a symlink to the dead run.
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	live, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "optim-rank0", KeepStale: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	user := filepath.Join(dir, "zinf-param-rank0-1-2")
	foreign := filepath.Join(dir, "zinf-grad-rank0-3-4")
	for _, d := range []string{user, foreign} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "notes.txt"), []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(foreign, "zinf-swap.lock"), []byte("something else\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(deadDir, filepath.Join(dir, "zinf-param-rank0-5-6")); err != nil {
		t.Fatal(err)
	}

	stale, err := swapper.FindStale(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0].Dir != deadDir || stale[0].PID != pid || stale[0].Name != "param-rank0" || stale[0].Bytes < 1<<20 {
		t.Fatalf("FindStale = %+v; want only %s (pid %d, at least 1 MiB)", stale, deadDir, pid)
	}
	if host, _ := os.Hostname(); host != "" && stale[0].Host != host {
		t.Errorf("host %q, want %q", stale[0].Host, host)
	}

	// KeepStale reports and keeps.
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	kept, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, KeepStale: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	kept.Close()
	if _, err := os.Stat(deadDir); err != nil || !strings.Contains(logs.String(), deadDir) || !strings.Contains(logs.String(), "kept") {
		t.Fatalf("KeepStale: dir %v, log:\n%s", err, logs.String())
	}

	// By default the dead run's directory goes, with one line naming it
	// and its size; everything else stays.
	logs.Reset()
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Lstat(deadDir); !os.IsNotExist(err) {
		t.Fatalf("dead run's directory still there: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "removed") || !strings.Contains(lines[0], "path="+deadDir) ||
		!strings.Contains(lines[0], fmt.Sprintf("bytes=%d", stale[0].Bytes)) || !strings.Contains(lines[0], fmt.Sprintf("pid=%d", pid)) {
		t.Fatalf("want one log line naming %s and %d bytes:\n%s", deadDir, stale[0].Bytes, logs.String())
	}
	for _, d := range []string{user, foreign} {
		if data, err := os.ReadFile(filepath.Join(d, "notes.txt")); err != nil || string(data) != "mine" {
			t.Fatalf("%s was touched: %v", d, err)
		}
	}
	for _, d := range append(live.Paths(), s.Paths()...) {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("a live store's directory is gone: %v", err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "zinf-param-rank0-5-6")); err != nil {
		t.Fatalf("the symlink was removed: %v", err)
	}
	for _, name := range entries(t, dir) {
		if strings.Contains(name, fmt.Sprintf("-%d-", pid)) {
			t.Fatalf("something of the dead run is left: %s", name)
		}
	}
	if again, err := swapper.FindStale(dir); err != nil || len(again) != 0 {
		t.Fatalf("after cleanup FindStale = %+v, %v", again, err)
	}
}

func TestFindStaleLeavesLiveStores(t *testing.T) {
	dir := t.TempDir()
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	a, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "a", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	b, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "b", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := os.Stat(a.Paths()[0]); err != nil {
		t.Fatalf("opening b removed live store a's directory: %v", err)
	}
	if st, err := swapper.FindStale(dir); err != nil || len(st) != 0 {
		t.Fatalf("live stores reported stale: %+v, %v", st, err)
	}
	a.Close()
	if st, err := swapper.FindStale(dir); err != nil || len(st) != 0 {
		t.Fatalf("a closed store leaves nothing: %+v, %v", st, err)
	}
	if st, err := swapper.FindStale(filepath.Join(dir, "missing")); err != nil || st != nil {
		t.Fatalf("missing path: %+v, %v", st, err)
	}
}

// TestIncompleteRunDirs: a process killed between making a run directory
// and its lock file leaves an empty directory (older zinf: under the final
// name; now: under the temporary ".zinf-init-" name), or one holding only
// the lock file being written, or a complete lock under the temporary
// name. Once older than IncompleteGrace, FindStale lists each (zinf doctor
// counts them) and the next OpenStore removes them; a young one (maybe
// being made by a live process), one whose lock being written is held,
// one holding anything else, and directories of other names are kept.
func TestIncompleteRunDirs(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-2 * swapper.IncompleteGrace)
	mk := func(name string, files map[string]string, mtime time.Time) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		for f, data := range files {
			if err := os.WriteFile(filepath.Join(p, f), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const lock = "zinf swap store lock v1\npid=999999 host=%s started=2026-01-01T00:00:00Z\n"
	host, _ := os.Hostname()
	gone := []string{
		mk("zinf-act-rank0-999999-11", nil, old),                                                                      // empty, final name
		mk(".zinf-init-act-rank0-999999-12", nil, old),                                                                // empty, being made
		mk(".zinf-init-act-rank0-999999-13", map[string]string{"zinf-swap.lock.init": ""}, old),                       // its lock being written
		mk(".zinf-init-kv-rank0-999999-14", map[string]string{"zinf-swap.lock": fmt.Sprintf(lock, host)}, time.Now()), // locked, not yet renamed
	}
	kept := []string{
		mk("zinf-act-rank0-999999-21", nil, time.Now()),                           // young: maybe being made
		mk("zinf-act-rank0-999999-22", map[string]string{"data": "x"}, old),       // holds something else
		mk(".zinf-init-act-rank0-999999-23", map[string]string{"other": ""}, old), // holds something else
		mk("zinf-act", nil, old),            // not a run directory's name
		mk("zinf-act-rank0-x-24", nil, old), // not a run directory's name
		mk(".zinf-init-act-rank0-999999-25", map[string]string{"zinf-swap.lock.init": ""}, old), // held below: its maker is alive
	}
	held, err := os.Open(filepath.Join(kept[5], "zinf-swap.lock.init"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(kept[5], old, old); err != nil {
		t.Fatal(err)
	}

	stale, err := swapper.FindStale(dir)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, r := range stale {
		found = append(found, r.Dir)
		if wantIncomplete := r.Dir != gone[3]; r.Incomplete != wantIncomplete || r.PID != 999999 {
			t.Errorf("FindStale: %+v: want Incomplete %v, PID 999999", r, wantIncomplete)
		}
	}
	wantFound := append([]string(nil), gone...)
	slices.Sort(wantFound)
	slices.Sort(found)
	if !slices.Equal(found, wantFound) {
		t.Fatalf("FindStale lists %v, want %v", found, wantFound)
	}

	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "act-rank0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, p := range gone {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("OpenStore kept %s, which a killed run left", p)
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("OpenStore removed %s: %v", p, err)
		}
	}
	// The store's own directory is complete under its final name, and
	// nothing is left under a temporary one.
	own := s.Paths()[0]
	if !strings.HasPrefix(filepath.Base(own), fmt.Sprintf("zinf-act-rank0-%d-", os.Getpid())) {
		t.Errorf("store directory %s", own)
	}
	if _, err := os.Lstat(filepath.Join(own, "zinf-swap.lock")); err != nil {
		t.Errorf("the store's directory has no lock file: %v", err)
	}
	for _, n := range entries(t, dir) {
		if strings.HasPrefix(n, ".zinf-init-") && !slices.Contains([]string{filepath.Base(kept[2]), filepath.Base(kept[5])}, n) {
			t.Errorf("a temporary directory %s is left", n)
		}
	}
}
