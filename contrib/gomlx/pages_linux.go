package zgomlx

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dropPages gives the whole memory pages of b back to the kernel
// (MADV_DONTNEED): they read as zeros until written again, and take no
// RAM until then. For a swap-in buffer of which a pass writes and reads
// only some rows (a lookup read by rows), so that the rows of earlier
// passes do not stay resident.
func dropPages(b []byte) {
	page := uintptr(os.Getpagesize())
	if uintptr(len(b)) < 16*page {
		return
	}
	start := uintptr(0)
	if off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) % page; off != 0 {
		start = page - off
	}
	end := start + (uintptr(len(b))-start)/page*page
	if end > start {
		_ = unix.Madvise(b[start:end], unix.MADV_DONTNEED) // advice: a failure only leaves the pages resident
	}
}
