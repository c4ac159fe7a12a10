package param

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/test/cudatest"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

// devEnv is a pool, an aio engine with a fault injector, a store over
// paths directories striped in stripe bytes, a device and a DeviceIO
// (the bounce path over the device unless the test supplies another).
// Cleanup closes them in order and checks for leaks.
type devEnv struct {
	pool  *buffers.Pool
	eng   aio.Engine
	store *swapper.Store
	inj   *faults.Injector
	dev   accel.Device
	dio   gds.DeviceIO
}

type devEnvOpts struct {
	paths     int
	stripe    int64
	checksums bool
	dev       accel.Device               // default: a Sim of simBytes
	simBytes  int64                      // default 64 MiB
	dio       func(*devEnv) gds.DeviceIO // default: the bounce path
}

func newDevEnv(t *testing.T, o devEnvOpts) *devEnv {
	t.Helper()
	e := &devEnv{inj: faults.New(1)}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 16 << 20, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.pool = pool
	t.Cleanup(func() {
		if n := pool.Stats().Outstanding; n != 0 {
			t.Errorf("%d pool buffers outstanding after everything closed", n)
		}
		pool.Close()
	})
	eng, err := aio.New(aio.Options{Backend: aio.BackendPosix, Faults: e.inj, Logger: quiet, BlockSizeBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	e.eng = eng
	t.Cleanup(func() { eng.Close() })
	var dirs []string
	for range max(o.paths, 1) {
		dirs = append(dirs, t.TempDir())
	}
	st, err := swapper.OpenStore(swapper.StoreOptions{Paths: dirs, Engine: eng, Name: "devtest", Checksums: o.checksums, StripeBytes: o.stripe, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	t.Cleanup(func() { st.Close() })
	e.dev = o.dev
	if e.dev == nil {
		if o.simBytes == 0 {
			o.simBytes = 64 << 20
		}
		sim, err := accel.NewSim(accel.SimOptions{CapacityBytes: o.simBytes})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if u := sim.UsedBytes(); u != 0 {
				t.Errorf("%d bytes of device memory still allocated after everything closed", u)
			}
			sim.Close()
		})
		e.dev = sim
	}
	if o.dio != nil {
		e.dio = o.dio(e)
	} else {
		b, err := gds.NewBounce(e.dev, eng, pool, gds.BounceOptions{BlockSizeBytes: 64 << 10, Parallelism: 2, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		e.dio = b
	}
	t.Cleanup(func() {
		if err := e.dio.Close(); err != nil {
			t.Errorf("closing the DeviceIO: %v", err)
		}
	})
	return e
}

func (e *devEnv) swapper(t *testing.T, o Options) *Swapper {
	t.Helper()
	o.Store, o.Pool, o.Device, o.DeviceIO, o.Logger = e.store, e.pool, e.dev, e.dio, quiet
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("swapper close: %v", err)
		}
	})
	return s
}

// TestDeviceResidentRoundTrip swaps NVMe partitions into device memory
// through the bounce path, for several dtypes and sizes, on one path and
// striped over two, with checksums on, and reads them back bit for bit.
func TestDeviceResidentRoundTrip(t *testing.T) {
	sizes := []int{1, 1000, 40000, 70001}
	for _, paths := range []int{1, 2} {
		for _, dt := range []swapper.DType{swapper.Float32, swapper.BFloat16} {
			t.Run(fmt.Sprintf("paths=%d/%s", paths, dt), func(t *testing.T) {
				e := newDevEnv(t, devEnvOpts{paths: paths, stripe: 16 << 10, checksums: true})
				s := e.swapper(t, Options{DType: dt, BufferCount: 3})
				ctx := testCtx(t)
				for i, n := range sizes {
					if err := s.Register(name(i), n, swapper.TierNVMe); err != nil {
						t.Fatal(err)
					}
					if err := s.Init(ctx, name(i), values(uint64(i), n)); err != nil {
						t.Fatal(err)
					}
				}
				storeReads := e.store.Stats().Reads
				for i, n := range sizes {
					if err := s.Prefetch(name(i)); err != nil {
						t.Fatal(err)
					}
					if err := s.Wait(ctx, name(i)); err != nil {
						t.Fatal(err)
					}
					if st := s.State(name(i)); st != Resident {
						t.Fatalf("%s: state %v", name(i), st)
					}
					st := s.Stats()
					if st.DeviceBytes == 0 || st.ResidentBytes != 0 {
						t.Errorf("%s: device bytes %d, pinned resident bytes %d: want the copy on the device only", name(i), st.DeviceBytes, st.ResidentBytes)
					}
					sameBits(t, name(i), read(t, s, name(i)), expect(dt, values(uint64(i), n)))
					s.Release(name(i))
				}
				if got := e.store.Stats().Reads; got != storeReads {
					t.Errorf("the store served %d host reads; device swap-ins must not use it", got-storeReads)
				}
				if st := e.dio.(*gds.Bounce).Stats(); st.ReadOps == 0 {
					t.Errorf("the DeviceIO read nothing: %+v", st)
				}
				if st := s.Stats(); st.SwapIns != int64(len(sizes)) || st.DeviceBytes != 0 {
					t.Errorf("stats after release: %+v", st)
				}
				if u := e.dev.UsedBytes(); u != 0 {
					t.Errorf("%d device bytes held after every partition was released", u)
				}
			})
		}
	}
}

// TestDeviceRunsMerge: on one path a partition is one request; striped
// over two paths it is one per stripe chunk.
func TestDeviceRunsMerge(t *testing.T) {
	for _, tc := range []struct{ paths, want int }{{1, 1}, {2, 5}} {
		e := newDevEnv(t, devEnvOpts{paths: tc.paths, stripe: 16 << 10})
		s := e.swapper(t, Options{})
		ctx := testCtx(t)
		const n = 18000 // 72000 bytes: 5 chunks of 16 KiB
		s.Register("w", n, swapper.TierNVMe)
		if err := s.Init(ctx, "w", values(1, n)); err != nil {
			t.Fatal(err)
		}
		runs, err := s.deviceRuns("w", e.store.PaddedLen(4*n))
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) != tc.want {
			t.Errorf("%d paths: %d runs %+v, want %d", tc.paths, len(runs), runs, tc.want)
		}
		var total int64
		for _, r := range runs {
			total += r.n
		}
		if total != e.store.PaddedLen(4*n) {
			t.Errorf("runs cover %d bytes of %d", total, e.store.PaddedLen(4*n))
		}
	}
}

// TestDeviceResidentUpdates: a committed update replaces a resident device
// copy; the next read sees the new values.
func TestDeviceResidentUpdates(t *testing.T) {
	e := newDevEnv(t, devEnvOpts{checksums: true})
	s := e.swapper(t, Options{DType: swapper.BFloat16})
	ctx := testCtx(t)
	const n = 30000
	s.Register("w", n, swapper.TierNVMe)
	if err := s.Init(ctx, "w", values(1, n)); err != nil {
		t.Fatal(err)
	}
	if err := s.SwapIn(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "before", read(t, s, "w"), expect(swapper.BFloat16, values(1, n)))
	w, err := s.StageUpdate(ctx, "w", values(2, n))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitUpdates(); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "after the update", read(t, s, "w"), expect(swapper.BFloat16, values(2, n)))
}

// TestDeviceResidentReadError: a failed device swap-in frees its device
// memory, reports the tensor, and a later Wait retries it.
func TestDeviceResidentReadError(t *testing.T) {
	e := newDevEnv(t, devEnvOpts{})
	s := e.swapper(t, Options{})
	ctx := testCtx(t)
	s.Register("blocks.1.mlp", 5000, swapper.TierNVMe)
	if err := s.Init(ctx, "blocks.1.mlp", values(3, 5000)); err != nil {
		t.Fatal(err)
	}
	e.inj.Add(faults.Rule{Kind: faults.Reads, Err: syscall.EIO})
	err := s.SwapIn(ctx, "blocks.1.mlp")
	if !errors.Is(err, aio.ErrIO) || !strings.Contains(err.Error(), `"blocks.1.mlp"`) {
		t.Fatalf("swap-in with EIO: %v", err)
	}
	if st := s.State("blocks.1.mlp"); st != OnNVMe {
		t.Fatalf("state after a failed swap-in: %v", st)
	}
	if u := e.dev.UsedBytes(); u != 0 {
		t.Errorf("a failed swap-in left %d device bytes allocated", u)
	}
	e.inj.Clear()
	if err := s.Wait(ctx, "blocks.1.mlp"); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "after retry", read(t, s, "blocks.1.mlp"), values(3, 5000))
}

// TestDeviceResidentBackpressure: with room on the device for one
// partition, a second swap-in waits for the first partition's Release
// instead of failing; with nothing to wait for, a full device is an error
// that says so.
func TestDeviceResidentBackpressure(t *testing.T) {
	const n = 16384 // 64 KiB in fp32
	e := newDevEnv(t, devEnvOpts{simBytes: 64 << 10})
	s := e.swapper(t, Options{})
	ctx := testCtx(t)
	for i := range 2 {
		s.Register(name(i), n, swapper.TierNVMe)
		if err := s.Init(ctx, name(i), values(uint64(i), n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SwapIn(ctx, name(0)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.SwapIn(ctx, name(1)) }()
	select {
	case err := <-done:
		t.Fatalf("second swap-in finished with the device full: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	sameBits(t, name(0), read(t, s, name(0)), values(0, n))
	s.Release(name(0))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameBits(t, name(1), read(t, s, name(1)), values(1, n))
	s.Release(name(1))

	// Someone else fills the device: nothing of the swapper's to wait for.
	m, err := e.dev.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer e.dev.Free(m)
	err = s.SwapIn(ctx, name(0))
	if !errors.Is(err, accel.ErrOutOfMemory) || !strings.Contains(err.Error(), "no room") || !strings.Contains(err.Error(), name(0)) {
		t.Errorf("swap-in to a full device: %v", err)
	}
}

// TestDeviceResidentCuFile runs device swap-ins through GPUDirect Storage
// against the stand-in CUDA driver and cuFile libraries.
func TestDeviceResidentCuFile(t *testing.T) {
	cudaLib := cudatest.Build(t)
	src, err := filepath.Abs(filepath.Join("..", "..", "gds", "testdata", "cufile_standin.c"))
	if err != nil {
		t.Fatal(err)
	}
	cufileLib := cudatest.CompileShared(t, src, "libcufile_standin.so")
	for _, k := range []string{"STANDIN_FAIL", "STANDIN_FAIL_AT", "STANDIN_SHORT", "STANDIN_EINTR", "STANDIN_DELAY_US", "STANDIN_REQUIRE_ODIRECT"} {
		t.Setenv(k, "")
	}
	t.Setenv("STANDIN_CUDA_TOTAL", fmt.Sprint(int64(256)<<20))
	cufileState := cudatest.StateFile(t, "STANDIN_CUFILE_STATE")
	dev, err := cuda.Open(cuda.Options{Library: cudaLib})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if u := dev.UsedBytes(); u != 0 {
			t.Errorf("%d device bytes still allocated", u)
		}
		dev.Close()
	})
	e := newDevEnv(t, devEnvOpts{paths: 2, stripe: 16 << 10, dev: dev, dio: func(*devEnv) gds.DeviceIO {
		eng, err := gds.Open(dev, gds.Options{Library: cufileLib, BlockSizeBytes: 16 << 10, Parallelism: 2, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}})
	s := e.swapper(t, Options{DType: swapper.Float16})
	ctx := testCtx(t)
	for i, n := range []int{777, 50000} {
		s.Register(name(i), n, swapper.TierNVMe)
		if err := s.Init(ctx, name(i), values(uint64(i), n)); err != nil {
			t.Fatal(err)
		}
		if err := s.SwapIn(ctx, name(i)); err != nil {
			t.Fatal(err)
		}
		sameBits(t, name(i), read(t, s, name(i)), expect(swapper.Float16, values(uint64(i), n)))
		s.Release(name(i))
	}
	if st := e.dio.(*gds.Engine).Stats(); st.ReadBytes == 0 {
		t.Errorf("cuFile read nothing: %+v", st)
	}
	if st := cudatest.ReadState(t, cufileState); st["bytes_read"] == 0 {
		t.Errorf("the cuFile stand-in saw no reads: %v", st)
	}
}

func TestDeviceIONeedsDevice(t *testing.T) {
	e := newDevEnv(t, devEnvOpts{})
	_, err := New(Options{Pool: e.pool, Store: e.store, DeviceIO: e.dio})
	if err == nil || !strings.Contains(err.Error(), "Options.DeviceIO") {
		t.Errorf("DeviceIO without Device: %v", err)
	}
}
