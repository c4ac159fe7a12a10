//go:build unix

package buffers

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapArena maps n bytes of anonymous, private, zeroed memory: page aligned
// and outside the Go heap, so the garbage collector never scans or moves it
// and a device can DMA into it. Where the system has transparent huge
// pages (hugePageBytes > 0) an arena of at least one huge page starts on a
// huge-page boundary, so that the kernel can back it with huge pages (see
// adviseArena): it is over-mapped by one huge page and the unused head and
// tail are unmapped. The mappings go through MmapPtr/MunmapPtr, which do
// not keep the book unix.Mmap keeps of whole mappings (a trimmed mapping
// is not one).
func mapArena(n int) ([]byte, error) {
	hp := hugePageBytes
	if hp == 0 || n < hp {
		hp = 0
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n+hp), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, err
	}
	raw := unsafe.Slice((*byte)(p), n+hp)
	off := 0
	if hp > 0 {
		if r := int(uintptr(p) % uintptr(hp)); r != 0 {
			off = hp - r
		}
		// A failed trim leaves only harmless reserved address space.
		if off > 0 {
			_ = unix.MunmapPtr(p, uintptr(off))
		}
		if tail := hp - off; tail > 0 {
			_ = unix.MunmapPtr(unsafe.Pointer(&raw[off+n]), uintptr(tail))
		}
	}
	mem := raw[off : off+n : off+n]
	adviseArena(mem)
	return mem, nil
}

func unmapArena(mem []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem)))
}

func mlockRegion(mem []byte) error { return unix.Mlock(mem) }

func munlockRegion(mem []byte) error { return unix.Munlock(mem) }

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
