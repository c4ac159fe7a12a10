//go:build !unix

package accel

// simMap returns size bytes of zeroed memory. Without mmap it comes from the
// Go heap.
func simMap(size int64) ([]byte, error) { return make([]byte, size), nil }

// simUnmap drops the memory; the garbage collector reclaims it.
func simUnmap([]byte) {}
