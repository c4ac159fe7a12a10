//go:build linux

package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/internal/base/testhook"
)

// TestLockFileAppearsWhole: on Linux a lock file is named only once it is
// locked and holds lockMagic, so a writer killed while creating it leaves
// nothing (a crash test once found an empty ".lock.init" that no sweep may
// remove, since nothing in it says it is ours). At the last moment before
// the name appears, the directory is still empty; afterwards the file is
// whole and held.
func TestLockFileAppearsWhole(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, ".tmp-zinf-ckpt-step-000001-0123456789ab.lock")
	var seen []string
	hits := 0
	defer testhook.Set(func(point string) {
		if point != "checkpoint/lock-unnamed" {
			return
		}
		hits++
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Error(err)
		}
		for _, e := range ents {
			seen = append(seen, e.Name())
		}
	})()
	lf, err := createLock(path)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if hits != 1 {
		t.Fatalf("the lock file was not made unnamed first (hook hit %d times): this filesystem or kernel lacks O_TMPFILE and linkat, or createLock no longer uses them", hits)
	}
	if len(seen) != 0 {
		t.Fatalf("before the lock file was named, the directory already held %q", seen)
	}
	b, err := os.ReadFile(path)
	if err != nil || !strings.HasPrefix(string(b), lockMagic) {
		t.Fatalf("lock file: %q, %v", b, err)
	}
	other, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if ok, err := tryLock(other); err != nil || ok {
		t.Fatalf("another opener could lock a held lock file (ok %v, err %v)", ok, err)
	}
	if _, err := createLock(path); !os.IsExist(err) && !strings.Contains(strings.ToLower(errString(err)), "exist") {
		t.Fatalf("creating an existing lock file: %v, want an exists error", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want the one lock file", len(ents))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
