package layerexec

import "golang.org/x/sys/unix"

// mapAnon maps n bytes of anonymous private memory: zeros, outside the Go
// heap, taking no RAM until written.
func mapAnon(n int) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
}

// unmapAnon gives a mapping made by mapAnon back.
func unmapAnon(b []byte) error { return unix.Munmap(b) }
