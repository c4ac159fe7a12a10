package zinf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/test/cudatest"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/tensor"
)

// records collects log records.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *records) Enabled(context.Context, slog.Level) bool { return true }
func (c *records) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r)
	return nil
}
func (c *records) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *records) WithGroup(string) slog.Handler      { return c }

// warnings returns each warning as its message followed by its attributes.
func (c *records) warnings() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.recs {
		if r.Level != slog.LevelWarn {
			continue
		}
		s := r.Message
		r.Attrs(func(a slog.Attr) bool {
			s += " " + a.Key + "=" + a.Value.String()
			return true
		})
		out = append(out, s)
	}
	return out
}

// gpuConfig is the embedded default with swap files in a temp dir, a small
// pool, and gds set to mode.
func gpuConfig(t *testing.T, mode config.GDSMode) *config.Config {
	t.Helper()
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	c.Zinf.GDS = mode
	c.Zinf.Device = config.DeviceAuto
	if err := c.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	return c
}

// gpuModel is a two-layer model for the device I/O tests: they check what
// Open builds around it, not training.
var gpuModel = LayeredModel(
	[]tensor.Desc{{Name: "l0.w", Shape: []int{64, 16}}},
	[]tensor.Desc{{Name: "l1.w", Shape: []int{16, 8}}, {Name: "l1.b", Shape: []int{8}}},
)

// newSim returns a simulated device closed at cleanup.
func newSim(t *testing.T) *accel.Sim {
	t.Helper()
	sim, err := accel.NewSim(accel.SimOptions{CapacityBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// noCuFile points the cuFile loader at a library that does not exist, so
// Available's diagnosis is the same on every machine.
func noCuFile(t *testing.T) string {
	lib := filepath.Join(t.TempDir(), "libcufile.so.0")
	t.Setenv(gds.LibraryEnv, lib)
	return lib
}

func TestDeviceIOOff(t *testing.T) {
	logs := &records{}
	rt, err := Open(gpuConfig(t, config.GDSOff), gpuModel, Options{Logger: slog.New(logs), Device: newSim(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if rt.deviceIO != nil || rt.DeviceIOMode() != gds.ModeOff {
		t.Errorf("zinf.gds off built a DeviceIO (%s)", rt.DeviceIOMode())
	}
	if w := logs.warnings(); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
	if got := tiersFor(rt.Config, rt).CPUBytes; got != 16<<20 {
		t.Errorf("CPU tier %d, want the whole pool: nothing is held for staging", got)
	}
}

// TestDeviceIOAutoFallsBack: "auto" (or aio.use_gds) without GPUDirect
// Storage gives the bounce path, with exactly one warning that says why,
// and the bounce path moves bytes NVMe <-> device.
func TestDeviceIOAutoFallsBack(t *testing.T) {
	lib := noCuFile(t)
	// aio.use_gds true with no zinf.gds key parses to "auto".
	js := strings.Replace(string(config.DefaultJSON()), `"use_gds": false`, `"use_gds": true`, 1)
	js = strings.Replace(js, `"gds": "off",`, "", 1)
	js = strings.ReplaceAll(js, `"nvme_path": ""`, fmt.Sprintf("%q: %q", "nvme_path", t.TempDir()))
	parsed, err := config.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if parsed.Zinf.GDS != config.GDSAuto || plan.GDSMode(parsed) != gds.ModeAuto {
		t.Fatalf("aio.use_gds: zinf.gds %q, mode %q; want auto", parsed.Zinf.GDS, plan.GDSMode(parsed))
	}
	for name, cfg := range map[string]*config.Config{"zinf.gds": gpuConfig(t, config.GDSAuto), "aio.use_gds": parsed} {
		t.Run(name, func(t *testing.T) {
			cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
			logs := &records{}
			sim := newSim(t)
			rt, err := Open(cfg, gpuModel, Options{Logger: slog.New(logs), Device: sim})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := rt.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			if rt.deviceIO == nil || rt.DeviceIOMode() != gds.NameBounce {
				t.Fatalf("mode %q, want bounce", rt.DeviceIOMode())
			}
			w := logs.warnings()
			if len(w) != 1 {
				t.Fatalf("%d warnings, want exactly one: %q", len(w), w)
			}
			avail := gds.Available(plan.GDSOptions(cfg, nil))
			if avail == nil || !strings.Contains(avail.Error(), lib) && !strings.Contains(avail.Error(), "without cgo") {
				t.Fatalf("Available with a missing library: %v", avail)
			}
			for _, s := range []string{`zinf.gds is "auto"`, "GPUDirect Storage is unavailable", "bounce path (NVMe -> pinned host buffer -> device)",
				"device=sim", "reason=" + avail.Error()} {
				if !strings.Contains(w[0], s) {
					t.Errorf("warning %q does not say %q", w[0], s)
				}
			}
			// The staging buffers are counted out of the CPU tier.
			if got, want := tiersFor(cfg, rt).CPUBytes, int64(16<<20-2<<20); got != want {
				t.Errorf("CPU tier %d, want %d (the pool less two 1 MiB staging buffers)", got, want)
			}
			deviceRoundTrip(t, rt, sim)
		})
	}
}

// deviceRoundTrip writes device bytes to a file and reads them back into
// another allocation through rt.deviceIO.
func deviceRoundTrip(t *testing.T, rt *Runtime, dev accel.Device) {
	t.Helper()
	const size = 3<<20 + 4096 + 11
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	src, err := dev.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(src)
	dst, err := dev.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(dst)
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := dev.CopyToDevice(st, src, 0, want); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f, err := rt.deviceIO.OpenFile(filepath.Join(rt.Config.NVMePaths()[0], "device-io-test"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := rt.deviceIO.WriteFromDevice(ctx, f, src, 0, 4096, size); err != nil || n != size {
		t.Fatalf("WriteFromDevice = %d, %v", n, err)
	}
	if n, err := rt.deviceIO.ReadToDevice(ctx, f, dst, 0, 4096, size); err != nil || n != size {
		t.Fatalf("ReadToDevice = %d, %v", n, err)
	}
	got := make([]byte, size)
	if err := dev.CopyFromDevice(st, got, dst, 0); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("device bytes differ after the round trip through the file")
	}
}

// TestDeviceIORequired: "required" without GPUDirect Storage fails Open
// with Available's diagnosis, and warns about nothing.
func TestDeviceIORequired(t *testing.T) {
	noCuFile(t)
	cfg := gpuConfig(t, config.GDSRequired)
	logs := &records{}
	rt, err := Open(cfg, gpuModel, Options{Logger: slog.New(logs), Device: newSim(t)})
	if err == nil {
		rt.Close()
		t.Fatal("Open succeeded with zinf.gds required and no GPUDirect Storage")
	}
	if !errors.Is(err, gds.ErrUnavailable) {
		t.Errorf("error %v does not match gds.ErrUnavailable", err)
	}
	avail := gds.Available(plan.GDSOptions(cfg, nil))
	if avail == nil {
		t.Fatal("Available found GPUDirect Storage usable with a missing library")
	}
	want := `zinf: zinf.gds is "required" but GPUDirect Storage cannot be used with device sim: ` + avail.Error()
	if err.Error() != want {
		t.Errorf("error:\n  %s\nwant:\n  %s", err, want)
	}
	if w := logs.warnings(); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
}

// TestDeviceIOWithCUDAStandins: on a (stand-in) CUDA device with a
// (stand-in) cuFile, "auto" and "required" choose GPUDirect Storage
// silently; without cuFile, "auto" falls back with gds.Select's one
// warning. The GPU tier is the device's capacity, and plans use it.
func TestDeviceIOWithCUDAStandins(t *testing.T) {
	cudaLib := cudatest.Build(t)
	src, err := filepath.Abs(filepath.Join("gds", "testdata", "cufile_standin.c"))
	if err != nil {
		t.Fatal(err)
	}
	cufileLib := cudatest.CompileShared(t, src, "libcufile_standin.so")
	for _, k := range []string{"STANDIN_FAIL", "STANDIN_FAIL_AT", "STANDIN_SHORT", "STANDIN_EINTR", "STANDIN_DELAY_US", "STANDIN_REQUIRE_ODIRECT"} {
		t.Setenv(k, "")
	}
	const total = 3 << 30
	t.Setenv("STANDIN_CUDA_TOTAL", fmt.Sprint(int64(total)))
	cudatest.StateFile(t, "STANDIN_CUDA_STATE")
	cudatest.StateFile(t, "STANDIN_CUFILE_STATE")
	dev, err := cuda.Open(cuda.Options{Library: cudaLib})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })

	t.Setenv(gds.LibraryEnv, cufileLib)
	for _, mode := range []config.GDSMode{config.GDSAuto, config.GDSRequired} {
		cfg := gpuConfig(t, mode)
		cfg.Zinf.Tiers.GPUBytes = 0 // the device's memory
		if err := gds.Available(plan.GDSOptions(cfg, nil)); err != nil && !strings.Contains(err.Error(), "no usable GPU") {
			t.Skipf("the cuFile stand-in cannot run here: %v", err)
		}
		logs := &records{}
		rt, err := Open(cfg, gpuModel, Options{Logger: slog.New(logs), Device: dev})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if rt.DeviceIOMode() != gds.NameGDS {
			t.Errorf("%s: mode %q, want gds", mode, rt.DeviceIOMode())
		}
		if w := logs.warnings(); len(w) != 0 {
			t.Errorf("%s: warnings %q", mode, w)
		}
		if got := rt.GPUCapacityBytes(); got != dev.CapacityBytes() || got <= 0 {
			t.Errorf("GPU capacity %d, want the device's %d", got, dev.CapacityBytes())
		}
		if tiers := tiersFor(cfg, rt); tiers.GPUBytes != dev.CapacityBytes() || tiers.CPUBytes != 16<<20 {
			t.Errorf("tiers %+v: want the device's %d bytes and the whole pool (cuFile stages nothing)", tiers, dev.CapacityBytes())
		}
		if tiersFor(cfg).GPUBytes != int64(config.DefaultSimGPUBytes) {
			t.Errorf("without a runtime the GPU tier is %d, want the config's default", tiersFor(cfg).GPUBytes)
		}
		if mode == config.GDSAuto {
			deviceRoundTrip(t, rt, dev)
		}
		if err := rt.Close(); err != nil {
			t.Errorf("%s: Close: %v", mode, err)
		}
	}

	// A cuFile whose driver opens but which refuses every file of the disk
	// (CU_FILE_HANDLE_NOT_REGISTERED, as cuFile does on a virtio disk; seen
	// on an H200 lent for the GPU checks, where "auto" then failed the first
	// swap-in): Open checks a file on each NVMe path, so "auto" takes the
	// bounce path with one warning naming the path and the code, and its
	// swap-ins work; "required" is refused at Open.
	t.Setenv("STANDIN_FAIL", "cuFileHandleRegister:5027")
	cfg := gpuConfig(t, config.GDSAuto)
	logs := &records{}
	rt, err := Open(cfg, gpuModel, Options{Logger: slog.New(logs), Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	if rt.DeviceIOMode() != gds.NameBounce {
		t.Errorf("every registration refused: mode %q, want bounce", rt.DeviceIOMode())
	}
	path := cfg.NVMePaths()[0]
	if w := logs.warnings(); len(w) != 1 || !strings.Contains(w[0], "does not register a file in "+path) || !strings.Contains(w[0], "5027") {
		t.Errorf("warnings %q, want one naming %s and cuFile's code", w, path)
	}
	deviceRoundTrip(t, rt, dev)
	ctx := context.Background()
	for _, d := range gpuModel.Tensors {
		n, _ := d.Numel()
		if err := rt.Init(ctx, d.Name, make([]float32, n)); err != nil {
			t.Fatal(err)
		}
	}
	for l := range rt.Layers() {
		if err := rt.BeginLayer(ctx, l); err != nil {
			t.Fatalf("layer %d with the bounce path chosen: %v", l, err)
		}
		rt.EndLayer(l)
	}
	if err := rt.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	_, err = Open(gpuConfig(t, config.GDSRequired), gpuModel, Options{Logger: slog.New(&records{}), Device: dev})
	if !errors.Is(err, gds.ErrUnavailable) || !strings.Contains(err.Error(), "does not register a file in") {
		t.Errorf("required with every registration refused: %v", err)
	}
	t.Setenv("STANDIN_FAIL", "")

	// Without cuFile on the CUDA device: one warning (gds.Select's), the
	// bounce path; required fails with Available's error.
	lib := noCuFile(t)
	logs = &records{}
	rt, err = Open(gpuConfig(t, config.GDSAuto), gpuModel, Options{Logger: slog.New(logs), Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	if rt.DeviceIOMode() != gds.NameBounce {
		t.Errorf("mode %q, want bounce", rt.DeviceIOMode())
	}
	if w := logs.warnings(); len(w) != 1 || !strings.Contains(w[0], "bounce path") || !strings.Contains(w[0], lib) {
		t.Errorf("warnings %q, want one naming the bounce path and %s", w, lib)
	}
	deviceRoundTrip(t, rt, dev)
	if err := rt.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	_, err = Open(gpuConfig(t, config.GDSRequired), gpuModel, Options{Logger: slog.New(&records{}), Device: dev})
	if !errors.Is(err, gds.ErrUnavailable) || !strings.Contains(err.Error(), `zinf.gds is "required"`) || !strings.Contains(err.Error(), lib) {
		t.Errorf("required without cuFile: %v", err)
	}
}

func TestGDSMode(t *testing.T) {
	c := config.Default()
	for _, tc := range []struct {
		gds    config.GDSMode
		useGDS bool
		want   string
	}{
		{"", false, gds.ModeOff},
		{"", true, gds.ModeAuto},
		{config.GDSOff, true, gds.ModeOff},
		{config.GDSRequired, false, gds.ModeRequired},
	} {
		c.Zinf.GDS, c.AIO.UseGDS = tc.gds, tc.useGDS
		if got := plan.GDSMode(c); got != tc.want {
			t.Errorf("zinf.gds %q, use_gds %v: %q, want %q", tc.gds, tc.useGDS, got, tc.want)
		}
	}
}

// tierBytes returns the GPU and pinned-CPU capacities that runtimes opened
// with cfg give placement: the smallest GPU capacity among them, and the
// pinned pool less the most any of them holds for device I/O staging.
func tierBytes(cfg *config.Config, rts []*Runtime) (gpuBytes, cpuBytes int64) {
	gpuBytes, cpuBytes = cfg.GPUBytes(0), int64(cfg.Zinf.Tiers.CPUPinnedBytes)
	var staging int64
	first := true
	for _, rt := range rts {
		if rt == nil {
			continue
		}
		if g := rt.GPUCapacityBytes(); first || g < gpuBytes {
			gpuBytes = g
		}
		first = false
		staging = max(staging, rt.deviceIOStagingBytes)
	}
	return gpuBytes, max(cpuBytes-staging, 0)
}

// tiersFor maps a config's tiers to the policy's view of them. Given the
// runtimes opened with cfg, the GPU tier is the device memory they have (a
// CUDA device's capacity when zinf.tiers.gpu_bytes is unset; see
// Runtime.GPUCapacityBytes), the CPU tier leaves out the pinned staging
// buffers their device I/O holds, and the NVMe bandwidth is the one the
// first runtime planned with (Runtime.Bandwidth). Without runtimes it is
// what the config says, and the NVMe bandwidth is the config's figures
// (zinf.bandwidth.read_bytes_per_sec, write_bytes_per_sec) or the defaults
// per path: no file is read and nothing probed (NVMeBandwidth does that).
func tiersFor(cfg *config.Config, rts ...*Runtime) policy.Tiers {
	bw := plan.StaticBandwidth(cfg)
	for _, rt := range rts {
		if rt != nil {
			bw = rt.bandwidth
			break
		}
	}
	gpuBytes, cpuBytes := tierBytes(cfg, rts)
	return plan.Tiers(cfg, bw, gpuBytes, cpuBytes)
}
