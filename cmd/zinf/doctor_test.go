package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"

	"github.com/zinfio/zinf/internal/base/blockdev"
)

type doctorCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func TestDoctorJSON(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "doctor", "--path", dir, "--path", "/nonexistent", "--json")
	if code == 0 || !strings.Contains(errs, "unusable swap path(s): /nonexistent") {
		t.Fatalf("an unusable path must make the exit code non-zero, naming it: exit %d:\n%s", code, errs)
	}
	if code, _, errs := runCLI(t, "doctor", "--path", dir, "--json"); code != 0 {
		t.Fatalf("usable path: exit %d:\n%s", code, errs)
	}
	var rep struct {
		Checks []doctorCheck `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	byName := map[string]doctorCheck{}
	for _, c := range rep.Checks {
		byName[c.Name] = c
	}
	get := func(name string) doctorCheck {
		t.Helper()
		c, ok := byName[name]
		if !ok {
			t.Fatalf("no %q check in %s", name, out)
		}
		return c
	}

	for _, b := range []string{"uring", "libaio", "posix"} {
		c := get("backend " + b)
		if c.OK != (aio.Available(b) == nil) || (!c.OK && c.Detail == "") {
			t.Errorf("backend %s: %+v", b, c)
		}
	}
	align, direct, err := aio.ProbeDir(dir, aio.DirectOptional)
	if err != nil {
		t.Fatal(err)
	}
	p := get("path " + dir)
	if direct && (!p.OK || !strings.Contains(p.Detail, "O_DIRECT yes") || !strings.Contains(p.Detail, fmt.Sprintf("alignment %d bytes", align))) {
		t.Errorf("path %s: %+v, want O_DIRECT yes, alignment %d", dir, p, align)
	}
	if !direct && !strings.Contains(p.Detail, "O_DIRECT no") {
		t.Errorf("path %s without O_DIRECT: %+v", dir, p)
	}
	if m := get("path /nonexistent"); m.OK || !strings.Contains(m.Detail, "no such file or directory") {
		t.Errorf("missing path: %+v, want a clear failure", m)
	}
	if m := get("memlock"); m.Detail == "" {
		t.Errorf("memlock: %+v", m)
	}
	if s := get("system"); !strings.Contains(s.Detail, fmt.Sprintf("%d CPUs", runtime.NumCPU())) {
		t.Errorf("system: %+v, want the CPU count", s)
	}
	for _, name := range []string{"cuda", "cufile"} {
		c := get(name)
		if c.OK {
			t.Logf("%s available on this machine: %s", name, c.Detail)
			continue
		}
		if len(c.Detail) < 20 {
			t.Errorf("%s unavailable without a reason: %+v", name, c)
		}
	}
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("doctor left %v in the path it probed", got)
	}
}

func TestDoctorText(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "doctor", "--path", dir, "--path", "/nonexistent")
	if code != 1 {
		t.Fatalf("exit %d, want 1 for an unusable path:\n%s", code, errs)
	}
	wantAll(t, "report", out, "backend posix", "memlock", "path "+dir, "no   path /nonexistent", "cuda", "cufile")
	if code, _, errs := runCLI(t, "doctor", "stray"); code == 0 || !strings.Contains(errs, "unexpected arguments") {
		t.Fatalf("stray argument: exit %d:\n%s", code, errs)
	}
}

const doctorChildEnv = "ZINF_DOCTOR_CHILD_SWAP_PATH"

// TestDoctorChildStore is the child of TestDoctorStaleSwapSpace, not a
// test by itself: it opens a swap store, writes, says "ready" and sleeps
// until killed.
func TestDoctorChildStore(t *testing.T) {
	dir := os.Getenv(doctorChildEnv)
	if dir == "" {
		t.Skip("runs only as the child of TestDoctorStaleSwapSpace")
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err == nil {
		var s *swapper.Store
		s, err = swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Name: "optim-rank0", Logger: quiet})
		if err == nil {
			var pool *buffers.Pool
			pool, err = buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Logger: quiet})
			if err == nil {
				var b *buffers.Buffer
				if b, err = pool.Acquire(context.Background(), 1<<20, buffers.PurposeStaging); err == nil {
					err = s.Write(context.Background(), "m", b.Bytes()[:1<<20])
				}
			}
		}
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// TestDoctorStaleSwapSpace: after a zinf process holding a swap store is
// SIGKILLed, `zinf doctor` lists what it left (path, pid, bytes) without
// failing; once a new store has opened in the path, nothing is listed.
func TestDoctorStaleSwapSpace(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDoctorChildStore$", "-test.count=1")
	cmd.Env = append(os.Environ(), doctorChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(pipe).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child not ready (failed, or the watchdog fired): %q, %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	pid := cmd.Process.Pid

	code, out, errs := runCLI(t, "doctor", "--path", dir, "--json")
	if code != 0 {
		t.Fatalf("stale swap space alone must not fail doctor: exit %d\n%s", code, errs)
	}
	var rep struct {
		Checks []struct {
			Name   string `json:"name"`
			OK     bool   `json:"ok"`
			Detail string `json:"detail"`
			Stale  []struct {
				Dir   string `json:"dir"`
				PID   int    `json:"pid"`
				Bytes int64  `json:"bytes"`
			} `json:"stale"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	found := false
	for _, c := range rep.Checks {
		if c.Name != "stale "+dir {
			continue
		}
		found = true
		if c.OK || len(c.Stale) != 1 || c.Stale[0].PID != pid || c.Stale[0].Bytes < 1<<20 || !strings.HasPrefix(filepath.Base(c.Stale[0].Dir), fmt.Sprintf("zinf-optim-rank0-%d-", pid)) {
			t.Fatalf("stale check %+v: want the killed run (pid %d) and its bytes", c, pid)
		}
	}
	if !found {
		t.Fatalf("no stale check for %s:\n%s", dir, out)
	}
	if _, text, _ := runCLI(t, "doctor", "--path", dir); !strings.Contains(text, "no   stale "+dir) || !strings.Contains(text, fmt.Sprintf("pid %d", pid)) {
		t.Fatalf("text report does not list the stale run:\n%s", text)
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: e, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, text, _ := runCLI(t, "doctor", "--path", dir); !strings.Contains(text, "ok   stale "+dir) {
		t.Fatalf("after a new store cleaned the path, doctor still lists stale space:\n%s", text)
	}
}

// TestDoctorEndurance: per disk under the paths, doctor reports what it
// wrote since boot and per day, and with --tbw what share of the rating a
// day at that rate spends; a tmpfs path has no disk, which it says.
func TestDoctorEndurance(t *testing.T) {
	dir := t.TempDir()
	d, derr := blockdev.Of(dir)
	code, out, errs := runCLI(t, "doctor", "--path", dir, "--path", "/dev/shm", "--tbw", "600TB")
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out, errs)
	}
	wantAll(t, "doctor", out, "endurance /dev/shm", "no block device")
	if derr != nil {
		t.Skipf("no disk under %s: %v", dir, derr)
	}
	wantAll(t, "doctor", out, "endurance "+d.Name, "disk "+d.Name+" (paths "+dir+")", "written since boot", "per day", "of the 600 TB endurance rating")
	_, out, _ = runCLI(t, "doctor", "--path", dir)
	wantAll(t, "doctor without --tbw", out, "give the drive's endurance rating (--tbw")
	if code, _, errs := runCLI(t, "doctor", "--tbw", "x"); code == 0 || !strings.Contains(errs, "-tbw") {
		t.Fatalf("--tbw x: exit %d %s", code, errs)
	}
}

// TestToolsSweepDeadRuns: each tool that keeps data files in --path
// (bench-io, tune, ckpt bench, bench-scale's probe) SIGKILLed right after
// making its directory leaves it; zinf doctor counts it, naming the tool
// and the dead pid, and the tool's next run removes it and leaves nothing
// of its own. Each used to leave zinf-compare-N/ (257 MB at --size
// 256MiB), zinf-tune-N/, zinf-ckpt-bench-N/ or zinf-bench-scale-probe-N/
// for good, with doctor saying nothing was left.
func TestToolsSweepDeadRuns(t *testing.T) {
	for _, c := range []struct {
		name, kind string
		args       func(dir string) []string
		direct     bool
	}{
		{"compare", "zinf bench-io", func(dir string) []string {
			return []string{"bench-io", "--path", dir, "--size", "1MiB", "--rounds", "1", "--fio", fakeFio(t)}
		}, true},
		{"tune", "zinf tune", func(dir string) []string {
			return append([]string{"tune", "--path", dir, "--bandwidth-file", filepath.Join(t.TempDir(), "bw.json")}, tinyGrid...)
		}, false},
		{"ckpt-bench", "zinf ckpt bench", func(dir string) []string {
			return []string{"ckpt", "bench", "--path", dir, "--size", "2MiB", "--rounds", "1", "--staging-bytes", "1MiB", "--no-fio"}
		}, true},
		{"bench-scale-probe", "zinf bench-scale's probe", func(dir string) []string {
			return []string{"bench-scale", "--path", dir, "--state", "4MiB", "--pool", "16MiB", "--width", "64", "--steps", "1", "--probe-size", "1MiB"}
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, direct, err := aio.ProbeDir(dir, aio.DirectOptional); c.direct && (err != nil || !direct) {
				t.Skipf("no O_DIRECT on %s, which the tool requires", dir)
			}
			args := c.args(dir)
			code, _, errs := runChildEnv(t, []string{childKillAtEnv + "=swapper/run-dir:1"}, args...)
			if code != -1 {
				t.Fatalf("%q was to be killed making its directory: exit %d\n%s", args, code, errs)
			}
			var left []string
			for _, n := range tree(t, dir) {
				if strings.HasPrefix(n, "zinf-"+c.name+"-") && !strings.Contains(n, "/") {
					left = append(left, filepath.Join(dir, n))
				}
			}
			if len(left) != 1 {
				t.Fatalf("the killed run left %v in %s, want one zinf-%s-PID-N directory", tree(t, dir), dir, c.name)
			}
			_, out, _ := runCLI(t, "doctor", "--path", dir)
			if !strings.Contains(out, "no   stale "+dir) || !strings.Contains(out, left[0]) || !strings.Contains(out, c.kind) {
				t.Fatalf("doctor does not count %s (left by %s):\n%s", left[0], c.kind, out)
			}
			code, _, errs = runCLI(t, args...)
			if code != 0 {
				t.Fatalf("the next run: exit %d\n%s", code, errs)
			}
			if _, err := os.Lstat(left[0]); !os.IsNotExist(err) {
				t.Fatalf("the next run left the dead run's %s: %v", left[0], err)
			}
			for _, n := range tree(t, dir) {
				if strings.HasPrefix(n, "zinf-") {
					t.Fatalf("%s holds %s after the next run", dir, n)
				}
			}
			if _, out, _ = runCLI(t, "doctor", "--path", dir); !strings.Contains(out, "ok   stale "+dir) {
				t.Fatalf("doctor after the sweep:\n%s", out)
			}
		})
	}
}
