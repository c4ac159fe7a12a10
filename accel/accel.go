// Package accel abstracts accelerator (GPU) memory so the GPU tier is real on
// every machine: Sim stands in for a GPU with host memory under a capacity
// budget; the cuda subpackage drives a real NVIDIA GPU through the CUDA
// driver API (libcuda) loaded at run time.
//
// Compute in zinf's examples runs on the host; the device holds bytes.
// Callers move bytes with asynchronous copies on a Stream and join them with
// Synchronize.
package accel

import (
	"errors"

	"github.com/zinfio/zinf/tensor"
)

// Sentinel errors.
var (
	// ErrOutOfMemory: an allocation would exceed the device's capacity.
	ErrOutOfMemory = errors.New("accel: out of device memory")
	// ErrUnavailable: no such device here (no GPU, no driver, no library).
	ErrUnavailable = errors.New("accel: device unavailable")
	// ErrClosed: the device was closed.
	ErrClosed = tensor.ClosedError("accel: device closed")
	// ErrBounds: a copy runs outside an allocation.
	ErrBounds = errors.New("accel: copy out of bounds")
	// ErrInvalid: a Mem or Stream the Device did not create, memory already
	// freed, a stream already closed, or a size that cannot be allocated.
	ErrInvalid = errors.New("accel: invalid argument")
)

// Mem is one allocation of device memory. It is opaque: only the Device that
// allocated it may use it.
type Mem interface {
	// Size returns the allocation's size in bytes.
	Size() int64
}

// Stream orders asynchronous copies: copies on one stream run in issue
// order; Synchronize waits for all of them.
type Stream interface {
	// Synchronize blocks until every copy issued on the stream has finished
	// and returns the first error any of them met.
	Synchronize() error
	// Close releases the stream after synchronizing it.
	Close() error
}

// Device is accelerator memory. Methods are safe for concurrent use.
type Device interface {
	// Name describes the device ("sim", "cuda:0 NVIDIA H100 80GB HBM3").
	Name() string
	// CapacityBytes is the memory zinf may use on the device.
	CapacityBytes() int64
	// UsedBytes is the memory currently allocated through this Device.
	UsedBytes() int64
	// Alloc allocates size bytes; ErrOutOfMemory when over capacity.
	Alloc(size int64) (Mem, error)
	// Free releases m. Freeing twice is an error, never a crash.
	Free(m Mem) error
	// NewStream creates a stream for asynchronous copies.
	NewStream() (Stream, error)
	// CopyToDevice copies src to dst at dstOff asynchronously on s. src must
	// stay valid and unmodified until s is synchronized.
	CopyToDevice(s Stream, dst Mem, dstOff int64, src []byte) error
	// CopyFromDevice copies len(dst) bytes from src at srcOff into dst
	// asynchronously on s. dst must not be read until s is synchronized.
	CopyFromDevice(s Stream, dst []byte, src Mem, srcOff int64) error
	// RegisterHost tells the device that host memory b (pinned, page
	// aligned, from the buffers pool) will be copied from and to, so copies
	// are DMA without staging. Sim moves no bytes for it; it only checks that
	// registrations and unregistrations pair up, as CUDA does.
	RegisterHost(b []byte) error
	// UnregisterHost undoes RegisterHost.
	UnregisterHost(b []byte) error
	// Close frees every allocation and stream. It is idempotent.
	Close() error
}
