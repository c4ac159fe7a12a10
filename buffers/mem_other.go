//go:build !unix

package buffers

import (
	"errors"
	"unsafe"
)

// Without mmap the arena comes from the Go heap, over-allocated by a page so
// that its start can be page aligned. A []byte holds no pointers, so the
// collector never scans it; it is kept alive by the pool.
func mapArena(n int) ([]byte, error) {
	ps := pageSize()
	raw := make([]byte, n+ps)
	off := 0
	if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))) % uintptr(ps)); r != 0 {
		off = ps - r
	}
	return raw[off : off+n : off+n], nil
}

func unmapArena([]byte) error { return nil }

var errNoMlock = errors.New("mlock is not supported on this platform")

func mlockRegion([]byte) error { return errNoMlock }

func munlockRegion([]byte) error { return nil }
