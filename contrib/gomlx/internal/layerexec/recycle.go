package layerexec

import (
	"reflect"
	"sync"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
)

// Why Finalize hands buffers back to the backend's pool.
//
// GoMLX's Go backend takes every buffer an execution writes from a pool
// (Backend.GetBuffer) and puts an execution's intermediate buffers back
// in it when they are dead. The buffers an execution returns are the
// caller's, and finalizing their tensors does not put them back: the
// buffer drops its bytes for the Go collector. A layer's backward
// executor returns the layer's weight gradients (50 MiB for a zoo block
// of d=1024), so a training step allocated its whole gradient volume in
// the Go heap again, micro-batch after micro-batch (about 24 GB a step
// for the 124-block model of `make bench-llm-big`), and under a memory
// limit the collector ran 200-odd times a step to keep up.
//
// The backend's pool is reachable only through its Backend's exported
// method PutBuffer, whose parameter is the backend's own buffer type (an
// internal package's): it is called by reflection, after checking that
// the method and the buffer have the layout expected. Where they do not
// (another backend, a GoMLX that changed them), Finalize finalizes as
// before.

// putter is a backend type's PutBuffer, for buffers of type buf.
type putter struct {
	fn  reflect.Value // the method's func, receiver first
	buf reflect.Type  // its buffer type (a pointer to a struct)
}

// putters caches a putter (or nil: none) per backend type.
var putters sync.Map // reflect.Type -> *putter

// putterFor returns the PutBuffer of backend's type for buffers of buf's
// type, or nil.
func putterFor(backend compute.Backend, buf compute.Buffer) *putter {
	bt := reflect.TypeOf(backend)
	if bt == nil {
		return nil
	}
	p, ok := putters.Load(bt)
	if !ok {
		p, _ = putters.LoadOrStore(bt, lookupPutter(bt))
	}
	pp := p.(*putter)
	if pp == nil || pp.buf != reflect.TypeOf(buf) {
		return nil
	}
	return pp
}

// lookupPutter finds backend type bt's PutBuffer(*Buffer), whose buffer
// struct has the InUse and RawBytes fields recycle reads, or returns nil.
func lookupPutter(bt reflect.Type) *putter {
	m, ok := bt.MethodByName("PutBuffer")
	if !ok {
		return nil
	}
	ft := m.Func.Type()
	if ft.NumIn() != 2 || ft.NumOut() != 0 || ft.In(1).Kind() != reflect.Pointer ||
		ft.In(1).Elem().Kind() != reflect.Struct || !ft.In(1).Implements(reflect.TypeFor[compute.Buffer]()) {
		return nil
	}
	st := ft.In(1).Elem()
	inUse, ok1 := st.FieldByName("InUse")
	raw, ok2 := st.FieldByName("RawBytes")
	if !ok1 || !ok2 || inUse.Type.Kind() != reflect.Bool || raw.Type != reflect.TypeFor[[]byte]() {
		return nil
	}
	return &putter{fn: m.Func, buf: ft.In(1)}
}

// Recycles reports whether Finalize hands backend's buffers back to its
// pool (GoMLX's Go backend of the version zinf is built with); otherwise
// it finalizes them, leaving their memory to the collector.
func Recycles(backend compute.Backend) bool {
	if backend == nil {
		return false
	}
	t, err := tensors.FromShapeForBackend(backend, 0, shapes.Make(dtypes.Float32))
	if err != nil {
		return false
	}
	defer func() { _ = t.FinalizeAll() }()
	buf, err := t.Buffer(backend, 0)
	if err != nil {
		return false
	}
	return putterFor(backend, buf) != nil
}

// recycle hands buf, detached from its tensor, back to backend's pool, or
// finalizes it where it cannot. A buffer the backend does not pool (one
// made over the caller's memory) is finalized by PutBuffer itself.
func recycle(backend compute.Backend, buf compute.Buffer) {
	p := putterFor(backend, buf)
	if p == nil {
		_ = buf.Finalize()
		return
	}
	v := reflect.ValueOf(buf)
	if v.IsNil() {
		return
	}
	e := v.Elem()
	if !e.FieldByName("InUse").Bool() || e.FieldByName("RawBytes").Len() == 0 {
		// Already freed or in the pool (PutBuffer would panic on the
		// first), or nothing to keep.
		_ = buf.Finalize()
		return
	}
	defer func() {
		if recover() != nil {
			// PutBuffer panicked (it does on a buffer it finds already
			// in the pool): leave the buffer as Finalize would, which
			// returns an error for such a buffer and changes nothing.
			_ = buf.Finalize()
		}
	}()
	p.fn.Call([]reflect.Value{reflect.ValueOf(backend), v})
}
