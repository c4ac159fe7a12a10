//go:build unix

package accel

import "golang.org/x/sys/unix"

// simMap returns size bytes of zeroed anonymous memory outside the Go heap.
func simMap(size int64) ([]byte, error) {
	return unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
}

// simUnmap returns memory from simMap to the system.
func simUnmap(b []byte) {
	if b != nil {
		// Munmap fails only for a range simMap did not return: a broken
		// invariant, not bad input.
		if err := unix.Munmap(b); err != nil {
			panic("accel: munmap of sim memory: " + err.Error())
		}
	}
}
