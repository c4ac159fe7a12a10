// Package layerexec holds what zgomlx's trainer and its generator share to
// run one layer's GoMLX executor on weights zinf streams: the swap-in
// buffer (a tensor over a backend's shared buffer, so zinf's bytes land
// where the executor reads them), the map from GoMLX dtypes to zinf's, the
// finalizer that frees a tensor's memory now, and the catch that turns a
// GoMLX panic into an error.
//
// It knows neither the trainer nor the generator: both import it, and it
// imports only GoMLX and zinf's tensor vocabulary (and its codecs).
package layerexec

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/tensor"
)

// Buffer is a swap-in buffer: a GoMLX tensor over a backend shared
// buffer, and that buffer's bytes. Bytes written into Bytes are what an
// executor fed T (or Buf) reads, with no copy and no allocation.
type Buffer struct {
	T     *tensors.Tensor
	Buf   compute.Buffer
	Bytes []byte
	// mapped is the mapping Bytes lies in (NewMappedBuffer), which Free
	// gives back; nil for a buffer in the Go heap.
	mapped []byte
}

// NewBuffer allocates a shared-buffer tensor of shape on backend's device
// 0. It fails when the backend cannot share its buffers with Go (only a
// backend that can lets zinf write straight into an executor's input).
func NewBuffer(backend compute.Backend, shape shapes.Shape) (*Buffer, error) {
	t, err := tensors.FromShapeForBackend(backend, 0, shape)
	if err != nil {
		return nil, err
	}
	buf, bytes, err := Shared(backend, t)
	if err != nil {
		_ = t.FinalizeAll()
		return nil, err
	}
	if int64(len(bytes)) != shape.ByteSize() {
		_ = t.FinalizeAll()
		return nil, fmt.Errorf("shared buffer of %d bytes for %d", len(bytes), shape.ByteSize())
	}
	return &Buffer{T: t, Buf: buf, Bytes: bytes}, nil
}

// Shared returns t's backend buffer and its bytes, without copying (the Go
// backend shares its buffers with Go).
func Shared(backend compute.Backend, t *tensors.Tensor) (compute.Buffer, []byte, error) {
	buf, err := t.Buffer(backend, 0)
	if err != nil {
		return nil, nil, err
	}
	flat, err := buf.Data()
	if err != nil {
		return nil, nil, fmt.Errorf("the backend has no shared buffers: %w", err)
	}
	return buf, dtypes.UnsafeByteSliceFromAny(flat), nil
}

// Free releases the buffer's memory now (nil is fine). A mapped buffer's
// memory is unmapped after its tensor is finalized: nothing may use T,
// Buf or Bytes afterwards. Free twice is fine.
func (b *Buffer) Free() {
	if b == nil {
		return
	}
	Finalize(b.T)
	if b.mapped != nil {
		_ = unmapAnon(b.mapped) // only fails for a range that is not a mapping
		b.T, b.Buf, b.Bytes, b.mapped = nil, nil, nil, nil
	}
}

// Mapped reports whether the buffer's bytes lie outside the Go heap
// (NewMappedBuffer made it so).
func (b *Buffer) Mapped() bool { return b != nil && b.mapped != nil }

// DType maps a GoMLX dtype to zinf's: the float dtypes zinf stores
// (float32, bfloat16, float16); ok is false for any other.
func DType(d dtypes.DType) (dt tensor.DType, ok bool) {
	switch d {
	case dtypes.Float32:
		return tensor.Float32, true
	case dtypes.BFloat16:
		return tensor.BFloat16, true
	case dtypes.Float16:
		return tensor.Float16, true
	}
	return 0, false
}

// Finalize releases a tensor's memory now, on every device, instead of at
// the garbage collector's pace (nil is fine): a layer's outputs and
// swap-in buffers are large and short-lived. An executor's output on
// GoMLX's Go backend goes back to the backend's buffer pool, where the
// next execution takes its outputs from (see recycle.go): nothing may
// read t's bytes afterwards, not even through a view taken before.
func Finalize(t *tensors.Tensor) {
	if t == nil || t.CheckValid() != nil {
		return
	}
	if t.IsOnDevice(0) {
		if be, err := t.Backend(); err == nil {
			if buf, err := t.DonateBuffer(be, 0); err == nil {
				_ = t.FinalizeAll() // a local copy, if any
				recycle(be, buf)
				return
			}
		}
	}
	_ = t.FinalizeAll()
}

// Catch runs fn and turns a panic into an error: GoMLX reports errors in
// building and running graphs by panicking, and zinf's callers get errors.
func Catch(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = e
			} else {
				err = fmt.Errorf("%v", r)
			}
		}
	}()
	return fn()
}

// Scalar reads a scalar float tensor (a loss) as a float32, without
// copying it to Go.
func Scalar(backend compute.Backend, t *tensors.Tensor) (float32, error) {
	buf, err := t.Buffer(backend, 0)
	if err != nil {
		return 0, err
	}
	flat, err := buf.Data()
	if err != nil {
		return 0, err
	}
	switch f := flat.(type) {
	case []float32:
		return f[0], nil
	case []float64:
		return float32(f[0]), nil
	}
	b := dtypes.UnsafeByteSliceFromAny(flat)
	dt, ok := DType(t.DType())
	if !ok || len(b) < dt.Size() {
		return 0, fmt.Errorf("zgomlx: the loss is %s (a float scalar is needed)", t.Shape())
	}
	var one [1]float32
	buffers.Decode(dt, one[:], b[:dt.Size()])
	return one[0], nil
}
