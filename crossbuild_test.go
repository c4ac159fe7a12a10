package zinf_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestCrossBuild builds every package for Linux on arm64 (the NEON
// kernels; io_uring and libaio through arm64's syscall numbers), and for
// macOS and FreeBSD (the posix backend; F_NOCACHE or O_DIRECT): Linux-only
// calls that slip into a shared file break those builds without any Linux
// test noticing, which is how they broke once already.
func TestCrossBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("cross builds skipped in -short mode")
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Skip("no go command to build with")
		}
	}
	for _, target := range [][2]string{{"linux", "arm64"}, {"darwin", "arm64"}, {"freebsd", "amd64"}} {
		cmd := exec.Command(goBin, "build", "./...")
		cmd.Env = append(os.Environ(), "GOOS="+target[0], "GOARCH="+target[1], "CGO_ENABLED=0", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s GOARCH=%s go build ./...: %v\n%s", target[0], target[1], err, out)
		}
	}
}
