package zinf_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

// TestInitInPlace: a tensor whose bytes lie in a file (a checkpoint's) is
// read from there by O_DIRECT on every swap-in, never copied to the swap
// files, also one whose offset pushes its last bytes past its padded
// span; bytes of the wrong dtype are refused with ErrNotInPlace, bytes
// past the file's end with an error of their own; the file is left as it
// was.
func TestInitInPlace(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := config.Default()
	c.SetScratchDir(dir)
	c.Zinf.Tiers.CPUPinnedBytes = 1 << 20
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	rt, err := zinf.Open(c, zinf.LayeredModel([]tensor.Desc{{Name: "a", Shape: []int{500}}}, []tensor.Desc{{Name: "b", Shape: []int{500}}}),
		zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	a, b := make([]float32, 500), make([]float32, 500)
	file := make([]byte, 16384)
	for i := range a {
		a[i], b[i] = float32(i)*0.5-7, float32(i*i)/3
		binary.LittleEndian.PutUint32(file[4136+4*i:], math.Float32bits(a[i]))  // 40 bytes into its aligned span
		binary.LittleEndian.PutUint32(file[11192+4*i:], math.Float32bits(b[i])) // 184 (512-byte sectors) or 3000 bytes in: past its span
	}
	path := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := rt.InitInPlace(ctx, "a", path, 4136, tensor.BFloat16); !errors.Is(err, swapper.ErrNotInPlace) || !strings.Contains(err.Error(), "the file holds bf16") {
		t.Fatalf("bf16 bytes for fp32 parameters: %v", err)
	}
	if err := rt.InitInPlace(ctx, "a", path, 4136, tensor.Float32); err != nil {
		if errors.Is(err, swapper.ErrNotInPlace) && strings.Contains(err.Error(), "O_DIRECT") {
			t.Skipf("no O_DIRECT in %s: %v", dir, err)
		}
		t.Fatal(err)
	}
	if err := rt.InitInPlace(ctx, "b", path, 16384-1999, tensor.Float32); err == nil || errors.Is(err, swapper.ErrNotInPlace) || !strings.Contains(err.Error(), "past the end") {
		t.Fatalf("b's bytes past the file's end: %v, want an error that is not ErrNotInPlace", err)
	}
	if err := rt.InitInPlace(ctx, "b", path, 11192, tensor.Float32); err != nil {
		t.Fatalf("b at offset 11192, pushed past its padded span: %v", err)
	}
	got := make([]float32, 500)
	for pass := range 3 {
		rt.Forward()
		for l, want := range [][]float32{a, b} {
			if err := rt.BeginLayer(ctx, l); err != nil {
				t.Fatal(err)
			}
			if err := rt.ReadParam(ctx, rt.LayerTensors(l)[0], got); err != nil {
				t.Fatal(err)
			}
			rt.EndLayer(l)
			if !slices.Equal(got, want) {
				t.Fatalf("pass %d layer %d: %v..., want %v...", pass, l, got[:4], want[:4])
			}
		}
	}
	st := rt.ParamStore.Stats()
	if st.BytesWritten != 0 || st.BytesRead < 3*4000 {
		t.Fatalf("param store: %d bytes written (want 0: both read in place), %d read", st.BytesWritten, st.BytesRead)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(after, file) {
		t.Fatalf("the file read in place changed or went: %v", err)
	}
}
