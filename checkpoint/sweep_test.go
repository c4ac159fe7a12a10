package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writerHelperEnv selects the writer helper mode of the test binary: the
// value is "root|name". The helper begins a save of that name (lock file
// and temporary directory, as Save does), prints the temporary directory's
// path, and waits for its standard input to close; then it aborts the
// save as a failed Save would, and exits.
const writerHelperEnv = "ZINF_CHECKPOINT_WRITER_HELPER"

func writerHelper(arg string) int {
	root, name, ok := strings.Cut(arg, "|")
	if !ok {
		fmt.Fprintln(os.Stderr, "bad helper argument", arg)
		return 2
	}
	tx, err := begin(root, name, false, slog.Default())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(tx.tmp, "partial.safetensors"), []byte("half a file"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(tx.tmp)
	io.Copy(io.Discard, os.Stdin)
	tx.abort()
	return 0
}

// startWriterHelper starts a writer process that holds a save of name in
// progress under root and returns its temporary directory. With kill, the
// process is then killed (SIGKILL) and reaped: the directory is a dead
// writer's. Otherwise the returned function ends the writer (it aborts its
// save and exits); it also runs at cleanup.
func startWriterHelper(t *testing.T, root, name string, kill bool) (string, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), writerHelperEnv+"="+root+"|"+name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
		io.Copy(io.Discard, out)
	}()
	var tmp string
	select {
	case tmp = <-line:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the writer helper did not start within 30s; stderr: %s", stderr.String())
	}
	if tmp == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the writer helper failed: %s", stderr.String())
	}
	var done bool
	end := func() {
		if done {
			return
		}
		done = true
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("writer helper: %v: %s", err, stderr.String())
		}
	}
	if kill {
		cmd.Process.Kill()
		cmd.Wait()
		done = true
	}
	t.Cleanup(end)
	return tmp, end
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// The temporary directory of a writer process that was killed is removed
// by the next save, with its lock file; a live writer's is not touched,
// and its writer still finishes (here: aborts) cleanly.
func TestSweepDeadAndLiveWriters(t *testing.T) {
	root := t.TempDir()
	specs := makeSpecs(rand.New(rand.NewPCG(5, 5)), []string{"p.safetensors"}, []int{64 << 10})
	dead, _ := startWriterHelper(t, root, "step-000001", true)
	live, endLive := startWriterHelper(t, root, "step-000002", false)
	for _, p := range []string{dead, dead + lockSuffix, live, live + lockSuffix} {
		if !exists(t, p) {
			t.Fatalf("%s missing before the save:\n%s", p, tree(root))
		}
		if !ownTempDirName(filepath.Base(strings.TrimSuffix(p, lockSuffix))) {
			t.Fatalf("%s is not of the temporary directory shape", p)
		}
	}
	if _, err := Save(context.Background(), filepath.Join(root, "step-000003"), stateOf(3, specs, fromMemory), SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if exists(t, dead) || exists(t, dead+lockSuffix) {
		t.Fatalf("the dead writer's leftovers were not removed:\n%s", tree(root))
	}
	if !exists(t, filepath.Join(live, "partial.safetensors")) || !exists(t, live+lockSuffix) {
		t.Fatalf("the live writer's temporary directory was touched:\n%s", tree(root))
	}
	endLive()
	if exists(t, live) || exists(t, live+lockSuffix) {
		t.Fatalf("the live writer did not clean up after itself:\n%s", tree(root))
	}
	checkReadBack(t, filepath.Join(root, "step-000003"), 0, specs)
	assertNoTemp(t, root)
}

// Nothing the package did not create is removed by a sweep, whatever its
// name: a user's ".tmp-" directory and lock-like file, entries that have
// almost the shape of ours, one of our shape without a lock file or with a
// lock file we did not write, and an unheld lock of a foreign name.
func TestSweepLeavesForeignEntries(t *testing.T) {
	root := t.TempDir()
	specs := makeSpecs(rand.New(rand.NewPCG(6, 6)), []string{"p.safetensors"}, []int{4096})
	write := func(rel, content string) string {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keep := []string{
		write(".tmp-mywork/notes.txt", "work"),
		write(".tmp-mywork.lock", "pid=1\n"),
		write(".tmp-step-000001-0123456789ab/data", "an older layout's name"),
		write(".tmp-step-000001-0123456789ab.lock", "pid=1\n"),
		write(tmpPrefix+"step-000001-0123456789ab/data", "our shape, no lock"),
		write(tmpPrefix+"step-000002-0123456789ab/data", "our shape, a stranger's lock"),
		write(tmpPrefix+"step-000002-0123456789ab.lock", "pid=1\n"),
		write(tmpPrefix+"step-000003-0123456789AB/data", "upper-case hex: not ours"),
		write(tmpPrefix+"step-000003-0123456789AB.lock", lockMagic),
		write(tmpPrefix+"step-000004-0123456789a/data", "11 hex digits: not ours"),
		write(tmpPrefix+"step-000004-0123456789a.lock", lockMagic),
		write(tmpPrefix+"0123456789ab/data", "no name: not ours"),
		write(tmpPrefix+"0123456789ab.lock", lockMagic),
		write(tmpPrefix+"step-000005-0123456789ab.lock.init", ""),
		write(tmpPrefix+"step-000006-0123456789ab", "a file where a directory would be"),
		write(tmpPrefix+"step-000006-0123456789ab.lock", lockMagic),
	}
	// A symlink in place of a lock file is not followed.
	target := write("target.txt", lockMagic)
	if err := os.Mkdir(filepath.Join(root, tmpPrefix+"step-000007-0123456789ab"), 0o755); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, write(tmpPrefix+"step-000007-0123456789ab/data", "lock is a symlink"), target)
	if err := os.Symlink(target, filepath.Join(root, tmpPrefix+"step-000007-0123456789ab.lock")); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, err := Save(context.Background(), filepath.Join(root, "step-000010"), stateOf(10, specs, fromMemory), SaveOptions{Logger: log, KeepLast: 1}); err != nil {
		t.Fatal(err)
	}
	s := NewSaver(SaverOptions{})
	defer s.Close()
	h, err := s.SaveAsync(context.Background(), filepath.Join(root, "step-000011"), stateOf(11, specs, fromMemory), SaveOptions{Logger: log, KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, p := range keep {
		if !exists(t, p) {
			t.Errorf("%s was removed", p)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, ".tmp-mywork/notes.txt")); err != nil || string(b) != "work" {
		t.Errorf("the user's notes: %q, %v", b, err)
	}
	if exists(t, filepath.Join(root, "step-000010")) || !exists(t, filepath.Join(root, "step-000011")) {
		t.Errorf("retention did not keep exactly the last checkpoint:\n%s", tree(root))
	}
	if strings.Contains(logs.String(), "removed") {
		t.Errorf("the sweep says it removed something:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "without a lock file of ours") {
		t.Errorf("the sweep does not mention the lock-less directory of our shape:\n%s", logs.String())
	}
	if t.Failed() {
		t.Log(tree(root))
	}
}

// A lock file whose directory is gone is removed once provably stale: ours
// (the magic line) and unheld; an empty ".init" file (a writer between its
// create and its write) is not.
func TestSweepOrphanLocks(t *testing.T) {
	root := t.TempDir()
	orphan := filepath.Join(root, tmpPrefix+"step-000001-0123456789ab.lock")
	orphanInit := filepath.Join(root, tmpPrefix+"step-000002-0123456789ab.lock.init")
	fresh := filepath.Join(root, tmpPrefix+"step-000003-0123456789ab.lock.init")
	for p, c := range map[string]string{orphan: lockMagic + "pid=1\n", orphanInit: lockMagic, fresh: ""} {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A live one (a retention about to rename its victim) stays.
	_, held, err := lockedTemp(root, "step-000004")
	if err != nil {
		t.Fatal(err)
	}
	defer held.release(true)
	cleanStale(root, slog.Default())
	if !exists(t, held.path) {
		t.Fatal("a held lock file was removed")
	}
	if exists(t, orphan) || exists(t, orphanInit) {
		t.Fatalf("stale lock files of ours were left:\n%s", tree(root))
	}
	if !exists(t, fresh) {
		t.Fatal("an empty .init file was removed")
	}
}

func TestOwnTempNames(t *testing.T) {
	for name, want := range map[string]bool{
		tmpPrefix + "step-000100-0123456789ab":      true,
		tmpPrefix + "del-step-000100-0123456789ab":  true,
		tmpPrefix + "a-b-c-ffffffffffff":            true,
		tmpPrefix + "step-000100-0123456789aB":      false,
		tmpPrefix + "step-000100-0123456789abc":     false,
		tmpPrefix + "step-000100_0123456789ab":      false,
		tmpPrefix + "-0123456789ab":                 false,
		tmpPrefix + ".x-0123456789ab":               false,
		".tmp-step-000100-0123456789ab":             false,
		".tmp-mywork":                               false,
		tmpPrefix + "step-000100-0123456789ab.lock": false,
		"step-000100":                               false,
	} {
		if got := ownTempDirName(name); got != want {
			t.Errorf("ownTempDirName(%q) = %v, want %v", name, got, want)
		}
	}
	for i := 0; i < 20; i++ {
		n, err := tempName("step-000100")
		if err != nil || !ownTempDirName(n) {
			t.Fatalf("tempName made %q (%v), which is not of its own shape", n, err)
		}
	}
}
