package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/testhook"
)

// Environment switches that turn the test binary into the zinf command
// itself, so that tests can run it as a separate process: under an
// data-segment limit (a regression that allocates what the flags ask for
// then fails that child, not the machine), or to send it a signal.
const (
	childArgsEnv  = "ZINF_TEST_CHILD_ARGS"
	childLimitEnv = "ZINF_TEST_CHILD_DATA_LIMIT"
	// childKillAtEnv ("point:n") makes the child SIGKILL itself at the
	// nth time its work reaches the internal/testhook point: a crash
	// aimed at a phase (a checkpoint's commit, a step's backward). The
	// zinf binary never reads it: only this test binary, in child mode.
	childKillAtEnv = "ZINF_TEST_KILL_AT"
	// childHitsEnv names a file where the child writes, as it exits, how
	// often it reached each point (JSON), so a test knows the range to
	// aim kills at.
	childHitsEnv = "ZINF_TEST_HITS"
)

func TestMain(m *testing.M) {
	if v := os.Getenv(childArgsEnv); v != "" {
		var args []string
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			os.Stderr.WriteString("bad " + childArgsEnv + ": " + err.Error() + "\n")
			os.Exit(3)
		}
		if l := os.Getenv(childLimitEnv); l != "" {
			n, err := strconv.ParseUint(l, 10, 64)
			if err == nil {
				err = unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: n, Max: n})
			}
			if err != nil {
				os.Stderr.WriteString("setting the data-segment limit: " + err.Error() + "\n")
				os.Exit(3)
			}
		}
		hits, err := installKillHook(os.Getenv(childKillAtEnv))
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(3)
		}
		code := run(args, os.Stdout, os.Stderr)
		if p := os.Getenv(childHitsEnv); p != "" {
			b, _ := json.Marshal(hits.snapshot())
			if err := os.WriteFile(p, b, 0o644); err != nil {
				os.Stderr.WriteString("writing the hit counts: " + err.Error() + "\n")
				os.Exit(3)
			}
		}
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// hitCounter counts how often each testhook point was reached.
type hitCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *hitCounter) snapshot() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.n)
}

// installKillHook counts every testhook point the child reaches and, when
// spec is "point:n", kills the process with SIGKILL at the nth hit of
// point: nothing after it runs, as with a kill from outside at that
// instant.
func installKillHook(spec string) (*hitCounter, error) {
	h := &hitCounter{n: map[string]int{}}
	killPoint, killAt := "", 0
	if spec != "" {
		p, n, ok := strings.Cut(spec, ":")
		k, err := strconv.Atoi(n)
		if !ok || err != nil || k < 1 {
			return nil, fmt.Errorf("bad %s %q: want point:n", childKillAtEnv, spec)
		}
		killPoint, killAt = p, k
	}
	testhook.Set(func(point string) {
		h.mu.Lock()
		h.n[point]++
		kill := point == killPoint && h.n[point] == killAt
		h.mu.Unlock()
		if kill {
			unix.Kill(os.Getpid(), unix.SIGKILL)
			select {} // the signal ends the process; this goroutine goes no further
		}
	})
	return h, nil
}

// childCmd prepares zinf args as a child process whose data segment
// (RLIMIT_DATA: the heap and private mappings, which the race detector's
// shadow memory does not count against) is limited to limitAS bytes when
// limitAS > 0.
func childCmd(ctx context.Context, t *testing.T, limitAS uint64, args ...string) *exec.Cmd {
	t.Helper()
	enc, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), childArgsEnv+"="+string(enc))
	if limitAS > 0 {
		cmd.Env = append(cmd.Env, childLimitEnv+"="+strconv.FormatUint(limitAS, 10))
	}
	return cmd
}

// runChild runs zinf args in a child limited to limitAS bytes of data
// segment, under a watchdog, and returns its exit code and output.
func runChild(t *testing.T, limitAS uint64, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := childCmd(ctx, t, limitAS, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("zinf %q did not finish in time:\nstdout %s\nstderr %s", args, out.String(), errb.String())
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	} else if err != nil {
		t.Fatalf("running zinf %q: %v", args, err)
	}
	return 0, out.String(), errb.String()
}

// runChildEnv runs zinf args in a child with env added to its
// environment, under a watchdog, and returns its exit code and output.
func runChildEnv(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := childCmd(ctx, t, 0, args...)
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("zinf %q did not finish in time:\nstdout %s\nstderr %s", args, out.String(), errb.String())
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	} else if err != nil {
		t.Fatalf("running zinf %q: %v", args, err)
	}
	return 0, out.String(), errb.String()
}

// syncBuffer is a bytes.Buffer safe to read while a child writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
