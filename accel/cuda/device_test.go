package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/internal/test/cudatest"
)

// standin builds the stand-in driver, points its state file at a temporary
// file and returns options that load it, and the state file.
func standin(t *testing.T) (cuda.Options, string) {
	t.Helper()
	lib := cudatest.Build(t)
	state := cudatest.StateFile(t, "STANDIN_CUDA_STATE")
	t.Setenv("STANDIN_FAIL", "")
	return cuda.Options{Library: lib}, state
}

func openStandin(t *testing.T) (*cuda.Device, string) {
	t.Helper()
	opts, state := standin(t)
	d, err := cuda.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, state
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

func TestOpenMissingLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := cuda.Open(cuda.Options{Library: missing})
	if !cudatest.CgoEnabled {
		wantErr(t, err, accel.ErrUnavailable, "built without cgo", "CGO_ENABLED=1")
		return
	}
	wantErr(t, err, accel.ErrUnavailable, "cannot load the CUDA driver library", missing, "No such file or directory", "ZINF_CUDA_LIBRARY")
	_, err = cuda.Probe(cuda.Options{Library: missing})
	wantErr(t, err, accel.ErrUnavailable, missing)
}

func TestLibraryFromEnvironment(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "from-env.so")
	t.Setenv(cuda.LibraryEnv, missing)
	_, err := cuda.Open(cuda.Options{})
	if !cudatest.CgoEnabled {
		wantErr(t, err, accel.ErrUnavailable, "built without cgo")
		return
	}
	wantErr(t, err, accel.ErrUnavailable, missing)
}

func TestOpenNotADriverLibrary(t *testing.T) {
	cudatest.RequireCgo(t)
	// libm is on every glibc system and has no cuInit.
	_, err := cuda.Open(cuda.Options{Library: "libm.so.6"})
	wantErr(t, err, accel.ErrUnavailable, "libm.so.6", "lacks cuInit")
}

func TestOpenInvalidOptions(t *testing.T) {
	_, err := cuda.Open(cuda.Options{Ordinal: -1, CapacityBytes: -2})
	wantErr(t, err, accel.ErrInvalid, "ordinal -1", "capacity -2")
}

func TestOpenInitFails(t *testing.T) {
	opts, _ := standin(t)
	t.Setenv("STANDIN_FAIL", "cuInit:100")
	_, err := cuda.Open(opts)
	wantErr(t, err, accel.ErrUnavailable, "cuInit failed", "CUDA_ERROR_NO_DEVICE (100)", "no CUDA-capable device is detected", "cannot start")
}

func TestOpenNoDeviceAtOrdinal(t *testing.T) {
	opts, _ := standin(t)
	opts.Ordinal = 3
	_, err := cuda.Open(opts)
	wantErr(t, err, accel.ErrUnavailable, "no device at ordinal 3", "sees 1 device(s), ordinals 0..0")

	t.Setenv("STANDIN_CUDA_DEVICES", "0")
	opts.Ordinal = 0
	_, err = cuda.Probe(opts)
	wantErr(t, err, accel.ErrUnavailable, "no device at ordinal 0", "sees no CUDA devices")
}

func TestProbe(t *testing.T) {
	opts, state := standin(t)
	t.Setenv("STANDIN_CUDA_TOTAL", fmt.Sprint(64<<20))
	info, err := cuda.Probe(opts)
	if err != nil {
		t.Fatal(err)
	}
	want := cuda.Info{Ordinal: 0, Name: "Stand-in GPU 0", TotalBytes: 64 << 20, FreeBytes: 64 << 20, DriverVersion: 12040, Library: opts.Library}
	if info != want {
		t.Fatalf("Probe = %+v, want %+v", info, want)
	}
	if v := info.DriverVersionString(); v != "12.4" {
		t.Errorf("driver version %q", v)
	}
	if n := cudatest.ReadState(t, state)["contexts"]; n != 0 {
		t.Fatalf("Probe left %d primary context references", n)
	}
}

func TestDeviceRoundTrip(t *testing.T) {
	d, _ := openStandin(t)
	if d.Name() != "cuda:0 Stand-in GPU 0" {
		t.Errorf("name %q", d.Name())
	}
	if d.CapacityBytes() != 1<<30 {
		t.Errorf("capacity %d, want the free memory (1 GiB)", d.CapacityBytes())
	}
	st, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{3})
	for _, size := range []int{1, 4095, 4096, 4097, 1<<20 + 3, 16 << 20} {
		m, err := d.Alloc(int64(size) + 512)
		if err != nil {
			t.Fatal(err)
		}
		if d.UsedBytes() != int64(size)+512 {
			t.Fatalf("used %d", d.UsedBytes())
		}
		src := make([]byte, size)
		rng.Read(src)
		dst := make([]byte, size)
		if err := d.CopyToDevice(st, m, 512, src); err != nil {
			t.Fatal(err)
		}
		if err := d.CopyFromDevice(st, dst, m, 512); err != nil {
			t.Fatal(err)
		}
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("size %d: bytes differ", size)
		}
		p, err := d.Pointer(m)
		if err != nil || p == 0 {
			t.Fatalf("Pointer: %#x, %v", p, err)
		}
		if err := d.Free(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if d.UsedBytes() != 0 {
		t.Fatalf("used %d", d.UsedBytes())
	}
}

func TestDeviceOutOfMemory(t *testing.T) {
	opts, _ := standin(t)
	opts.CapacityBytes = 1 << 20
	d, err := cuda.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Alloc(1<<20 + 1); err == nil {
		t.Fatal("alloc over the configured capacity succeeded")
	} else {
		wantErr(t, err, accel.ErrOutOfMemory, "requested 1048577 bytes", "0 of 1048576 in use")
	}
	t.Setenv("STANDIN_FAIL", "cuMemAlloc_v2:2")
	_, err = d.Alloc(4096)
	wantErr(t, err, accel.ErrOutOfMemory, "cuMemAlloc_v2 failed", "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory")
	if d.UsedBytes() != 0 {
		t.Fatalf("failed alloc left used %d", d.UsedBytes())
	}
}

func TestDeviceErrorsNameCallAndCode(t *testing.T) {
	d, _ := openStandin(t)
	st, _ := d.NewStream()
	defer st.Close()

	// The stand-in's cuGetErrorName does not know 999: the bindings' own
	// table names it.
	t.Setenv("STANDIN_FAIL", "cuStreamSynchronize:999")
	err := st.Synchronize()
	wantErr(t, err, nil, "cuStreamSynchronize failed", "CUDA_ERROR_UNKNOWN (999)")
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Call != "cuStreamSynchronize" || ce.Code != 999 {
		t.Fatalf("error %#v is not a *cuda.Error for the call", err)
	}

	t.Setenv("STANDIN_FAIL", "cuMemcpyHtoDAsync_v2:12345")
	m, err := d.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	err = d.CopyToDevice(st, m, 0, []byte{1})
	wantErr(t, err, nil, "cuMemcpyHtoDAsync_v2 failed", "CUresult(12345)")

	t.Setenv("STANDIN_FAIL", "cuCtxSetCurrent:201")
	_, err = d.Alloc(16)
	wantErr(t, err, nil, "cuCtxSetCurrent (before cuMemAlloc_v2) failed", "CUDA_ERROR_INVALID_CONTEXT (201)")
	t.Setenv("STANDIN_FAIL", "")
}

func TestDeviceInvalidUse(t *testing.T) {
	d, _ := openStandin(t)
	st, _ := d.NewStream()
	m, _ := d.Alloc(4096)
	wantErr(t, d.CopyToDevice(st, m, 4000, make([]byte, 97)), accel.ErrBounds, "97 bytes at offset 4000 of a 4096-byte allocation")
	wantErr(t, d.CopyFromDevice(st, make([]byte, 1), m, -1), accel.ErrBounds)
	wantErr(t, d.CopyToDevice(nil, m, 0, []byte{1}), accel.ErrInvalid)

	sim, _ := accel.NewSim(accel.SimOptions{})
	defer sim.Close()
	sm, _ := sim.Alloc(16)
	wantErr(t, d.Free(sm), accel.ErrInvalid, "not allocated by a CUDA device")
	if _, err := d.Pointer(sm); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("Pointer of sim memory: %v", err)
	}
	if _, err := d.Alloc(0); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("Alloc(0): %v", err)
	}
	if err := d.Free(m); err != nil {
		t.Fatal(err)
	}
	wantErr(t, d.Free(m), accel.ErrInvalid, "already freed")
	wantErr(t, d.CopyToDevice(st, m, 0, []byte{1}), accel.ErrInvalid, "already freed")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Errorf("second stream close: %v", err)
	}
	m2, _ := d.Alloc(16)
	wantErr(t, d.CopyToDevice(st, m2, 0, []byte{1}), accel.ErrClosed)
	wantErr(t, st.Synchronize(), accel.ErrClosed)
}

func TestDeviceHostRegistration(t *testing.T) {
	d, state := openStandin(t)
	b := make([]byte, 1<<16)
	if err := d.RegisterHost(b); err != nil {
		t.Fatal(err)
	}
	wantErr(t, d.RegisterHost(b), nil, "cuMemHostRegister_v2 failed", "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712)")
	if n := cudatest.ReadState(t, state)["hostregs"]; n != 1 {
		t.Fatalf("hostregs %d", n)
	}
	if err := d.UnregisterHost(b); err != nil {
		t.Fatal(err)
	}
	wantErr(t, d.UnregisterHost(b), nil, "cuMemHostUnregister failed", "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED (713)")
	wantErr(t, d.RegisterHost(nil), accel.ErrInvalid)
}

func TestDeviceCloseReleasesEverything(t *testing.T) {
	opts, state := standin(t)
	d, err := cuda.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := d.Alloc(1 << 20); err != nil {
			t.Fatal(err)
		}
		if _, err := d.NewStream(); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.RegisterHost(make([]byte, 8192)); err != nil {
		t.Fatal(err)
	}
	s := cudatest.ReadState(t, state)
	if s["allocs"] != 3 || s["streams"] != 3 || s["hostregs"] != 1 || s["contexts"] != 1 {
		t.Fatalf("state before close: %v", s)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	s = cudatest.ReadState(t, state)
	for _, k := range []string{"allocs", "bytes", "streams", "hostregs", "contexts"} {
		if s[k] != 0 {
			t.Errorf("after Close, %s = %d, want 0", k, s[k])
		}
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	_, err = d.Alloc(1)
	wantErr(t, err, accel.ErrClosed)
	_, err = d.NewStream()
	wantErr(t, err, accel.ErrClosed)
	wantErr(t, d.WithContext(func() error { return nil }), accel.ErrClosed)
}

// TestDeviceContextOnEveryThread calls the device from goroutines locked to
// fresh OS threads, where no CUDA context is current: the stand-in fails
// any call made without one, so this checks that every call sets it.
func TestDeviceContextOnEveryThread(t *testing.T) {
	d, state := openStandin(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
			st, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			for i := range 50 {
				m, err := d.Alloc(int64(1 + g*1000 + i))
				if err != nil {
					errs <- err
					return
				}
				src := bytes.Repeat([]byte{byte(g)}, int(m.Size()))
				dst := make([]byte, len(src))
				if err := d.CopyToDevice(st, m, 0, src); err != nil {
					errs <- err
					return
				}
				if err := d.CopyFromDevice(st, dst, m, 0); err != nil {
					errs <- err
					return
				}
				if err := st.Synchronize(); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(src, dst) {
					errs <- fmt.Errorf("goroutine %d: bytes differ", g)
					return
				}
				if err := d.Free(m); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := cudatest.ReadState(t, state); s["allocs"] != 0 || s["streams"] != 0 {
		t.Fatalf("leaked: %v", s)
	}
}

func TestDeviceWithContext(t *testing.T) {
	d, _ := openStandin(t)
	ran := false
	if err := d.WithContext(func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("WithContext: ran %v, %v", ran, err)
	}
	boom := errors.New("boom")
	if err := d.WithContext(func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("WithContext did not return fn's error: %v", err)
	}
}

func TestDeviceCloseDuringUse(t *testing.T) {
	opts, state := standin(t)
	d, err := cuda.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := d.Alloc(4096)
				if err != nil {
					if !errors.Is(err, accel.ErrClosed) {
						t.Errorf("alloc: %v", err)
					}
					return
				}
				if err := d.Free(m); err != nil && !errors.Is(err, accel.ErrClosed) {
					t.Errorf("free: %v", err)
				}
			}
		}()
	}
	runtime.Gosched()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if s := cudatest.ReadState(t, state); s["allocs"] != 0 || s["contexts"] != 0 {
		t.Fatalf("leaked: %v", s)
	}
}
