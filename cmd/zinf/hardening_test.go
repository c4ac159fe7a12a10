package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
)

// childAS is the data-segment limit of children that are asked for more
// memory than the machine has: enough for the Go runtime and a small run.
const childAS = 2 << 30

// precious makes a file that a planted link points at.
func precious(t *testing.T) (string, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "root-only")
	b := []byte("root's file: zinf must never write here\n")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func unchanged(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s: %v; it holds %q, want the original %q", path, err, got, want)
	}
}

func linkIntact(t *testing.T, link, target string) {
	t.Helper()
	if got, err := os.Readlink(link); err != nil || got != target {
		t.Fatalf("the link %s is %q, %v; want it left pointing at %s", link, got, err, target)
	}
}

// TestIOPlantedSymlink is the reproduction: another user links the
// predictable data file name to a file only root may write, and root runs
// zinf io there. The target must be untouched and the link left in place.
func TestIOPlantedSymlink(t *testing.T) {
	for _, op := range []string{"write", "read"} {
		for _, naive := range []string{"", "--naive"} {
			target, content := precious(t)
			dir := t.TempDir()
			link := filepath.Join(dir, "zinf-io-4194304.dat")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			args := []string{"io", "--path", dir, "--size", "4MiB", "--op", op, "--loops", "1", "--direct", "off"}
			if naive != "" {
				args = append(args, naive)
			}
			code, _, errs := runCLI(t, args...)
			if code != 1 {
				t.Fatalf("%q: exit %d, want 1:\n%s", args, code, errs)
			}
			wantAll(t, "the refusal", errs, link, "symbolic link")
			unchanged(t, target, content)
			linkIntact(t, link, target)
		}
	}
}

// TestIOExistingFile: a regular file of the predictable name that zinf did
// not create is neither overwritten nor removed; a read reuses it read-only.
func TestIOExistingFile(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "zinf-io-4194304.dat")
	content := bytes.Repeat([]byte("someone's data "), 4<<20/15+1)
	if err := os.WriteFile(name, content, 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs := runCLI(t, "io", "--path", dir, "--size", "4MiB", "--op", "write", "--loops", "1", "--direct", "off")
	if code != 1 {
		t.Fatalf("write over an existing file: exit %d:\n%s", code, errs)
	}
	wantAll(t, "the refusal", errs, name, "will not overwrite")
	unchanged(t, name, content)
	code, _, errs = runCLI(t, "io", "--path", dir, "--size", "4MiB", "--op", "read", "--loops", "1", "--direct", "off")
	if code != 0 {
		t.Fatalf("read of an existing file: exit %d:\n%s", code, errs)
	}
	unchanged(t, name, content)
}

// fakeFio writes a stand-in for fio that reports a fixed bandwidth without
// touching the file, so bench-io's own file handling is tested anywhere.
func fakeFio(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fio")
	script := "#!/bin/sh\necho '{\"jobs\":[{\"read\":{\"bw_bytes\":1e9},\"write\":{\"bw_bytes\":1e9}}]}'\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBenchIOPlantedNames: bench-io works in a private directory of its
// own; a link and a file planted at its old fixed name stay as they were
// (before, the link's target was overwritten and the link removed).
func TestBenchIOPlantedNames(t *testing.T) {
	dir := t.TempDir()
	if _, direct, err := aio.ProbeDir(dir, aio.DirectOptional); err != nil || !direct {
		t.Skipf("no O_DIRECT on %s, which the comparison requires", dir)
	}
	target, content := precious(t)
	link := filepath.Join(dir, "zinf-compare-1048576.dat")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	code, _, errs := runCLI(t, "bench-io", "--path", dir, "--size", "1MiB", "--rounds", "1", "--fio", fakeFio(t))
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	unchanged(t, target, content)
	linkIntact(t, link, target)
	if got := tree(t, dir); !slices.Equal(got, []string{".", filepath.Base(link)}) {
		t.Fatalf("bench-io left %v", got)
	}
}

// TestCkptSaveBenchPlantedNames: the checkpoint benchmarks write and remove
// fixed names; in --path they must not touch a link or a directory of
// those names.
func TestCkptSaveBenchPlantedNames(t *testing.T) {
	dir := t.TempDir()
	victimDir := t.TempDir()
	keep := filepath.Join(victimDir, "keep")
	if err := os.WriteFile(keep, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "zinf-savebench-warmup")
	if err := os.Symlink(victimDir, link); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(dir, "zinf-savebench-naive")
	if err := os.Mkdir(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mine, "data"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := tree(t, dir)
	code, _, errs := runCLI(t, "ckpt", "save-bench", "--path", dir, "--size", "1MiB", "--staging-bytes", "256KiB", "--naive")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	if got := tree(t, dir); !slices.Equal(got, before) {
		t.Fatalf("--path holds %v after save-bench, want %v", got, before)
	}
	linkIntact(t, link, victimDir)
	if got := tree(t, victimDir); !slices.Equal(got, []string{".", "keep"}) {
		t.Fatalf("the link's target holds %v", got)
	}
	unchanged(t, filepath.Join(mine, "data"), []byte("mine"))
}

// TestSizesBeyondMemory: sizes on the command line are checked against
// MemAvailable and the free disk space before anything is allocated, with
// an error naming the flag, the value and the limit. Each runs in a child
// limited to childAS bytes of data segment, so a regression fails there.
func TestSizesBeyondMemory(t *testing.T) {
	avail, ok := memAvailable()
	if !ok {
		t.Skip("no MemAvailable in /proc/meminfo")
	}
	tooBig := strconv.FormatInt(4*avail/(1<<20)*(1<<20), 10)
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"io", "--path", dir, "--size", tooBig, "--direct", "off"}, []string{"--size", "MemAvailable"}},
		{[]string{"io", "--path", dir, "--size", tooBig, "--naive", "--op", "write", "--direct", "off"}, []string{"--size", "MemAvailable"}},
		{[]string{"tune", "--path", dir, "--size", tooBig, "--direct", "off"}, []string{"--size", "MemAvailable"}},
		{[]string{"bench-io", "--path", dir, "--size", tooBig, "--fio", "/bin/true"}, []string{"--size", "MemAvailable"}},
		{[]string{"ckpt", "save-bench", "--path", dir, "--size", "1PiB"}, []string{"--size 1PiB", "free"}},
		{[]string{"ckpt", "bench", "--path", dir, "--size", "1PiB"}, []string{"--size 1PiB", "free"}},
		{[]string{"ckpt", "save-bench", "--path", dir, "--size", "1MiB", "--staging-bytes", "1GiB", "--staging-buffers", "1024", "--parallel", "256"}, []string{"--staging-bytes 1GiB", "MemAvailable"}},
		{[]string{"train", "--layers", "1000000000"}, []string{"--layers 1000000000", "allowed: 1.."}},
		{[]string{"infer", "--layers", "1000000000"}, []string{"--layers 1000000000", "allowed: 1.."}},
		{[]string{"train", "--width", "1048576"}, []string{"--width 1MiB", "MemAvailable"}},
		{[]string{"infer", "--width", "2000000000"}, []string{"--width 2000000000", "allowed: 1.."}},
		{[]string{"train", "--batch", "0"}, []string{"--batch 0", "allowed: 1.."}},
		// 2.75e11 parameters: one layer fits, the checkpoints do not.
		{[]string{"train", "--layers", "1048576", "--checkpoint-dir", filepath.Join(dir, "ck"), "--checkpoint-every", "1", "--checkpoint-async"},
			[]string{"--checkpoint-async needs", "MemAvailable", "--checkpoint-dir " + filepath.Join(dir, "ck") + " needs", "free on"}},
		{[]string{"plan", "--config", "/dev/zero"}, []string{"/dev/zero", "character device", "not a regular file"}},
		{[]string{"train", "--config", "/dev/zero"}, []string{"/dev/zero", "character device", "not a regular file"}},
	} {
		code, out, errs := runChild(t, childAS, c.args...)
		if code != 1 {
			t.Errorf("%q: exit %d, want 1:\nstdout %s\nstderr %s", c.args, code, out, errs)
			continue
		}
		wantAll(t, fmt.Sprintf("%q", c.args), errs, c.want...)
	}
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("refused runs left %v", got)
	}
}

// TestZeroIsNotDefault: every command refuses 0 (and negative values) for
// counts and sizes, naming the flag and the allowed range, instead of
// running a default.
func TestZeroIsNotDefault(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench-io", "--path", dir, "--size", "0", "--fio", "/bin/true"}, "--size 0 is invalid (allowed:"},
		{[]string{"bench-io", "--path", dir, "--rounds", "0", "--fio", "/bin/true"}, "--rounds 0 is invalid (allowed: 1..1000)"},
		{[]string{"bench-io", "--path", dir, "--queue-depth", "0", "--fio", "/bin/true"}, "--queue-depth 0 is invalid (allowed: 1.."},
		{[]string{"bench-io", "--path", dir, "--block-size", "0", "--fio", "/bin/true"}, "--block-size 0 is invalid (allowed:"},
		{[]string{"ckpt", "save-bench", "--path", dir, "--staging-buffers", "0"}, "--staging-buffers 0 is invalid (allowed: 1..1024)"},
		{[]string{"ckpt", "save-bench", "--path", dir, "--parallel", "0"}, "--parallel 0 is invalid (allowed: 1..256)"},
		{[]string{"ckpt", "save-bench", "--path", dir, "--size", "0"}, "--size 0 is invalid (allowed:"},
		{[]string{"ckpt", "bench", "--path", dir, "--size", "0"}, "--size 0 is invalid (allowed:"},
		{[]string{"ckpt", "bench", "--path", dir, "--rounds", "0"}, "--rounds 0 is invalid"},
		{[]string{"ckpt", "bench", "--path", dir, "--io-queue-depth", "0"}, "--io-queue-depth 0 is invalid"},
		{[]string{"ckpt", "bench", "--path", dir, "--io-parallel", "-1"}, "--io-parallel -1 is invalid (allowed: 0.."},
		{[]string{"io", "--path", dir, "--gpu", "--bounce-block", "0"}, "--bounce-block 0 is invalid"},
		{[]string{"io", "--path", dir, "--loops", "0"}, "--loops 0 is invalid"},
		{[]string{"tune", "--path", dir, "--loops", "0"}, "--loops 0 is invalid"},
		{[]string{"train", "--steps", "0"}, "--steps 0 is invalid"},
		{[]string{"infer", "--batches", "0"}, "--batches 0 is invalid"},
	} {
		code, _, errs := runCLI(t, c.args...)
		if code != 1 || !strings.Contains(errs, c.want) {
			t.Errorf("%q: exit %d, want 1 and %q:\n%s", c.args, code, c.want, errs)
		}
	}
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("refused runs left %v", got)
	}
}

// TestComputeMsPerLayer: NaN, infinities and negative values are refused
// by name (NaN used to print a negative step time of -1.8e10 seconds).
func TestComputeMsPerLayer(t *testing.T) {
	for _, cmd := range []string{"train", "infer", "plan"} {
		for _, v := range []string{"NaN", "Inf", "-Inf", "-1", "1e300"} {
			code, out, errs := runCLI(t, cmd, "--compute-ms-per-layer", v)
			if code != 1 || !strings.Contains(errs, "--compute-ms-per-layer") || out != "" {
				t.Errorf("%s --compute-ms-per-layer %s: exit %d, stdout %q, stderr %q; want 1 and the flag named", cmd, v, code, out, errs)
			}
		}
	}
}

// TestInterruptExitCode: SIGINT during a run exits 130 (128 + SIGINT), as
// a shell expects of an interrupted command, not 1.
func TestInterruptExitCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := childCmd(ctx, t, 0, "io", "--path", t.TempDir(), "--size", "4MiB", "--op", "write", "--loops", "1000000", "--direct", "off")
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(errb.String(), "loop 1/") {
		if ctx.Err() != nil {
			cmd.Process.Kill()
			t.Fatalf("no progress before the deadline:\n%s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("exit %d (%v) after SIGINT, want 130:\n%s", code, err, errb.String())
	}
	wantAll(t, "stderr", errb.String(), "interrupted")
}

// TestQueueDepthDefault: zinf io measures the queue depth training runs
// with: the engine's default, which the config's default matches.
func TestQueueDepthDefault(t *testing.T) {
	fs := newFlags("io", &bytes.Buffer{})
	var e engineFlags
	e.register(fs)
	got := fs.Lookup("queue-depth").DefValue
	want := strconv.Itoa(config.Default().AIO.QueueDepth)
	if got != want || got != strconv.Itoa(aio.DefaultQueueDepth) {
		t.Fatalf("--queue-depth defaults to %s; the config's default is %s and the engine's %d", got, want, aio.DefaultQueueDepth)
	}
	code, _, errs := runCLI(t, "bench-io", "-h")
	if code != 0 || !strings.Contains(errs, fmt.Sprintf("queue depth for both tools (default %d)", aio.DefaultQueueDepth)) {
		t.Fatalf("bench-io -h does not show the default queue depth %d:\n%s", aio.DefaultQueueDepth, errs)
	}
}

// TestLogOnce: the one CLI logger prints in slog's text format and prints
// a warning repeated word for word once (the buffered-I/O fallback on ramfs
// used to print three times, once per engine opened there).
func TestLogOnce(t *testing.T) {
	var b bytes.Buffer
	log := cliLogger(&b)
	for range 3 {
		log.Warn("aio: filesystem refuses O_DIRECT; falling back to buffered I/O", "dir", "/mnt/ram", "fs", "ramfs")
		log.With("engine", "uring").Warn("same words, other engine")
	}
	log.Warn("aio: filesystem refuses O_DIRECT; falling back to buffered I/O", "dir", "/mnt/other", "fs", "ramfs")
	log.Info("not shown")
	out := b.String()
	if n := strings.Count(out, "dir=/mnt/ram "); n != 1 {
		t.Errorf("the repeated warning printed %d times, want once:\n%s", n, out)
	}
	for _, want := range []string{"level=WARN", "dir=/mnt/other", "engine=uring"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "engine=uring") != 1 || strings.Contains(out, "not shown") {
		t.Errorf("unexpected lines:\n%s", out)
	}
}

// TestRamfsWarnsOnce: zinf train on ramfs (no O_DIRECT) at world size 2
// prints the buffered-I/O fallback warning once: it printed once per swap
// store and rank, each store's run directory being another directory of
// the same filesystem.
func TestRamfsWarnsOnce(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount ramfs here: %v", err)
	}
	defer unix.Unmount(dir, 0)
	t.Setenv("WORLD_SIZE", "2")
	code, _, errs := runCLI(t, "train", "--layers", "2", "--width", "32", "--steps", "1", "--quiet", "--dir", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	if n := strings.Count(errs, "refuses O_DIRECT"); n != 1 {
		t.Fatalf("the fallback warning printed %d times, want once:\n%s", n, errs)
	}
}

// TestCkptSaveBenchKeepsUserTmp is issue 13's data-loss reproduction:
// mkdir -p P/.tmp-mywork; echo work > P/.tmp-mywork/notes.txt; zinf ckpt
// save-bench --path P --size 8MiB removed the user's notes as "a stale
// temporary directory". They must survive, with an unlocked lock-like
// file of the user's next to them.
func TestCkptSaveBenchKeepsUserTmp(t *testing.T) {
	p := t.TempDir()
	notes := filepath.Join(p, ".tmp-mywork", "notes.txt")
	if err := os.MkdirAll(filepath.Dir(notes), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notes, []byte("work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lockish := filepath.Join(p, ".tmp-mywork.lock")
	if err := os.WriteFile(lockish, []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := tree(t, p)
	code, _, errs := runCLI(t, "ckpt", "save-bench", "--path", p, "--size", "8MiB", "--staging-bytes", "1MiB")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	unchanged(t, notes, []byte("work\n"))
	unchanged(t, lockish, []byte("mine\n"))
	if got := tree(t, p); !slices.Equal(got, before) {
		t.Fatalf("--path holds %v after save-bench, want %v", got, before)
	}
	if strings.Contains(errs, "removed") {
		t.Fatalf("save-bench says it removed something:\n%s", errs)
	}
}
