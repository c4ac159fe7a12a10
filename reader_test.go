package zinf_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestReader: a serving runtime's Reader reads what the runtime's own
// reads do — the whole tensor in the stored dtype and converted, chosen
// rows, a view of the pinned buffer — without the step machinery; bad
// reads are errors naming the tensor, and after Close every call matches
// ErrClosed.
func TestReader(t *testing.T) {
	ctx, watch := watchdog(t, 2*time.Minute)
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = 1 << 20
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	rt, err := zinf.Open(c, zinf.LayeredModel([]tensor.Desc{{Name: "emb", Shape: []int{40, 8}}}, []tensor.Desc{{Name: "w", Shape: []int{300}}}),
		zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	vals := map[string][]float32{"emb": make([]float32, 320), "w": make([]float32, 300)}
	for n, v := range vals {
		for i := range v {
			v[i] = float32(i%97)*0.125 - float32(len(n))
		}
		if err := rt.Init(ctx, n, v); err != nil {
			t.Fatal(err)
		}
	}
	rd, err := rt.Reader()
	if err != nil {
		t.Fatal(err)
	}
	rt.Forward()
	for l, name := range []string{"emb", "w"} {
		if err := rd.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		n := len(vals[name])
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Float16} {
			got, want := make([]byte, n*dt.Size()), make([]byte, n*dt.Size())
			if err := rd.Copy(ctx, name, dt, got); err != nil {
				t.Fatalf("copy %q as %v: %v", name, dt, err)
			}
			if err := rt.ReadParamBytes(ctx, name, dt, want); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("copy %q as %v differs from ReadParamBytes", name, dt)
			}
		}
		data, dt, release, ok, err := rd.View(ctx, name)
		if err != nil || !ok || dt != tensor.Float32 || len(data) != 4*n {
			t.Fatalf("view %q: %d bytes of %v, ok %v, %v", name, len(data), dt, ok, err)
		}
		want := make([]byte, 4*n)
		if err := rt.ReadParamBytes(ctx, name, tensor.Float32, want); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, want) {
			t.Fatalf("view of %q differs from its values", name)
		}
		release()
		if name == "emb" {
			rows := []int{39, 0, 7, 7}
			got, want := make([]byte, len(rows)*8*2), make([]byte, len(rows)*8*2)
			if err := rd.CopyRows(ctx, name, rows, tensor.BFloat16, got); err != nil {
				t.Fatal(err)
			}
			if err := rt.ReadParamRows(ctx, name, rows, tensor.BFloat16, want); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("CopyRows differs from ReadParamRows")
			}
			for _, bad := range []struct {
				rows []int
				dst  int
				msg  string
			}{
				{[]int{40}, 16, "row 40 (index 0) is outside the tensor's 40 rows"},
				{[]int{-1}, 16, "row -1"},
				{[]int{1}, 15, "destination of 15 bytes"},
			} {
				if err := rd.CopyRows(ctx, name, bad.rows, tensor.BFloat16, make([]byte, bad.dst)); err == nil || !strings.Contains(err.Error(), bad.msg) {
					t.Errorf("CopyRows(%v, %d bytes): %v, want %q", bad.rows, bad.dst, err, bad.msg)
				}
			}
		}
		rd.EndLayer(l)
	}
	if err := rd.Copy(ctx, "nope", tensor.Float32, make([]byte, 4)); err == nil || !strings.Contains(err.Error(), `"nope": not a tensor of the model`) {
		t.Errorf("unknown tensor: %v", err)
	}
	if err := rd.Copy(ctx, "w", tensor.Float32, make([]byte, 4)); err == nil || !strings.Contains(err.Error(), `destination of 4 bytes for 300 elements`) {
		t.Errorf("short destination: %v", err)
	}
	if err := rd.Copy(ctx, "w", tensor.DType(99), make([]byte, 4)); err == nil || !strings.Contains(err.Error(), "unknown dtype 99") {
		t.Errorf("unknown dtype: %v", err)
	}
	if err := rd.BeginLayer(ctx, 2); err == nil || !strings.Contains(err.Error(), "layers 0..1") {
		t.Errorf("begin layer 2: %v", err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rd.BeginLayer(ctx, 0); !errors.Is(err, zinf.ErrClosed) {
		t.Errorf("begin after Close: %v", err)
	}
	if err := rd.Copy(ctx, "w", tensor.Float32, make([]byte, 1200)); !errors.Is(err, zinf.ErrClosed) {
		t.Errorf("copy after Close: %v", err)
	}
	if _, _, _, _, err := rd.View(ctx, "w"); !errors.Is(err, zinf.ErrClosed) {
		t.Errorf("view after Close: %v", err)
	}
	if _, err := rt.Reader(); !errors.Is(err, zinf.ErrClosed) {
		t.Errorf("Reader after Close: %v", err)
	}
}

// TestReaderOnTrainingRuntime: on a runtime that trains, a Reader is
// handed out only where Step commits its update before it returns: there
// it reads the step's new values, as ReadParamBytes does. Where Step
// returns first (zinf.overlap_update) a read could meet the update in
// flight, and Reader is refused.
func TestReaderOnTrainingRuntime(t *testing.T) {
	model, names, numel := overlapModel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	cfg := overlapConfig(t)
	cfg.Zinf.OverlapUpdate = false
	ctx, watch := watchdog(t, 2*time.Minute)
	rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	for _, n := range names {
		if err := rt.Init(ctx, n, overlapInit(n, numel[n])); err != nil {
			t.Fatal(err)
		}
	}
	rd, err := rt.Reader()
	if err != nil {
		t.Fatal(err)
	}
	if err := overlapStep(ctx, rt, names, numel, 0, nil); err != nil {
		t.Fatal(err)
	}
	rt.Forward()
	for l, n := range names {
		if err := rd.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		got, want := make([]byte, 4*numel[n]), make([]byte, 4*numel[n])
		if err := rd.Copy(ctx, n, tensor.Float32, got); err != nil {
			t.Fatal(err)
		}
		if err := rt.ReadParamBytes(ctx, n, tensor.Float32, want); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: the Reader's copy differs from ReadParamBytes after a step", n)
		}
		init := make([]byte, 4*numel[n])
		buffers.Encode(tensor.Float32, init, overlapInit(n, numel[n]))
		if bytes.Equal(got, init) {
			t.Fatalf("%q: the Reader read the values before the step", n)
		}
		rd.EndLayer(l)
	}

	ov, err := zinf.Open(overlapConfig(t), model, zinf.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ov.Close()
	if !ov.OverlapUpdate() {
		t.Fatalf("the plan has no room to overlap the update: %+v", ov.Reservations())
	}
	if _, err := ov.Reader(); err == nil || !strings.Contains(err.Error(), "zinf.overlap_update") {
		t.Fatalf("Reader on a runtime whose Step returns before its update commits: %v", err)
	}
}
