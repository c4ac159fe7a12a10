package zinf_test

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// TestViewParam: between BeginLayer and EndLayer a weight on NVMe is
// viewed where the runtime swapped it in: its values in the stored
// dtype, the same bytes on a second view (the pinned buffer, not a
// copy); an unknown name and a closed runtime are errors naming them.
func TestViewParam(t *testing.T) {
	ctx := context.Background()
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = 1 << 20
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	rt, err := zinf.Open(c, zinf.LayeredModel([]tensor.Desc{{Name: "a", Shape: []int{500}}}, []tensor.Desc{{Name: "b", Shape: []int{300}}}),
		zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a, b := make([]float32, 500), make([]float32, 300)
	for i := range a {
		a[i] = float32(i)*0.25 - 3
	}
	for i := range b {
		b[i] = float32(i * i)
	}
	if err := rt.Init(ctx, "a", a); err != nil {
		t.Fatal(err)
	}
	if err := rt.Init(ctx, "b", b); err != nil {
		t.Fatal(err)
	}
	rt.Forward()
	for l, want := range [][]float32{a, b} {
		if err := rt.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		name := rt.LayerTensors(l)[0]
		data, dt, release, ok, err := rt.ViewParam(ctx, name)
		if err != nil || !ok || dt != tensor.Float32 || len(data) != 4*len(want) {
			t.Fatalf("view %q: %d bytes of %v, ok %v, %v", name, len(data), dt, ok, err)
		}
		for i, w := range want {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:])); got != w {
				t.Fatalf("view %q [%d] = %v, want %v", name, i, got, w)
			}
		}
		again, _, release2, ok, err := rt.ViewParam(ctx, name)
		if err != nil || !ok || &again[0] != &data[0] {
			t.Fatalf("a second view of %q is not the same buffer (ok %v, %v)", name, ok, err)
		}
		release()
		release2()
		release() // twice: no effect
		rt.EndLayer(l)
	}
	if _, _, _, _, err := rt.ViewParam(ctx, "c"); err == nil || !strings.Contains(err.Error(), `"c": not a tensor of the model`) {
		t.Fatalf("unknown tensor: %v", err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, _, err := rt.ViewParam(ctx, "a"); err == nil {
		t.Fatal("a view after Close")
	}
}
