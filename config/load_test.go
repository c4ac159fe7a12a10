package config_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/config"
)

// childEnv switches the test binary into a child that runs one test under
// a data-segment limit (RLIMIT_DATA: the heap and private mappings, which
// the race detector's shadow memory does not count against), so that a regression that reads without bound
// fails that child instead of exhausting the machine.
const childEnv = "ZINF_CONFIG_TEST_DATA_LIMIT"

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err == nil {
			err = unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: n, Max: n})
		}
		if err != nil {
			os.Stderr.WriteString("setting the data-segment limit: " + err.Error() + "\n")
			os.Exit(3)
		}
	}
	os.Exit(m.Run())
}

// inChild reruns the named test in a child process whose data segment is
// limited to limit bytes and fails if the child fails. It reports whether
// the caller is the child (and should run the body).
func inChild(t *testing.T, limit uint64) bool {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		return true
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.FormatUint(limit, 10))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child under a %d-byte data-segment limit failed: %v\n%s", limit, err, out)
	}
	return false
}

// TestLoadDevZero is the regression for a config path naming an endless
// device: Load refuses it without reading it (it used to read up to
// MaxFileBytes), naming the file and what it is.
func TestLoadDevZero(t *testing.T) {
	if !inChild(t, 2<<30) {
		return
	}
	_, err := config.Load("/dev/zero")
	if !errors.Is(err, config.ErrNotRegular) {
		t.Fatalf("Load(/dev/zero) = %v, want config.ErrNotRegular", err)
	}
	for _, want := range []string{"/dev/zero", "character device", "regular file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestLoadFIFO is the regression for a config path naming a named pipe:
// the open blocked until a writer came, forever. Load refuses it without
// opening it, as it does a socket.
func TestLoadFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := config.Load(fifo); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, config.ErrNotRegular) || !strings.Contains(err.Error(), fifo) || !strings.Contains(err.Error(), "named pipe") {
			t.Fatalf("Load(fifo) = %v, want config.ErrNotRegular naming the pipe", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Load(fifo) blocked")
	}
	// A symbolic link to a regular file is still read.
	real := filepath.Join(dir, "real.json")
	if err := os.WriteFile(real, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(link); err != nil {
		t.Errorf("Load(link to a regular file) = %v", err)
	}
}

// TestLoadHugeRegularFile checks that a regular file over the bound is
// refused from its size alone: a sparse 1 TiB file costs nothing to make and
// would take minutes to read.
func TestLoadHugeRegularFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		f.Close()
		t.Skipf("this filesystem cannot hold a sparse 1TiB file: %v", err)
	}
	f.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = config.Load(path)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), strconv.FormatInt(1<<40, 10)) {
		t.Fatalf("Load(1TiB file) = %v, want an error naming the file and its size", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("Load allocated %d bytes to refuse a file by its size", got)
	}
}

// TestLoadAtTheLimit: a file of exactly MaxFileBytes is read (and rejected
// as JSON, not as too large); one byte more is too large.
func TestLoadAtTheLimit(t *testing.T) {
	dir := t.TempDir()
	body := []byte("{}" + strings.Repeat(" ", config.MaxFileBytes-2))
	at := filepath.Join(dir, "at.json")
	if err := os.WriteFile(at, body, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(at); err != nil {
		t.Errorf("Load(%d-byte file) = %v, want it accepted", len(body), err)
	}
	over := filepath.Join(dir, "over.json")
	if err := os.WriteFile(over, append(body, ' '), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(over); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("Load(%d-byte file) = %v, want the size limit", len(body)+1, err)
	}
	if _, err := config.Parse(append(body, ' ')); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("Parse(%d bytes) = %v, want the size limit", len(body)+1, err)
	}
}

// TestLoadDirectory: a directory is refused with a message, not read.
func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	_, err := config.Load(dir)
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("Load(dir) = %v, want an error naming the directory", err)
	}
}

// FuzzLoad writes data followed by pad KiB of zeros (a sparse extension, so
// inputs far beyond the bound cost no disk) and checks that Load never
// panics, that inputs over MaxFileBytes are refused, and that the memory it
// allocates is bounded by the input it may read, not by the file's size.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{}`), uint32(0))
	f.Add([]byte(`{"aio": {"queue_depth": 8}}`), uint32(1))
	f.Add([]byte(`{"zinf": {"rank": 0}}`), uint32(16<<10))
	f.Add([]byte(`[`), uint32(16<<10+1))
	f.Add(bytes.Repeat([]byte("["), 20000), uint32(0))
	f.Add([]byte(`{"a": [`+strings.Repeat("0,", 1000)+`0]}`), uint32(0))
	f.Add([]byte(` `), uint32(1<<30))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, padKiB uint32) {
		path := filepath.Join(dir, "fuzz.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		size := int64(len(data)) + int64(padKiB)<<10
		if err := os.Truncate(path, size); err != nil {
			t.Skipf("cannot extend the file to %d bytes: %v", size, err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		c, err := config.Load(path)
		runtime.ReadMemStats(&after)
		alloc := int64(after.TotalAlloc - before.TotalAlloc)
		if err == nil && c == nil {
			t.Fatal("Load returned neither a config nor an error")
		}
		if size > config.MaxFileBytes {
			if err == nil || !strings.Contains(err.Error(), "limit") {
				t.Fatalf("Load of a %d-byte file = %v, want the size limit", size, err)
			}
			if alloc > 1<<20 {
				t.Fatalf("refusing a %d-byte file allocated %d bytes", size, alloc)
			}
			return
		}
		// Reading is one buffer of the file; the tree costs a bounded
		// number of bytes per input byte (the worst case is a long array of
		// one-digit numbers, a node each).
		if limit := 4*size + 512*int64(len(data)) + 4<<20; alloc > limit {
			t.Fatalf("Load of a %d-byte file allocated %d bytes (limit %d)", size, alloc, limit)
		}
	})
}
