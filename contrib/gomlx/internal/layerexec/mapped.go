package layerexec

import (
	"reflect"
	"unsafe"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
)

// NewMappedBuffer is NewBuffer with its bytes outside the Go heap: memory
// mapped anonymously, which takes no RAM until written and which Free
// unmaps. For a buffer of a whole table of which a step fills only some
// rows (a lookup read by rows): made in the Go heap, its size counts as
// live heap, and the collector lets as much garbage again build up before
// it runs (GOGC), resident memory the table's rows never needed.
//
// The backend's shared buffers are Go slices it allocates itself; GoMLX
// has no call that makes one over memory it did not allocate. The Go
// backend's buffer keeps its storage in exported fields (RawShape,
// RawBytes, Flat), so a one-element shared buffer is pointed at the
// mapping instead. Where that is not possible (another backend, a
// platform without anonymous mappings) it falls back to NewBuffer: the
// same buffer, in the Go heap.
func NewMappedBuffer(backend compute.Backend, shape shapes.Shape) (*Buffer, error) {
	n := shape.ByteSize()
	if n <= 0 || shape.DType.IsPacked() || backend == nil || !backend.HasSharedBuffers() ||
		int64(int(n)) != n {
		return NewBuffer(backend, shape)
	}
	mem, err := mapAnon(int(n))
	if err != nil {
		return NewBuffer(backend, shape)
	}
	buf, _, err := backend.NewSharedBuffer(0, shapes.Make(shape.DType))
	if err != nil {
		_ = unmapAnon(mem)
		return nil, err
	}
	if !retarget(buf, shape, mem) {
		_ = buf.Finalize()
		_ = unmapAnon(mem)
		return NewBuffer(backend, shape)
	}
	t, err := tensors.FromBuffer(buf)
	if err != nil {
		_ = buf.Finalize()
		_ = unmapAnon(mem)
		return nil, err
	}
	return &Buffer{T: t, Buf: buf, Bytes: mem, mapped: mem}, nil
}

// retarget points the Go backend's buffer buf at mem, of shape: its
// shape, its bytes and its typed view. It reports false, changing
// nothing, when buf does not have that layout.
func retarget(buf compute.Buffer, shape shapes.Shape, mem []byte) bool {
	v := reflect.ValueOf(buf)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	e := v.Elem()
	rs, rb, fl := e.FieldByName("RawShape"), e.FieldByName("RawBytes"), e.FieldByName("Flat")
	if !rs.IsValid() || !rb.IsValid() || !fl.IsValid() || !rs.CanSet() || !rb.CanSet() || !fl.CanSet() ||
		rs.Type() != reflect.TypeFor[shapes.Shape]() || rb.Type() != reflect.TypeFor[[]byte]() ||
		fl.Kind() != reflect.Interface {
		return false
	}
	flat := dtypes.UnsafeAnySliceFromBytes(unsafe.Pointer(unsafe.SliceData(mem)), shape.DType, shape.Size())
	if flat == nil || !reflect.TypeOf(flat).AssignableTo(fl.Type()) {
		return false
	}
	rs.Set(reflect.ValueOf(shape.Clone()))
	rb.Set(reflect.ValueOf(mem))
	fl.Set(reflect.ValueOf(&flat).Elem())
	got, err := buf.Shape()
	return err == nil && got.Equal(shape)
}
