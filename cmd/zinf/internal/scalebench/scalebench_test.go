package scalebench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/base/blockdev"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestRunSmall runs the bench at a small size: the model reaches the state
// asked for, every step moves what the model says (each step reads every
// parameter twice, its gradient and its 12 bytes of optimizer state, and
// writes the gradient, the states and the parameter: 24 and 20 bytes per
// fp32 parameter), the sampled check ran, the prediction follows from the
// bytes and the measured bandwidth, and nothing is left in the path.
func TestRunSmall(t *testing.T) {
	dir := t.TempDir()
	var out strings.Builder
	r, err := Run(context.Background(), Options{Dir: dir, StateBytes: 4 << 20, PoolBytes: 16 << 20, Width: 64, Steps: 2, ProbeBytes: 1 << 20, Progress: &out, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if r.StateBytes < 4<<20 || r.StateBytes != 20*r.Params || r.Params != int64(r.Layers)*(64*64+64) {
		t.Fatalf("state %d bytes, %d params, %d layers", r.StateBytes, r.Params, r.Layers)
	}
	if len(r.StepMs) != 2 || len(r.ReadBytes) != 2 || len(r.ServedBytes) != 2 || len(r.PredictedMs) != 2 || len(r.IOWaitMs) != 2 {
		t.Fatalf("per-step figures: %+v", r)
	}
	rbw, wbw := (r.Before.ReadGBps+r.After.ReadGBps)/2*1e9, (r.Before.WriteGBps+r.After.WriteGBps)/2*1e9
	for i := range r.StepMs {
		// A gradient served from pinned memory while written is not read
		// back: it counts where the model counts its read.
		if r.ReadBytes[i]+r.ServedBytes[i] < 24*r.Params || r.ServedBytes[i] > 4*r.Params || r.WriteBytes[i] != 20*r.Params {
			t.Errorf("step %d read %d (+ %d gradient bytes served) and wrote %d bytes; the model says at least %d and %d", i+1, r.ReadBytes[i], r.ServedBytes[i], r.WriteBytes[i], 24*r.Params, 20*r.Params)
		}
		if want := (float64(r.ReadBytes[i])/rbw + float64(r.WriteBytes[i])/wbw) * 1e3; r.PredictedMs[i] != want || want <= 0 {
			t.Errorf("step %d predicted %v ms, the bytes and bandwidth give %v", i+1, r.PredictedMs[i], want)
		}
	}
	// zinf's own figure is the device's view of its stores (at least the
	// steps' bytes) and holds no state digest: that would read 16 bytes
	// per parameter back after the last step.
	var stepRead int64
	for _, b := range r.ReadBytes {
		stepRead += b
	}
	if r.ZinfReadBytes < stepRead || r.ZinfReadBytes >= stepRead+8*r.Params || r.ZinfWrittenBytes < 2*20*r.Params {
		t.Errorf("zinf read %d bytes (the steps %d), wrote %d (the steps %d)", r.ZinfReadBytes, stepRead, r.ZinfWrittenBytes, 2*20*r.Params)
	}
	// On a block device, this process's own storage reads (the kernel's
	// count, whatever else runs) are zinf's count within 3%: every read
	// zinf does is in it.
	t.Logf("read: zinf %d, this process %d (counted %v), disk %q %d", r.ZinfReadBytes, r.ProcReadBytes, r.ProcCounted, r.Disk, r.DiskReadBytes)
	if r.ProcCounted && r.Disk != "" && r.ProcReadBytes > 0 {
		if d := math.Abs(float64(r.ZinfReadBytes-r.ProcReadBytes)) / float64(r.ProcReadBytes); d > 0.03 {
			t.Errorf("zinf counted %d bytes read, the process read %d from the block layer (%.1f%% apart)", r.ZinfReadBytes, r.ProcReadBytes, 100*d)
		}
	}
	// The disk's own view of each step after the first: a busy fraction,
	// what it moved while busy, how many requests were in flight.
	if len(r.DiskBusy) != 2 || len(r.DiskBusyGBps) != 2 || len(r.DiskInFlight) != 2 || r.DiskBusy[0] != 0 || r.DiskBusyGBps[0] != 0 {
		t.Fatalf("disk figures per step: busy %v, GB/s %v, in flight %v", r.DiskBusy, r.DiskBusyGBps, r.DiskInFlight)
	}
	if b, g, f := r.DiskBusy[1], r.DiskBusyGBps[1], r.DiskInFlight[1]; b < 0 || b > 1 || g < 0 || f < 0 || b == 0 && (g != 0 || f != 0) {
		t.Errorf("step 2: disk busy %v, %v GB/s, %v in flight", b, r.DiskBusyGBps[1], r.DiskInFlight[1])
	}
	if r.SampleChecked == 0 || len(r.Sampled) != 4 || r.PeakRSSBytes <= 0 || r.RSSBudgetBytes != 16<<20+RSSHeadroomBytes {
		t.Fatalf("result %+v", r)
	}
	var sb strings.Builder
	if err := r.Write(&sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"model state", "peak RSS", "predicted/achieved", "sampled check", "disk-bound", "disk busy", "zinf's stores from open to close"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, sb.String())
		}
	}
	for _, want := range []string{"bench-scale:", "bandwidth before training", "step   1/2", "bandwidth after training"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, out.String())
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the run left %v in the path", ents)
	}
}

// TestDiskWindow: a disk's busy fraction, its rate while busy and the
// requests in flight follow from its counters at two instants; missing
// marks, counters without times and an idle disk give zeros.
func TestDiskWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	a := diskMark{at: t0, ok: true, st: blockdev.Stat{BytesRead: 1e9, BytesWritten: 5e8, Busy: 10 * time.Second, InFlight: 40 * time.Second, Timed: true}}
	// 2 s later: busy 1.5 s of them, 3 GB read and 1.5 GB written, 12 s
	// of requests in flight (8 on average while busy).
	b := diskMark{at: t0.Add(2 * time.Second), ok: true, st: blockdev.Stat{BytesRead: 4e9, BytesWritten: 2e9, Busy: 11500 * time.Millisecond, InFlight: 52 * time.Second, Timed: true}}
	busy, gbps, inFlight := diskWindow(a, b)
	if math.Abs(busy-0.75) > 1e-9 || math.Abs(gbps-3) > 1e-9 || math.Abs(inFlight-8) > 1e-9 {
		t.Fatalf("busy %v, %v GB/s, %v in flight; want 0.75, 3, 8", busy, gbps, inFlight)
	}
	// io_ticks a jiffy over the wall time: busy throughout, not more.
	over := b
	over.st.Busy = a.st.Busy + 2004*time.Millisecond
	if busy, _, _ := diskWindow(a, over); busy != 1 {
		t.Errorf("busy %v over a window the disk was busy throughout", busy)
	}
	untimed := b
	untimed.st.Timed = false
	idle := b
	idle.st.Busy = a.st.Busy
	missing := b
	missing.ok = false
	for name, m := range map[string]diskMark{"untimed": untimed, "idle": idle, "missing": missing, "same instant": {at: t0, ok: true, st: b.st}} {
		if busy, gbps, inFlight := diskWindow(a, m); busy != 0 || gbps != 0 || inFlight != 0 {
			t.Errorf("%s: busy %v, %v GB/s, %v in flight; want zeros", name, busy, gbps, inFlight)
		}
	}
}

// TestRefusesSmallDisk: a path whose filesystem cannot hold the run is
// refused before anything is written, naming what is needed and what is
// free.
func TestRefusesSmallDisk(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root): %v", err)
	}
	defer unix.Unmount(dir, 0)
	_, err := Run(context.Background(), Options{Dir: dir, StateBytes: 8 << 20, PoolBytes: 16 << 20, Width: 64, Steps: 1, ProbeBytes: 1 << 20, Logger: quiet})
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "free on "+dir) || !strings.Contains(err.Error(), "are free") {
		t.Fatalf("a 4 MiB filesystem for 8 MiB of state: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a refused run wrote %v", ents)
	}
}

func TestBadOptions(t *testing.T) {
	_, err := Run(context.Background(), Options{Dir: "", StateBytes: 1, PoolBytes: 1, Width: 3, Steps: -1, ProbeBytes: 1000})
	for _, want := range []string{"--path is required", "--state 1", "--pool 1", "--width 3", "--steps -1", "--probe-size 1000"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}
