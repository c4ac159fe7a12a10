package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/base/testhook"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/internal/test/testenv"
)

// Environment switches that turn the test binary into the zinf command
// itself, so that tests can run it as a separate process: under an
// data-segment limit (a regression that allocates what the flags ask for
// then fails that child, not the machine), or to send it a signal.
const (
	childArgsEnv  = "ZINF_TEST_CHILD_ARGS"
	childLimitEnv = "ZINF_TEST_CHILD_DATA_LIMIT"
	// childKillAtEnv ("point:n") makes the child SIGKILL itself at the
	// nth time its work reaches the internal/base/testhook point: a crash
	// aimed at a phase (a checkpoint's commit, a step's backward). The
	// zinf binary never reads it: only this test binary, in child mode.
	childKillAtEnv = "ZINF_TEST_KILL_AT"
	// childHitsEnv names a file where the child writes, as it exits, how
	// often it reached each point (JSON), so a test knows the range to
	// aim kills at.
	childHitsEnv = "ZINF_TEST_HITS"
	// childRankEnv limits the kill and the fault to one rank of an MPI
	// job (its OMPI_COMM_WORLD_RANK): the other ranks run unharmed.
	childRankEnv = "ZINF_TEST_RANK"
	// childENOSPCEnv ("n") makes the nth write piece of the child's I/O
	// engines fail with ENOSPC: a full disk at a point of the run.
	childENOSPCEnv = "ZINF_TEST_ENOSPC"
	// childKilledEnv names a file where the kill hook writes the time
	// just before it kills.
	childKilledEnv = "ZINF_TEST_KILLED"
	// childStopEnv ("1") makes the kill hook stop the child (SIGSTOP:
	// the process stays, nothing of it runs) instead of killing it.
	childStopEnv = "ZINF_TEST_STOP"
	// childASExtraEnv ("n") sets the child's address-space limit
	// (RLIMIT_AS, ulimit -v) to what it maps at start plus n bytes:
	// relative, since the race detector maps terabytes of shadow address
	// space up front.
	childASExtraEnv = "ZINF_TEST_AS_EXTRA"
	// childBlockAtEnv ("point") makes the child block forever, as a
	// system call that never returns would, the first time its work
	// reaches the testhook point; it prints childBlockedLine to stderr
	// first.
	childBlockAtEnv = "ZINF_TEST_BLOCK_AT"
)

// childBlockedLine is what a child prints when it blocks at
// childBlockAtEnv's point.
const childBlockedLine = "test: blocked at "

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
		if x := os.Getenv(childASExtraEnv); x != "" {
			if err := limitAddressSpace(x); err != nil {
				os.Stderr.WriteString("setting the address-space limit: " + err.Error() + "\n")
				os.Exit(3)
			}
		}
		// With childRankEnv, only that rank of an MPI job is harmed.
		harm := true
		if r := os.Getenv(childRankEnv); r != "" {
			harm = r == os.Getenv("OMPI_COMM_WORLD_RANK")
		}
		killAt := os.Getenv(childKillAtEnv)
		if !harm {
			killAt = ""
		}
		hits, err := installKillHook(killAt)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(3)
		}
		if n := os.Getenv(childENOSPCEnv); n != "" && harm {
			k, err := strconv.Atoi(n)
			if err != nil || k < 1 {
				os.Stderr.WriteString("bad " + childENOSPCEnv + "\n")
				os.Exit(3)
			}
			trainFaults = faults.New(1, faults.Rule{Kind: faults.Writes, Nth: k, Err: syscall.ENOSPC})
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
	code := m.Run()
	if mpiBinary.dir != "" {
		os.RemoveAll(mpiBinary.dir)
	}
	os.Exit(code)
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
	blockAt := os.Getenv(childBlockAtEnv)
	testhook.Set(func(point string) {
		if blockAt != "" && point == blockAt {
			os.Stderr.WriteString(childBlockedLine + point + "\n")
			select {} // blocked for good: only a signal's exit ends it
		}
		h.mu.Lock()
		h.n[point]++
		kill := point == killPoint && h.n[point] == killAt
		h.mu.Unlock()
		if kill {
			if p := os.Getenv(childKilledEnv); p != "" {
				os.WriteFile(p, []byte(time.Now().Format(time.RFC3339Nano)), 0o644)
			}
			if os.Getenv(childStopEnv) != "" {
				unix.Kill(os.Getpid(), unix.SIGSTOP)
			} else {
				unix.Kill(os.Getpid(), unix.SIGKILL)
			}
			select {} // the signal ends (or stops) the process; this goroutine goes no further
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

// syncBuffer is a buffer safe to read while a child writes to it.
type syncBuffer = testenv.SyncBuffer

// limitAddressSpace sets RLIMIT_AS to this process's VmSize plus extra
// bytes (a decimal string).
func limitAddressSpace(extra string) error {
	n, err := strconv.ParseUint(extra, 10, 64)
	if err != nil {
		return err
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmSize:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return fmt.Errorf("VmSize %q: %w", v, err)
			}
			lim := kb<<10 + n
			return unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: lim, Max: lim})
		}
	}
	return errors.New("no VmSize in /proc/self/status")
}
