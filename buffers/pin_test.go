package buffers

import (
	"errors"
	"log/slog"
	"strings"
	"syscall"
	"testing"
)

// fakeMemlock makes mlock fail with errno and RLIMIT_MEMLOCK read as limit
// until the test ends; it counts mlock calls.
func fakeMemlock(t *testing.T, errno error, limit uint64) *int {
	t.Helper()
	calls := new(int)
	oldLock, oldLimit := mlockFn, memlockLimitFn
	mlockFn = func([]byte) error { *calls++; return errno }
	memlockLimitFn = func() (uint64, bool, bool) { return limit, false, true }
	t.Cleanup(func() { mlockFn, memlockLimitFn = oldLock, oldLimit })
	return calls
}

func TestPinAutoFallsBackWithOneWarning(t *testing.T) {
	calls := fakeMemlock(t, syscall.ENOMEM, 64<<10)
	rec := &recorder{}
	p, err := NewPool(Options{CapacityBytes: 1 << 20, Logger: slog.New(rec)}) // PinAuto by default
	if err != nil {
		t.Fatalf("PinAuto must continue unpinned: %v", err)
	}
	if p.Pinned() || p.Stats().Pinned || *calls != 1 {
		t.Fatalf("pinned=%v calls=%d", p.Pinned(), *calls)
	}
	for range 10 { // the pool works, and says nothing more
		b := mustAcquire(t, p, 100<<10, PurposeParams)
		fill(b.Bytes(), 3)
		b.Release()
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	warns := rec.at(slog.LevelWarn)
	if len(warns) != 1 {
		t.Fatalf("want exactly one warning, got %d: %q", len(warns), warns)
	}
	for _, want := range []string{"RLIMIT_MEMLOCK is 64 KiB (65536 bytes)", "1 MiB (1048576 bytes)", "ulimit -l", "LimitMEMLOCK", "unpinned", "cannot allocate memory"} {
		if !strings.Contains(warns[0], want) {
			t.Errorf("warning %q lacks %q", warns[0], want)
		}
	}
}

func TestPinRequiredFails(t *testing.T) {
	fakeMemlock(t, syscall.EPERM, 0)
	_, err := NewPool(Options{CapacityBytes: 1 << 20, Pin: PinRequired, Logger: discardLogger()})
	if !errors.Is(err, ErrPinned) || !errors.Is(err, syscall.EPERM) {
		t.Fatalf("PinRequired: %v", err)
	}
	for _, want := range []string{"RLIMIT_MEMLOCK is 0 bytes", "1 MiB", "ulimit -l"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestPinOffNeverLocks(t *testing.T) {
	calls := fakeMemlock(t, syscall.EPERM, 0)
	rec := &recorder{}
	p, err := NewPool(Options{CapacityBytes: 1 << 16, Pin: PinOff, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if *calls != 0 || p.Pinned() || len(rec.at(slog.LevelWarn)) != 0 {
		t.Fatalf("PinOff: calls=%d pinned=%v", *calls, p.Pinned())
	}
}

// TestPinReal pins for real when this process may (root or a generous
// limit), and otherwise checks the real fallback.
func TestPinReal(t *testing.T) {
	rec := &recorder{}
	p, err := NewPool(Options{CapacityBytes: 1 << 20, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	t.Logf("pinned=%v (memlock limit %s)", p.Pinned(), describeMemlockLimit())
	if p.Pinned() != p.Stats().Pinned {
		t.Fatal("Stats.Pinned disagrees")
	}
	if warns := len(rec.at(slog.LevelWarn)); p.Pinned() == (warns != 0) {
		t.Fatalf("pinned=%v with %d warnings", p.Pinned(), warns)
	}
	b := mustAcquire(t, p, 1<<20, PurposeStaging)
	fill(b.Bytes(), 9)
	b.Release()
}
