package main

import (
	"os"
	"syscall"
	"testing"
)

// TestTrainRefusesSmallFilesystem: `zinf train` on a filesystem with less
// free space than the plan's disk figure stops before training, naming the
// path and the need, and leaves nothing there.
func TestTrainRefusesSmallFilesystem(t *testing.T) {
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): %v", err)
	}
	defer syscall.Unmount(mnt, 0)
	code, out, errs := runCLI(t, "train", "--dir", mnt, "--layers", "4", "--width", "512", "--steps", "1")
	if code == 0 {
		t.Fatalf("trained on a 4 MiB filesystem:\n%s", out)
	}
	wantAll(t, "the error", errs, mnt, "free", "need", "zinf plan")
	if ents, _ := os.ReadDir(mnt); len(ents) != 0 {
		t.Errorf("the refused run left %d entries in %s", len(ents), mnt)
	}
}
