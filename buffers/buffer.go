package buffers

import (
	"log/slog"
	"sync/atomic"
	"unsafe"
)

// Buffer is a page-aligned slice of the pool's arena, held by reference
// count. Acquire returns it with one reference; Retain adds one (for example
// for an in-flight I/O or a reader on another goroutine) and Release drops
// one. When the count reaches zero the memory returns to the pool and may be
// handed out again at once, so no slice obtained from the buffer may be used
// after the holder's last Release.
//
// A *Buffer is never reused for another allocation, which is what makes
// misuse safe to detect: Release or Retain on a buffer whose count already
// reached zero does not touch the pool; it is logged at Error level on the
// pool's logger and counted in Stats.Misuses, and nothing panics. Bytes, Full
// and the typed views return nil once the count is zero, so a use after the
// final Release fails loudly instead of scribbling on another owner's data.
//
// Retain and Release may be called from any goroutine. The contents are not
// synchronized: the holders order their reads and writes themselves.
type Buffer struct {
	pool    *Pool
	region  *region
	data    []byte // len = requested size, cap = size class
	unit    int32  // first granule in the arena
	units   int32  // granules held
	purpose Purpose
	hold    *holdState // the holder's accounting (WithHolder), nil without one
	refs    atomic.Int32
}

// Bytes returns the buffer's memory: len is the requested size, cap the size
// class (a multiple of MinBufferBytes), so a caller can pad an O_DIRECT tail
// into b.Bytes()[:n] for any n <= Cap(). The start is page aligned. It
// returns nil after the final Release.
func (b *Buffer) Bytes() []byte {
	if b == nil || b.refs.Load() <= 0 {
		return nil
	}
	return b.data
}

// Full returns the whole size-class slice (len == cap == Cap()), or nil after
// the final Release.
func (b *Buffer) Full() []byte {
	d := b.Bytes()
	return d[:cap(d)]
}

// Uint8 is Bytes, named to match the other typed views.
func (b *Buffer) Uint8() []byte { return b.Bytes() }

// Float32 views Bytes as float32s, without a copy: len is Len()/4, cap is
// Cap()/4. It returns nil after the final Release.
func (b *Buffer) Float32() []float32 { return View[float32](b.Bytes()) }

// BFloat16 views Bytes as bfloat16s, without a copy: len is Len()/2.
func (b *Buffer) BFloat16() []BFloat16 { return View[BFloat16](b.Bytes()) }

// Float16 views Bytes as IEEE half floats, without a copy: len is Len()/2.
func (b *Buffer) Float16() []Float16 { return View[Float16](b.Bytes()) }

// Len returns the requested size in bytes.
func (b *Buffer) Len() int { return len(b.data) }

// Cap returns the size class in bytes: Len rounded up to MinBufferBytes.
func (b *Buffer) Cap() int { return cap(b.data) }

// Purpose returns the purpose the buffer was acquired for.
func (b *Buffer) Purpose() Purpose { return b.purpose }

// Retain adds a reference. Retaining a buffer whose count already reached
// zero is a bug in the caller; it is logged and counted, and the buffer
// stays released.
func (b *Buffer) Retain() {
	for {
		r := b.refs.Load()
		if r <= 0 {
			b.pool.misuse("Retain after the final Release", b)
			return
		}
		if b.refs.CompareAndSwap(r, r+1) {
			return
		}
	}
}

// Release drops a reference; the last one returns the memory to the pool and
// wakes waiting Acquire calls. Releasing more times than the buffer was
// acquired and retained is logged and counted (Stats.Misuses); it never
// corrupts the pool and never panics.
func (b *Buffer) Release() {
	for {
		r := b.refs.Load()
		if r <= 0 {
			b.pool.misuse("Release called more times than Retain", b)
			return
		}
		if b.refs.CompareAndSwap(r, r-1) {
			if r == 1 {
				b.pool.put(b)
			}
			return
		}
	}
}

func (p *Pool) misuse(what string, b *Buffer) {
	p.misuses.Add(1)
	p.logger.Error("buffers: "+what+" (a reference-counting bug in the caller; the pool is unaffected)",
		slog.String("purpose", b.purpose.String()), slog.Int("len", len(b.data)),
		slog.Int64("offset", int64(b.unit)<<p.granuleShift))
}

// Element is a type a byte slice can be viewed as.
type Element interface {
	~uint8 | ~int8 | ~uint16 | ~int16 | ~uint32 | ~int32 | ~float32 | ~uint64 | ~int64 | ~float64
}

// View reinterprets b as a slice of E without copying: len is len(b)/size,
// cap is cap(b)/size, trailing bytes are not covered. It returns nil when b
// is empty or its start is not aligned for E (a misaligned view would break
// on some platforms and under checkptr). Buffer memory is always aligned.
func View[E Element](b []byte) []E {
	var zero E
	size := int(unsafe.Sizeof(zero))
	if cap(b) < size {
		return nil
	}
	ptr := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(ptr)%unsafe.Alignof(zero) != 0 {
		return nil
	}
	return unsafe.Slice((*E)(ptr), cap(b)/size)[:len(b)/size]
}

// AsBytes reinterprets s as bytes without copying (len and cap scaled by the
// element size), for handing typed data to I/O.
func AsBytes[E Element](s []E) []byte {
	if cap(s) == 0 {
		return nil
	}
	var zero E
	size := int(unsafe.Sizeof(zero))
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), cap(s)*size)[:len(s)*size]
}

// Float32Bytes views b as float32s (see View).
func Float32Bytes(b []byte) []float32 { return View[float32](b) }

// BFloat16Bytes views b as bfloat16s (see View).
func BFloat16Bytes(b []byte) []BFloat16 { return View[BFloat16](b) }

// Float16Bytes views b as IEEE half floats (see View).
func Float16Bytes(b []byte) []Float16 { return View[Float16](b) }
