//go:build !linux

package probe

// dropCache has no portable form (no posix_fadvise in golang.org/x/sys on
// every system): a buffered probe there may read from the page cache.
func dropCache(fd int) {}
