package layerexec

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// TestMappedBufferOutsideGoHeap: a mapped buffer of 64 MiB adds nothing of
// its size to the Go heap, an executor reads what is written into its
// bytes, and Free gives it back.
func TestMappedBufferOutsideGoHeap(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("anonymous mappings are used on Linux only")
	}
	backend, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	const rows, cols = 16384, 1024
	shape := shapes.Make(dtypes.Float32, rows, cols)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	b, err := NewMappedBuffer(backend, shape)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	runtime.ReadMemStats(&ms)
	if grow := int64(ms.HeapAlloc) - int64(before); grow >= shape.ByteSize()/4 {
		t.Fatalf("the Go heap grew %d bytes for a mapped buffer of %d", grow, shape.ByteSize())
	}
	if !b.Mapped() || int64(len(b.Bytes)) != shape.ByteSize() || !b.T.Shape().Equal(shape) {
		t.Fatalf("mapped %v, %d bytes, shape %s: want a mapping of %d bytes, %s", b.Mapped(), len(b.Bytes), b.T.Shape(), shape.ByteSize(), shape)
	}
	f := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b.Bytes))), rows*cols)
	f[3*cols+7], f[rows*cols-1] = 2.5, -1
	exec := graph.MustNewExec(backend, func(x *graph.Node) *graph.Node { return graph.ReduceAllSum(x) })
	out := exec.MustExec1(b.T)
	if got := out.Value().(float32); got != 1.5 {
		t.Fatalf("an executor read a sum of %v from the mapped buffer, want 1.5", got)
	}
	b.Free()
	if b.Mapped() || b.Bytes != nil || b.T != nil {
		t.Fatal("Free left the mapping in the buffer")
	}
	b.Free() // twice is fine
}
