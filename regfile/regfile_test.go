package regfile_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/regfile"
)

// TestOpenRefusesNonRegular: a named pipe with no writer, a directory and
// a character device are refused at once, naming their kind; a regular
// file opens.
func TestOpenRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	reg := filepath.Join(dir, "file")
	if err := os.WriteFile(reg, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, kind string }{
		{fifo, "named pipe"},
		{dir, "directory"},
		{os.DevNull, "character device"},
	} {
		done := make(chan error, 1)
		go func() {
			f, _, err := regfile.Open(c.path)
			if f != nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, regfile.ErrNotRegular) || !strings.Contains(err.Error(), c.kind) {
				t.Errorf("Open(%s) = %v, want ErrNotRegular naming %q", c.path, err, c.kind)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Open(%s) blocked", c.path)
		}
	}
	f, st, err := regfile.Open(reg)
	if err != nil || st.Size() != 1 {
		t.Fatalf("Open(regular) = %v, %v", st, err)
	}
	f.Close()
}
