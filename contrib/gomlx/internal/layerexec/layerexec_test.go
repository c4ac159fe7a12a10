package layerexec_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend" // the pure-Go backend
	"github.com/gomlx/compute/shapes"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/tensor"
)

// TestBufferBytesAreTheTensors: bytes written into a Buffer are the
// values its tensor holds (what an executor fed it reads), with no copy.
func TestBufferBytesAreTheTensors(t *testing.T) {
	be, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	shape := shapes.Make(dtypes.Float32, 2, 3)
	b, err := layerexec.NewBuffer(be, shape)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if int64(len(b.Bytes)) != shape.ByteSize() {
		t.Fatalf("%d bytes for %s", len(b.Bytes), shape)
	}
	// Element [0][1] = 1.0 (0x3f800000, little-endian).
	b.Bytes[4], b.Bytes[5], b.Bytes[6], b.Bytes[7] = 0, 0, 0x80, 0x3f
	got := b.T.Value().([][]float32)
	if got[0][1] != 1 {
		t.Fatalf("the tensor holds %v after its bytes were written: want element [0][1] = 1", got)
	}
	_, again, err := layerexec.Shared(be, b.T)
	if err != nil {
		t.Fatal(err)
	}
	if &again[0] != &b.Bytes[0] {
		t.Fatal("Shared gave a copy of the buffer's bytes, not the bytes themselves")
	}
	layerexec.Finalize(nil) // nil is fine
}

func TestDType(t *testing.T) {
	for d, want := range map[dtypes.DType]tensor.DType{dtypes.Float32: tensor.Float32, dtypes.BFloat16: tensor.BFloat16, dtypes.Float16: tensor.Float16} {
		if got, ok := layerexec.DType(d); !ok || got != want {
			t.Errorf("DType(%s) = %s, %v; want %s", d, got, ok, want)
		}
	}
	for _, d := range []dtypes.DType{dtypes.Int32, dtypes.Float64, dtypes.Uint8} {
		if _, ok := layerexec.DType(d); ok {
			t.Errorf("DType(%s) is ok: zinf stores no such parameters", d)
		}
	}
}

// TestCatch: a panic becomes the error it carries, or one that prints it;
// an error returned passes through.
func TestCatch(t *testing.T) {
	sentinel := errors.New("boom")
	if err := layerexec.Catch(func() error { panic(sentinel) }); !errors.Is(err, sentinel) {
		t.Fatalf("a panic with an error: %v", err)
	}
	if err := layerexec.Catch(func() error { panic("shape mismatch") }); err == nil || !strings.Contains(err.Error(), "shape mismatch") {
		t.Fatalf("a panic with a string: %v", err)
	}
	if err := layerexec.Catch(func() error { return sentinel }); err != sentinel {
		t.Fatalf("an error returned: %v", err)
	}
	if err := layerexec.Catch(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}
