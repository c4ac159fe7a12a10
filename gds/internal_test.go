package gds

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/aio"
)

func TestSplitPieces(t *testing.T) {
	cases := []struct {
		off, n, block int64
		want          []piece
	}{
		{0, 0, 4096, nil},
		{0, 4096, 4096, []piece{{0, 4096}}},
		{0, 4097, 4096, []piece{{0, 4096}, {4096, 1}}},
		{100, 4096, 4096, []piece{{100, 3996}, {4096, 100}}},
		{8192, 10, 4096, []piece{{8192, 10}}},
		{4095, 2, 4096, []piece{{4095, 1}, {4096, 1}}},
		{1000, 600000, 65536, nil}, // checked by count below
	}
	for _, c := range cases {
		s := newSplit(context.Background(), c.off, c.n, c.block)
		var got []piece
		var total int64
		for {
			p, ok := s.claim()
			if !ok {
				break
			}
			if p.len <= 0 || p.len > c.block || p.start/c.block != (p.start+p.len-1)/c.block {
				t.Fatalf("off %d n %d: piece %+v crosses a block or is empty", c.off, c.n, p)
			}
			got = append(got, p)
			total += p.len
		}
		if total != c.n || (len(got) > 0 && got[0].start != c.off) {
			t.Fatalf("off %d n %d: pieces %v cover %d bytes", c.off, c.n, got, total)
		}
		if c.want != nil && !equalPieces(got, c.want) {
			t.Errorf("off %d n %d block %d: %v, want %v", c.off, c.n, c.block, got, c.want)
		}
	}
	if s := newSplit(context.Background(), 1000, 600000, 65536); s.count != 10 {
		t.Errorf("count %d, want 10", s.count)
	}
}

func equalPieces(a, b []piece) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSplitStopsAtFirstFailure(t *testing.T) {
	s := newSplit(context.Background(), 0, 10<<20, 1<<20)
	s.claim()
	first := errors.New("first")
	s.fail(first)
	s.fail(errors.New("second"))
	if _, ok := s.claim(); ok {
		t.Fatal("claim after failure")
	}
	if _, err := s.result(); err != first {
		t.Fatalf("result %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s = newSplit(ctx, 0, 10, 4096)
	if _, ok := s.claim(); ok {
		t.Fatal("claim with a canceled context")
	}
	if _, err := s.result(); !errors.Is(err, context.Canceled) {
		t.Fatalf("result %v", err)
	}
}

func TestIOResult(t *testing.T) {
	cases := []struct {
		ret   int64
		errno syscall.Errno
		n     int64
		check func(error) bool
	}{
		{4096, 0, 4096, func(err error) bool { return err == nil }},
		{0, 0, 0, func(err error) bool { return err == nil }},
		{-1, syscall.ENOSPC, 0, func(err error) bool { return errors.Is(err, syscall.ENOSPC) }},
		{-1, 0, 0, func(err error) bool { return errors.Is(err, syscall.EIO) }},
		{-5011, 0, 0, func(err error) bool {
			var ce *CuFileError
			return errors.As(err, &ce) && ce.Code == 5011 && ce.Call == "cuFileRead"
		}},
		{-int64(syscall.EIO), 0, 0, func(err error) bool { return errors.Is(err, syscall.EIO) }},
	}
	for _, c := range cases {
		n, err := ioResult("cuFileRead", c.ret, c.errno)
		if n != c.n || !c.check(err) {
			t.Errorf("ioResult(%d, %v) = %d, %v", c.ret, c.errno, n, err)
		}
	}
}

func TestCuFileErrorText(t *testing.T) {
	e := &CuFileError{Call: "cuFileBufRegister", Code: 5011, CUDACode: 2}
	if got := e.Error(); got != "gds: cuFileBufRegister failed: CU_FILE_CUDA_DRIVER_ERROR (5011), CUDA driver error 2" {
		t.Errorf("%q", got)
	}
	if (&CuFileError{Code: 4999}).CodeName() != "CUfileOpError(4999)" {
		t.Error("unknown code name")
	}
	if !errors.Is(&CuFileError{Code: cuFilePlatformNotSupported}, ErrUnavailable) || errors.Is(&CuFileError{Code: 5022}, ErrUnavailable) {
		t.Error("ErrUnavailable mapping")
	}
}

func TestDriverOpenHint(t *testing.T) {
	old := nvidiaFSModule
	defer func() { nvidiaFSModule = old }()
	nvidiaFSModule = filepath.Join(t.TempDir(), "nvidia_fs")
	if h := driverOpenHint(cuFileDriverNotInitialized); !strings.Contains(h, "nvidia-fs kernel module is not loaded") || !strings.Contains(h, nvidiaFSModule) {
		t.Errorf("hint without the module: %q", h)
	}
	if err := os.Mkdir(nvidiaFSModule, 0o700); err != nil {
		t.Fatal(err)
	}
	if h := driverOpenHint(cuFileDriverVersionMismatch); !strings.Contains(h, "version does not match") {
		t.Errorf("hint with the module: %q", h)
	}
	if h := driverOpenHint(5030); !strings.Contains(h, "cufile.log") {
		t.Errorf("generic hint: %q", h)
	}
}

func TestNoCgoMessage(t *testing.T) {
	for _, s := range []string{"built without cgo", "CGO_ENABLED=1", "libcufile.so.0"} {
		if !strings.Contains(errNoCgo.Error(), s) {
			t.Errorf("%q does not say %q", errNoCgo, s)
		}
	}
	if !errors.Is(errNoCgo, ErrUnavailable) {
		t.Error("errNoCgo is not ErrUnavailable")
	}
}

func TestOptionsValidate(t *testing.T) {
	o := Options{BlockSizeBytes: 1000, Parallelism: 1000, Direct: aio.DirectPolicy(9)}
	err := o.Validate()
	for _, s := range []string{"block size 1000", "parallelism 1000", "O_DIRECT policy 9"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("Validate: %v, want it to say %q", err, s)
		}
	}
	o = Options{}
	o.EnsureDefaults()
	if o.BlockSizeBytes != DefaultBlockSizeBytes || o.Parallelism != 1 || o.Library != DefaultLibrary || o.Logger == nil {
		t.Errorf("defaults %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
	for in, want := range map[string]string{"": ModeAuto, "AUTO": ModeAuto, "off": ModeOff, " required ": ModeRequired} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseMode("sometimes"); err == nil || !strings.Contains(err.Error(), "allowed: off, auto, required") {
		t.Errorf("ParseMode(bad): %v", err)
	}
}
