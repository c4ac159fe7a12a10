package iobench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/test/cudatest"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// gpuOpts is a small device measurement in a fresh directory.
func gpuOpts(t *testing.T, op string, size int64) GPUOptions {
	return GPUOptions{
		Options: Options{Dir: t.TempDir(), SizeBytes: size, Op: op, Loops: 2, Warmup: 1, Logger: quietLogger(),
			Engine: aio.Options{BlockSizeBytes: 256 << 10, QueueDepth: 4, IntraOpParallelism: 2}},
		Device: DeviceSim,
		Verify: true,
	}
}

// TestRunGPUSimRoundTrip writes a device buffer through the bounce path to
// a file and reads it back into the device, with Verify checking the bytes
// both ways, for sizes aligned and not (buffered files for the unaligned
// ones), on the simulated device.
func TestRunGPUSimRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		size   int64
		direct aio.DirectPolicy
	}{
		{4096, aio.DirectOptional},
		{3 << 20, aio.DirectOptional},
		{3<<20 + 123, aio.DirectOff},
		{1<<20 - 1, aio.DirectOff},
	} {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			w := gpuOpts(t, "write", tc.size)
			w.Engine.Direct = tc.direct
			w.Keep = true
			res, err := RunGPU(context.Background(), w)
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, res, "write", tc.size, 2)
			if res.Device != DeviceSim || res.Mode != gds.NameBounce || res.DeviceName != "sim" {
				t.Errorf("device %q (%q), mode %q; want sim, bounce", res.Device, res.DeviceName, res.Mode)
			}
			if res.BounceBlock <= 0 || res.BouncePar != 2 {
				t.Errorf("bounce block %d, parallel %d", res.BounceBlock, res.BouncePar)
			}
			st, err := os.Stat(res.Path)
			if err != nil || st.Size() < tc.size {
				t.Fatalf("kept file: %v, %v", st, err)
			}
			// The file holds the pattern the device held.
			want := make([]byte, tc.size)
			fillPattern(want, 0)
			got, err := os.ReadFile(res.Path)
			if err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(got[:tc.size], want); i >= 0 {
				t.Fatalf("file differs from the device pattern at %d", i)
			}

			// Read the same file back into a device buffer; Verify compares
			// the device's bytes with the file's.
			r := w
			r.Op = "read"
			r.Keep = false
			res, err = RunGPU(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, res, "read", tc.size, 2)
			if _, err := os.Stat(res.Path); err != nil {
				t.Errorf("a read must not remove a file it did not create: %v", err)
			}
		})
	}
}

func checkResult(t *testing.T, res *GPUResult, op string, size int64, loops int) {
	t.Helper()
	if res.Op != op || res.Bytes != size || res.Loops != loops || len(res.GBps) != loops {
		t.Errorf("result %+v: want op %s, %d bytes, %d loops", res.Result, op, size, loops)
	}
	if res.GBpsMedian <= 0 || res.GBpsMin > res.GBpsMedian || res.GBpsMax < res.GBpsMedian {
		t.Errorf("bandwidths: median %g min %g max %g", res.GBpsMedian, res.GBpsMin, res.GBpsMax)
	}
	if res.Verified == nil || !*res.Verified {
		t.Errorf("not verified")
	}
}

// TestRunGPUAutoFallsBackToSim: with --device auto and no GPU (the CUDA
// library cannot load), the simulated device is used and the result says
// so and why.
func TestRunGPUAutoFallsBackToSim(t *testing.T) {
	o := gpuOpts(t, "write", 1<<20)
	o.Device = DeviceAuto
	o.CUDA = cuda.Options{Library: filepath.Join(t.TempDir(), "libcuda.so.1")}
	res, err := RunGPU(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Device != DeviceSim || !strings.Contains(res.DeviceNote, "simulated") || !strings.Contains(res.DeviceNote, "libcuda.so.1") {
		t.Errorf("device %q, note %q", res.Device, res.DeviceNote)
	}
	// And --device cuda fails with the reason instead.
	o.Device = DeviceCUDA
	_, err = RunGPU(context.Background(), o)
	if !errors.Is(err, accel.ErrUnavailable) || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf("--device cuda without a GPU: %v", err)
	}
}

// TestRunGPUGDSUnavailable: --gds where GPUDirect Storage cannot run fails
// with gds.Available's error, before anything is created.
func TestRunGPUGDSUnavailable(t *testing.T) {
	o := gpuOpts(t, "read", 1<<20)
	o.Device = DeviceAuto
	o.GDS = true
	o.GDSLibrary = filepath.Join(t.TempDir(), "libcufile.so.0")
	_, err := RunGPU(context.Background(), o)
	if !errors.Is(err, gds.ErrUnavailable) {
		t.Fatalf("got %v, want an error matching gds.ErrUnavailable", err)
	}
	want := gds.Available(gds.Options{Library: o.GDSLibrary, Paths: []string{o.Dir}})
	if want == nil || err.Error() != want.Error() {
		t.Errorf("error %q, want Available's %q", err, want)
	}
	if ents, _ := os.ReadDir(o.Dir); len(ents) != 0 {
		t.Errorf("left %d entries in %s", len(ents), o.Dir)
	}

	// --gds with the simulated device is refused outright.
	o.Device = DeviceSim
	_, err = RunGPU(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "--gds needs a CUDA device") {
		t.Errorf("--gds --device sim: %v", err)
	}
}

func TestGPUOptionsCheck(t *testing.T) {
	o := gpuOpts(t, "read", 1<<20)
	o.Device = "tpu"
	o.Naive = true
	o.BounceBlockBytes = 1000
	err := o.Check()
	for _, s := range []string{`--device "tpu"`, "--naive", "--bounce-block 1000"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("Check() = %v; want it to mention %s", err, s)
		}
	}
}

func TestBounceBlockDefault(t *testing.T) {
	for _, tc := range []struct {
		block, qd int
		size      int64
		want      int64
	}{
		{1 << 20, 32, 1 << 30, 32 << 20},
		{1 << 20, 32, 4 << 20, 4 << 20},
		{1 << 20, 32, 5000, 8192},
		{256 << 10, 1, 1 << 30, 256 << 10},
	} {
		o := GPUOptions{Options: Options{SizeBytes: tc.size, Engine: aio.Options{BlockSizeBytes: tc.block, QueueDepth: tc.qd}}}
		if got := o.bounceBlock(); got != tc.want {
			t.Errorf("block %d qd %d size %d: %d, want %d", tc.block, tc.qd, tc.size, got, tc.want)
		}
	}
}

// TestCompareDeviceFindsMismatch: the verifier names the first differing
// offset.
func TestCompareDeviceFindsMismatch(t *testing.T) {
	const size = 3*verifyChunkBytes/2 + 5
	dev, err := accel.NewSim(accel.SimOptions{CapacityBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	m, err := dev.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	if err := fillDevice(dev, m, size); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	fillPattern(want, 0)
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	df, err := claimDataFile(path, "read", size, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := compareDevice(dev, m, df, size); err != nil {
		t.Fatalf("equal bytes: %v", err)
	}
	if err := compareFile(df, size); err != nil {
		t.Fatalf("equal bytes: %v", err)
	}
	const bad = verifyChunkBytes + 77
	want[bad] ^= 0xff
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := compareDevice(dev, m, df, size); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", bad)) {
		t.Errorf("compareDevice: %v, want a mismatch at %d", err, bad)
	}
	if err := compareFile(df, size); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", bad)) {
		t.Errorf("compareFile: %v, want a mismatch at %d", err, bad)
	}
}

// TestFillPatternRanges: any range of the pattern regenerates alone.
func TestFillPatternRanges(t *testing.T) {
	all := make([]byte, 3*patternChunkBytes)
	fillPattern(all, 0)
	for _, r := range [][2]int64{{0, 10}, {patternChunkBytes - 3, 7}, {patternChunkBytes + 5, 2*patternChunkBytes - 5}} {
		b := make([]byte, r[1])
		fillPattern(b, r[0])
		if i := firstDiff(b, all[r[0]:r[0]+r[1]]); i >= 0 {
			t.Errorf("range %v differs at %d", r, i)
		}
	}
}

// standinSource returns a file of the repository, relative to this one.
func standinSource(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", rel)
}

// TestRunGPUStandins runs both modes against the stand-in CUDA driver and
// cuFile libraries: the bounce path to a "CUDA" device, and GPUDirect
// Storage, each a verified write + read round trip.
func TestRunGPUStandins(t *testing.T) {
	cudaLib := cudatest.Build(t)
	cufileLib := cudatest.CompileShared(t, standinSource("gds/testdata/cufile_standin.c"), "libcufile_standin.so")
	for _, k := range []string{"STANDIN_FAIL", "STANDIN_FAIL_AT", "STANDIN_SHORT", "STANDIN_EINTR", "STANDIN_DELAY_US", "STANDIN_REQUIRE_ODIRECT"} {
		t.Setenv(k, "")
	}
	t.Setenv("STANDIN_CUDA_TOTAL", fmt.Sprint(int64(1)<<30))
	cudaState := cudatest.StateFile(t, "STANDIN_CUDA_STATE")
	cufileState := cudatest.StateFile(t, "STANDIN_CUFILE_STATE")
	for _, useGDS := range []bool{false, true} {
		t.Run(fmt.Sprintf("gds=%v", useGDS), func(t *testing.T) {
			dir := t.TempDir()
			if useGDS {
				if err := gds.Available(gds.Options{Library: cufileLib, CUDA: cuda.Options{Library: cudaLib}, Paths: []string{dir}}); err != nil {
					t.Skipf("the cuFile stand-in cannot run here: %v", err)
				}
			}
			for _, op := range []string{"write", "read"} {
				o := gpuOpts(t, op, 2<<20+4096)
				o.Dir, o.Keep = dir, true
				o.Device, o.GDS = DeviceAuto, useGDS
				o.CUDA = cuda.Options{Library: cudaLib}
				o.GDSLibrary = cufileLib
				res, err := RunGPU(context.Background(), o)
				if err != nil {
					t.Fatalf("%s: %v", op, err)
				}
				checkResult(t, res, op, o.SizeBytes, 2)
				wantMode := gds.NameBounce
				if useGDS {
					wantMode = gds.NameGDS
				}
				if res.Device != DeviceCUDA || res.Mode != wantMode || res.DeviceNote != "" {
					t.Errorf("%s: device %q, mode %q, note %q; want cuda, %s", op, res.Device, res.Mode, res.DeviceNote, wantMode)
				}
			}
			// Everything was given back: device memory, streams, cuFile
			// handles, buffers and the driver.
			for file, keys := range map[string][]string{cudaState: {"allocs", "bytes", "streams", "hostregs", "contexts"}, cufileState: {"handles", "bufs", "driver"}} {
				st := cudatest.ReadState(t, file)
				for _, k := range keys {
					if st[k] != 0 {
						t.Errorf("%s: %s = %d after the runs (%v)", filepath.Base(file), k, st[k], st)
					}
				}
			}
		})
	}
}
