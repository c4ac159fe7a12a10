package gds_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/cudatest"
)

// sizes are the request sizes the round-trip tests use: aligned and not,
// smaller than, equal to and spanning many pieces.
var sizes = []int64{4096, 4097, 65535, 1 << 20, 1<<20 + 1, 3<<20 - 513, 8 << 20, 64 << 20}

// shortSizes skips the largest sizes under -short.
func shortSizes() []int64 {
	if testing.Short() {
		return sizes[:len(sizes)-1]
	}
	return sizes
}

// standins is a test's stand-in CUDA device and cuFile library.
type standins struct {
	dev         *cuda.Device
	cudaLib     string
	cufileLib   string
	cudaState   string
	cufileState string
}

// newStandins builds both stand-in libraries, resets their steering
// environment and opens the stand-in device (closed at cleanup).
func newStandins(t *testing.T) *standins {
	t.Helper()
	cudaLib := cudatest.Build(t)
	cufileLib := cudatest.CompileShared(t, "testdata/cufile_standin.c", "libcufile_standin.so")
	for _, k := range []string{"STANDIN_FAIL", "STANDIN_FAIL_AT", "STANDIN_SHORT", "STANDIN_EINTR", "STANDIN_DELAY_US", "STANDIN_REQUIRE_ODIRECT"} {
		t.Setenv(k, "")
	}
	t.Setenv("STANDIN_CUDA_TOTAL", fmt.Sprint(int64(1)<<30))
	s := &standins{
		cudaLib:     cudaLib,
		cufileLib:   cufileLib,
		cudaState:   cudatest.StateFile(t, "STANDIN_CUDA_STATE"),
		cufileState: cudatest.StateFile(t, "STANDIN_CUFILE_STATE"),
	}
	dev, err := cuda.Open(cuda.Options{Library: cudaLib})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	s.dev = dev
	return s
}

func (s *standins) cufile(t *testing.T) map[string]int64 { return cudatest.ReadState(t, s.cufileState) }

// randomBytes returns n reproducible pseudo-random bytes.
func randomBytes(seed uint64, n int64) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), 7}).Read(b)
	return b
}

// upload copies b into a fresh allocation of dev at off.
func upload(t *testing.T, dev accel.Device, b []byte, off, size int64) accel.Mem {
	t.Helper()
	m, err := dev.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := dev.CopyToDevice(st, m, off, b); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return m
}

// download returns n bytes of m at off.
func download(t *testing.T, dev accel.Device, m accel.Mem, off, n int64) []byte {
	t.Helper()
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := make([]byte, n)
	if err := dev.CopyFromDevice(st, b, m, off); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

// fileBytes returns n bytes of the file at off.
func fileBytes(t *testing.T, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("reading back %s: %v", path, err)
	}
	return b
}

func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Fatalf("%s: bytes differ first at %d of %d (got %#x, want %#x)", what, i, len(want), got[i], want[i])
		}
	}
	t.Fatalf("%s: lengths differ: %d, want %d", what, len(got), len(want))
}

func wantErr(t *testing.T, err error, target error, texts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one matching %v", target)
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error %q does not match %v", err, target)
	}
	for _, s := range texts {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// bounceEnv is a simulated device, an aio engine and a pool for the bounce
// path, all closed at cleanup.
type bounceEnv struct {
	sim  *accel.Sim
	eng  aio.Engine
	pool *buffers.Pool
	dir  string
}

func newBounceEnv(t *testing.T, simOpts accel.SimOptions, aioOpts aio.Options) *bounceEnv {
	t.Helper()
	sim, err := accel.NewSim(simOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	eng, err := aio.New(aioOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 20, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return &bounceEnv{sim: sim, eng: eng, pool: pool, dir: t.TempDir()}
}

// logCapture collects log records.
type logCapture struct {
	mu      sync.Mutex
	records []slog.Record
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, r)
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

// warnings returns the warning messages with their "reason" attribute.
func (c *logCapture) warnings() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.records {
		if r.Level != slog.LevelWarn {
			continue
		}
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool {
			msg += " " + a.Key + "=" + a.Value.String()
			return true
		})
		out = append(out, msg)
	}
	return out
}

func tempPath(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(t.TempDir(), name)
}
