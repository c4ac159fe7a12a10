package testenv

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Unprivileged returns a command that runs this test binary's test
// (a -test.run pattern) as an unprivileged user: as uid/gid nobody
// (65534) when the tests run as root, whose CAP_IPC_LOCK would ignore
// RLIMIT_MEMLOCK, from a world-readable copy of the binary in a temp
// directory removed when the test ends (the build directory may not be
// readable by nobody). env is added to the environment.
func Unprivileged(t testing.TB, ctx context.Context, test string, env ...string) (*exec.Cmd, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "zinf-unprivileged-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, filepath.Base(exe))
	if err := copyExecutable(exe, bin); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "-test.run="+test, "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	return cmd, nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
