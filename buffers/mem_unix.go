//go:build unix

package buffers

import "golang.org/x/sys/unix"

// mapArena maps n bytes of anonymous, private, zeroed memory: page aligned
// and outside the Go heap, so the garbage collector never scans or moves it
// and a device can DMA into it.
func mapArena(n int) ([]byte, error) {
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, err
	}
	adviseArena(mem)
	return mem, nil
}

func unmapArena(mem []byte) error { return unix.Munmap(mem) }

func mlockRegion(mem []byte) error { return unix.Mlock(mem) }

func munlockRegion(mem []byte) error { return unix.Munlock(mem) }
