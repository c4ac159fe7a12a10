package probe

import "golang.org/x/sys/unix"

// dropCache asks the kernel to drop fd's cached pages, so that a buffered
// read measures the device rather than the page cache.
func dropCache(fd int) { unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED) }
