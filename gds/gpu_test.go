package gds_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/test/testenv"
)

// The tests in this file need a real NVIDIA GPU and run only with
// ZINF_GPU_TESTS=1:
//
//	ZINF_GPU_TESTS=1 go test -run GPU -v ./gds/
//
// ZINF_GPU_TEST_DIR names the directory for the test files (an NVMe
// filesystem, ideally; default a temporary directory). With
// ZINF_GPU_TESTS_REQUIRE_GDS=1, or with "gds" in ZINF_REQUIRE_BACKENDS, the
// cuFile test fails, rather than skips, when GPUDirect Storage is
// unavailable.

// gpuSizes go from 4 KiB to 1 GiB, aligned and not.
var gpuSizes = []int64{4096, 4097, 1<<20 - 1, 1 << 20, 64<<20 + 512, 256<<20 - 4095, 1 << 30}

func requireGPU(t *testing.T) *cuda.Device {
	t.Helper()
	if os.Getenv("ZINF_GPU_TESTS") != "1" {
		t.Skip("set ZINF_GPU_TESTS=1 to run the tests that need a real NVIDIA GPU")
	}
	dev, err := cuda.Open(cuda.Options{})
	if err != nil {
		t.Fatalf("ZINF_GPU_TESTS=1 but no GPU: %v", err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("closing the device: %v", err)
		}
	})
	t.Logf("device %s, %d MiB capacity, driver %s", dev.Name(), dev.CapacityBytes()>>20, dev.Info().DriverVersionString())
	return dev
}

func gpuDir(t *testing.T) string {
	if d := os.Getenv("ZINF_GPU_TEST_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "zinf-gpu-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

// gpuRoundTrip writes random bytes to a file, reads them to the device,
// checks the device's bytes, writes them back to another file at another
// offset and checks that file's bytes.
func gpuRoundTrip(t *testing.T, dio gds.DeviceIO, dev *cuda.Device, dir string, size int64, seed uint64) {
	ctx := context.Background()
	const fileOff, memOff = 4096*3 + 7, 512
	want := randomBytes(seed, size)
	src := filepath.Join(dir, fmt.Sprintf("%s-src-%d", dio.Mode(), size))
	if err := os.WriteFile(src, append(make([]byte, fileOff), want...), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(src)
	in, err := dio.OpenFile(src, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	m, err := dev.Alloc(size + memOff)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(m)
	if e, ok := dio.(*gds.Engine); ok {
		if err := e.RegisterBuffer(m); err != nil {
			t.Fatal(err)
		}
		defer e.DeregisterBuffer(m)
	}
	if n, err := dio.ReadToDevice(ctx, in, m, memOff, fileOff, size); err != nil || n != size {
		t.Fatalf("ReadToDevice(%d) = %d, %v", size, n, err)
	}
	sameBytes(t, "device", download(t, dev, m, memOff, size), want)

	dst := filepath.Join(dir, fmt.Sprintf("%s-dst-%d", dio.Mode(), size))
	defer os.Remove(dst)
	out, err := dio.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if n, err := dio.WriteFromDevice(ctx, out, m, memOff, 1<<20+3, size); err != nil || n != size {
		t.Fatalf("WriteFromDevice(%d) = %d, %v", size, n, err)
	}
	sameBytes(t, "file", fileBytes(t, dst, 1<<20+3, size), want)
}

func TestGPUBounceRoundTrip(t *testing.T) {
	dev := requireGPU(t)
	eng, err := aio.New(aio.Options{BlockSizeBytes: 8 << 20, IntraOpParallelism: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	b, err := gds.NewBounce(dev, eng, pool, gds.BounceOptions{BlockSizeBytes: 8 << 20, Parallelism: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dir := gpuDir(t)
	for i, size := range gpuSizes {
		t.Run(fmt.Sprint(size), func(t *testing.T) { gpuRoundTrip(t, b, dev, dir, size, uint64(i)) })
	}
}

func TestGPUCuFileRoundTrip(t *testing.T) {
	dev := requireGPU(t)
	dir := gpuDir(t)
	opts := gds.Options{BlockSizeBytes: 8 << 20, Parallelism: 4, Paths: []string{dir}}
	if err := gds.Available(opts); err != nil {
		if os.Getenv("ZINF_GPU_TESTS_REQUIRE_GDS") == "1" {
			t.Fatalf("GPUDirect Storage unavailable: %v", err)
		}
		testenv.SkipUnavailable(t, "gds", err)
	}
	e, err := gds.Open(dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Close(); err != nil {
			t.Errorf("closing the engine: %v", err)
		}
	}()
	// A driver that opens is not enough: cuFile may refuse every file of
	// the disk (5027 on the lent machines' virtio disk), which "auto"
	// checks the same way before choosing GPUDirect Storage.
	if err := gds.RegistrationCheck(e, opts.Paths); err != nil {
		if os.Getenv("ZINF_GPU_TESTS_REQUIRE_GDS") == "1" {
			t.Fatalf("GPUDirect Storage unavailable: %v", err)
		}
		testenv.SkipUnavailable(t, "gds", err)
	}
	for i, size := range gpuSizes {
		t.Run(fmt.Sprint(size), func(t *testing.T) { gpuRoundTrip(t, e, dev, dir, size, uint64(100+i)) })
	}
	t.Logf("engine stats %+v", e.Stats())
}
