package buffers

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/test/testenv"
)

const memlockChildEnv = "ZINF_BUFFERS_MEMLOCK_CHILD"

// TestMemlockUnprivileged runs TestMemlockChild in a copy of this test
// binary as an unprivileged user (uid nobody when we are root, since root's
// CAP_IPC_LOCK ignores RLIMIT_MEMLOCK), where it lowers its own memlock limit
// and checks the real mlock failure paths.
func TestMemlockUnprivileged(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a subprocess")
	}
	cmd, err := testenv.Unprivileged(t, t.Context(), "^TestMemlockChild$", memlockChildEnv+"=1")
	if err != nil {
		t.Skip(err)
	}
	out, err := cmd.CombinedOutput()
	t.Logf("child output:\n%s", out)
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Skipf("cannot start an unprivileged child: %v", err)
		}
		t.Fatalf("child failed: %v", err)
	}
	if bytes.Contains(out, []byte("SKIP")) {
		t.Skip("child could not exercise the fallback (it may still mlock)")
	}
	if !bytes.Contains(out, []byte("memlock child ok")) {
		t.Fatal("child did not report success")
	}
}

func TestMemlockChild(t *testing.T) {
	if os.Getenv(memlockChildEnv) == "" {
		t.Skip("runs only as TestMemlockUnprivileged's child")
	}
	const limit = 64 << 10
	if err := setMemlockLimit(limit); err != nil {
		t.Fatalf("lowering RLIMIT_MEMLOCK: %v", err)
	}
	rec := &recorder{}
	p, err := NewPool(Options{CapacityBytes: 1 << 20, Pin: PinAuto, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pinned() {
		p.Close()
		t.Skip("mlock succeeded despite the limit (CAP_IPC_LOCK?)")
	}
	b := mustAcquire(t, p, 1<<20, PurposeParams)
	fill(b.Bytes(), 1)
	b.Release()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	warns := rec.at(slog.LevelWarn)
	if len(warns) != 1 || !strings.Contains(warns[0], fmt.Sprintf("RLIMIT_MEMLOCK is 64 KiB (%d bytes)", limit)) {
		t.Fatalf("warnings: %q", warns)
	}
	_, err = NewPool(Options{CapacityBytes: 1 << 20, Pin: PinRequired, Logger: discardLogger()})
	if !errors.Is(err, ErrPinned) || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK is 64 KiB") {
		t.Fatalf("PinRequired under a 64 KiB limit: %v", err)
	}
	t.Logf("warning: %s", warns[0])
	t.Logf("PinRequired: %v", err)
	fmt.Println("memlock child ok")
}

// setMemlockLimit lowers this process's soft RLIMIT_MEMLOCK.
func setMemlockLimit(n uint64) error {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return err
	}
	r.Cur = n
	return unix.Setrlimit(unix.RLIMIT_MEMLOCK, &r)
}
