package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/swapper"
)

// killedChildEnv names the directory TestKilledRunDirChild makes its run
// directory in.
const killedChildEnv = "ZINF_GENERATE_KILLED_CHILD"

// TestKilledRunDirChild is the child of TestKilledRunSwept, not a test by
// itself: it makes its scratch directory as a run without --dir does, opens
// a swap store in it, says "ready" and sleeps until killed.
func TestKilledRunDirChild(t *testing.T) {
	parent := os.Getenv(killedChildEnv)
	if parent == "" {
		t.Skip("runs only as the child of TestKilledRunSwept")
	}
	t.Setenv("TMPDIR", parent)
	quiet := slog.New(slog.DiscardHandler)
	cfg, _, err := loadConfig(options{})
	if err == nil {
		var e aio.Engine
		if e, err = aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet}); err == nil {
			_, err = swapper.OpenStore(swapper.StoreOptions{Paths: cfg.NVMePaths(), Engine: e, Name: "param-rank0", Logger: quiet})
		}
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// TestKilledRunSwept: a run without --dir killed with SIGKILL leaves its
// scratch directory with the swap stores in it; the next run removes it,
// and keeps a live run's directory and directories zinf did not make
// (the names of older versions' unlocked scratch directories included).
func TestKilledRunSwept(t *testing.T) {
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKilledRunDirChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killedChildEnv+"="+tmp)
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
	dead, _ := filepath.Glob(filepath.Join(tmp, fmt.Sprintf("zinf-generate-%d-*", cmd.Process.Pid)))
	if len(dead) != 1 {
		t.Fatalf("the killed run left %v", dead)
	}
	if inner, _ := filepath.Glob(filepath.Join(dead[0], "zinf-param-rank0-*")); len(inner) != 1 {
		t.Fatalf("the killed run's directory holds %v, want its swap store", inner)
	}

	t.Setenv("TMPDIR", tmp)
	live, err := swapper.NewRunDir(tmp, "generate", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	foreign := []string{filepath.Join(tmp, "zinf-generate-123456"), filepath.Join(tmp, "mine")}
	for _, d := range foreign {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}

	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"--model", "vocab=256,dim=32,layers=2", "--prompt", "a", "--max-new-tokens", "1"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
	}
	if _, err := os.Lstat(dead[0]); !os.IsNotExist(err) {
		t.Errorf("the next run kept the killed run's directory %s: %v", dead[0], err)
	}
	for _, d := range append(foreign, live.Path()) {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("the next run removed %s: %v", d, err)
		}
	}
	left, _ := os.ReadDir(tmp)
	if len(left) != 3 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("left in TMPDIR: %v, want the live run's and the two foreign directories", names)
	}
}
