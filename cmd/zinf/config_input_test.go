package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConfigNotRegular is the regression for --config (and timeline
// --trace) naming a named pipe: the open blocked forever. Every file that
// is not a regular one is now refused at once, naming what it is, and
// nothing is read or created.
func TestConfigNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Skipf("unix socket: %v", err)
	}
	defer l.Close()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{fifo: "named pipe", sock: "socket", sub: "directory", "/dev/null": "character device"}
	for path, kind := range files {
		for _, args := range [][]string{
			{"train", "--config", path},
			{"plan", "--config", path},
			{"infer", "--config", path},
			{"timeline", "--trace", path, "--out", filepath.Join(dir, "t.svg")},
		} {
			code, out, errs := runChild(t, 0, args...)
			if code != 1 {
				t.Errorf("%q: exit %d, want 1:\nstdout %s\nstderr %s", args, code, out, errs)
				continue
			}
			wantAll(t, fmt.Sprintf("%q stderr", args), errs, path, kind, "not a regular file")
		}
	}
	if got := tree(t, dir); !slices.Equal(got, []string{".", "fifo", "sock", "sub"}) {
		t.Errorf("refused runs left %v", got)
	}
}

// TestSignalWhileBlocked: a command blocked where no context reaches (here
// held at the config's read by a test hook, as an open(2) of a pipe held
// it) still ends at SIGINT or SIGTERM, at once, with 128 + the signal's
// number and a message. The watchdog only catches a hang: the message
// tells the blocked-section exit from the grace period's.
func TestSignalWhileBlocked(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(cfg, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := childCmd(ctx, t, 0, "train", "--config", cfg, "--steps", "1")
		cmd.Env = append(cmd.Env, childBlockAtEnv+"=cmd/zinf/load-config")
		var errb syncBuffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		for !strings.Contains(errb.String(), childBlockedLine) {
			if ctx.Err() != nil {
				cmd.Process.Kill()
				cancel()
				t.Fatalf("the child never reached the config's read:\n%s", errb.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		sent := time.Now()
		if err := cmd.Process.Signal(c.sig); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		took := time.Since(sent)
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%v: the child did not exit:\n%s", c.sig, errb.String())
		}
		if code := cmd.ProcessState.ExitCode(); code != c.code {
			t.Errorf("%v: exit %d (%v), want %d:\n%s", c.sig, code, err, c.code, errb.String())
		}
		wantAll(t, c.sig.String()+" stderr", errb.String(), "zinf train: interrupted by "+c.sig.String(), "while blocked reading a file")
		t.Logf("%v: exited %v after the signal", c.sig, took)
	}
}

// TestSignalAgain: a command that does not return after a signal cancelled
// its context (held in a training step by a test hook, outside any
// blocking section) is ended by a second signal at once.
func TestSignalAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := childCmd(ctx, t, 0, "train", "--steps", "3", "--layers", "2", "--width", "64", "--dir", t.TempDir())
	cmd.Env = append(cmd.Env, childBlockAtEnv+"=train/step")
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(errb.String(), childBlockedLine) {
		if ctx.Err() != nil {
			cmd.Process.Kill()
			t.Fatalf("the child never reached a step:\n%s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 2 {
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	err := cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the child did not exit:\n%s", errb.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d (%v), want 130:\n%s", code, err, errb.String())
	}
	wantAll(t, "stderr", errb.String(), "zinf train: interrupted by interrupt again")
}

// TestRefusedConfigCreatesNothing is the regression for a config refused
// after the bandwidth probe: the probe's cache file stayed in the NVMe
// directory. A pinned pool below the minimum is refused by Open, after the
// probe; a learning rate float32 cannot hold is refused by the config,
// naming the key (it used to reach the optimizer as "Hyper.LR = +Inf").
// Neither leaves anything in the directory.
func TestRefusedConfigCreatesNothing(t *testing.T) {
	for _, c := range []struct {
		name, extra string
		want        []string
	}{
		{"pool too small", `"zinf": {"tiers": {"cpu_pinned_bytes": "1MiB"}}`, []string{"zinf.tiers.cpu_pinned_bytes", "1MiB"}},
		{"lr beyond float32", `"optimizer": {"type": "adam", "params": {"lr": 1e308}}`,
			[]string{"optimizer.params.lr: 1e308 is out of range", "3.4028235e+38"}},
		{"eps below float32", `"optimizer": {"type": "adam", "params": {"eps": 1e-50}}`,
			[]string{"optimizer.params.eps: 1e-50 is out of range", "1.4e-45"}},
		{"beta rounds to 1", `"optimizer": {"type": "adam", "params": {"betas": [0.9, 0.99999999999]}}`,
			[]string{"optimizer.params.betas[1]: 0.99999999999 is out of range"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(t.TempDir(), "c.json")
			body := fmt.Sprintf(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q},
				"offload_optimizer": {"device": "nvme", "nvme_path": %q}}, %s}`, dir, dir, c.extra)
			if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errs := runChild(t, childAS, "train", "--config", cfg, "--steps", "1", "--layers", "2", "--width", "64")
			if code != 1 {
				t.Fatalf("exit %d, want 1:\nstdout %s\nstderr %s", code, out, errs)
			}
			wantAll(t, "stderr", errs, c.want...)
			if strings.Contains(errs, "Hyper.") {
				t.Errorf("stderr names the optimizer's internals, not the config key:\n%s", errs)
			}
			if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
				t.Errorf("the refused run left %v in the NVMe directory", got)
			}
		})
	}
}

// TestNVMePathOnTmpfsWarns: swap files on a RAM filesystem (/dev/shm)
// take the memory offloading is meant to spare; zinf train says so once
// (world size 2: two runtimes on the path), and still runs. A system
// directory is refused before anything is written, naming the key.
func TestNVMePathOnTmpfsWarns(t *testing.T) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm here")
	}
	shm, err := os.MkdirTemp("/dev/shm", "zinf-test-")
	if err != nil {
		t.Skipf("/dev/shm: %v", err)
	}
	defer os.RemoveAll(shm)
	var st unix.Statfs_t
	if unix.Statfs(shm, &st) != nil || st.Type != unix.TMPFS_MAGIC {
		t.Skip("/dev/shm is not tmpfs here")
	}
	t.Setenv("WORLD_SIZE", "2")
	code, _, errs := runCLI(t, "train", "--layers", "2", "--width", "32", "--steps", "1", "--quiet", "--dir", shm)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	if n := strings.Count(errs, "is on tmpfs, which is RAM, not NVMe"); n != 1 {
		t.Errorf("the RAM warning printed %d times, want once:\n%s", n, errs)
	}
	code, _, errs = runCLI(t, "train", "--layers", "2", "--width", "32", "--steps", "1", "--quiet", "--dir", "/etc")
	if code != 1 || !strings.Contains(errs, `nvme_path: "/etc" is a system directory`) {
		t.Errorf("--dir /etc: exit %d, want 1 naming the key and the value:\n%s", code, errs)
	}
}

// TestSignalGrace: a command that does not return after one signal
// cancelled its context (held in a training step by a test hook, outside
// any blocking section) is ended interruptGrace later, with 130 and a
// message saying why. The watchdog only catches a hang.
func TestSignalGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := childCmd(ctx, t, 0, "train", "--steps", "3", "--layers", "2", "--width", "64", "--dir", t.TempDir())
	cmd.Env = append(cmd.Env, childBlockAtEnv+"=train/step")
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(errb.String(), childBlockedLine) {
		if ctx.Err() != nil {
			cmd.Process.Kill()
			t.Fatalf("the child never reached a step:\n%s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the child did not exit:\n%s", errb.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d (%v), want 130:\n%s", code, err, errb.String())
	}
	wantAll(t, "stderr", errb.String(), fmt.Sprintf("zinf train: interrupted by interrupt and still running %v later; exiting now", interruptGrace))
}
