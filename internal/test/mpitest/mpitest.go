// Package mpitest runs zinf's multi-process tests under Open MPI's
// mpirun: it finds the launcher, builds binaries with the mpi build tag
// and launches them oversubscribed on this machine's cores, under a
// timeout that kills the whole job.
//
// MPI is optional for zinf's default build, so a test that needs it
// skips, naming what is missing, when Open MPI is absent — unless
// ZINF_REQUIRE_BACKENDS lists "mpi", which turns the skip into a
// failure (CI installs libopenmpi-dev and openmpi-bin and requires it).
package mpitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/test/testenv"
)

// Available reports what is missing for the MPI tests: mpirun on PATH,
// and Open MPI's development files through pkg-config (to build the
// binding); nil when both are there.
func Available() error {
	if _, err := exec.LookPath("mpirun"); err != nil {
		return fmt.Errorf("mpirun not found on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev): %w", err)
	}
	if out, err := exec.Command("pkg-config", "--cflags", "ompi").CombinedOutput(); err != nil {
		return fmt.Errorf("pkg-config cannot find Open MPI (Debian: apt-get install libopenmpi-dev): %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Require skips t when Open MPI is absent, or fails it when
// ZINF_REQUIRE_BACKENDS lists "mpi". It also skips under -short.
func Require(t testing.TB) {
	t.Helper()
	testenv.SkipUnavailable(t, "mpi", Available())
	if testing.Short() && !testenv.Required(t, "mpi") {
		t.Skip("MPI tests launch processes: skipped under -short")
	}
}

// moduleRoot is the directory of zinf's go.mod.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Build builds pkg (an import path or a path relative to the module
// root, like "./cmd/zinf") with the mpi build tag into dir and returns
// the binary's path. With test set it builds pkg's test binary instead
// (go test -c).
func Build(t testing.TB, pkg, dir string, test bool) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg)+"-mpi")
	args := []string{"build", "-tags", "mpi", "-o", out, pkg}
	if test {
		out += ".test"
		args = []string{"test", "-c", "-tags", "mpi", "-o", out, pkg}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s with -tags mpi: %v\n%s", pkg, err, b)
	}
	return out
}

func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Args returns mpirun's arguments for n ranks on this machine: as root
// too, more ranks than cores, shared memory between them (vader), no
// binding of ranks to cores (they share them).
func Args(n int) []string {
	return []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", fmt.Sprint(n),
		"--mca", "btl", "self,vader"}
}

// Env is what mpirun needs in the environment to run as root.
func Env() []string {
	return []string{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rmaps_base_oversubscribe=1"}
}

// Result is one mpirun job.
type Result struct {
	Output   string        // stdout and stderr of every rank and mpirun, interleaved
	Err      error         // the job's exit (nil: every rank exited 0)
	Duration time.Duration // launch to exit
	TimedOut bool
}

// Run launches prog with args on n ranks, with env added, and waits at
// most timeout; a job still running then is killed (mpirun and every
// rank: its own process group) and reported as TimedOut.
func Run(t testing.TB, timeout time.Duration, n int, env []string, prog string, args ...string) Result {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Fatal(err)
	}
	all := append(Args(n), prog)
	all = append(all, args...)
	cmd := exec.Command(mpirun, all...)
	cmd.Env = append(append(os.Environ(), Env()...), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting mpirun: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var res Result
	select {
	case res.Err = <-done:
	case <-time.After(timeout):
		res.TimedOut = true
		// mpirun forwards SIGTERM to the ranks and reaps them; SIGKILL
		// for a job that does not end.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case res.Err = <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			res.Err = <-done
		}
		if res.Err == nil {
			res.Err = errors.New("timed out")
		}
	}
	res.Duration = time.Since(t0)
	res.Output = out.String()
	return res
}
