package buffers

import "golang.org/x/sys/unix"

// adviseArena keeps the arena out of child processes: a fork would otherwise
// copy-on-write pinned pages a device may be DMA-ing into (the reason CUDA
// and RDMA stacks set MADV_DONTFORK on registered memory). Best effort.
func adviseArena(mem []byte) { _ = unix.Madvise(mem, unix.MADV_DONTFORK) }

// memlockLimit returns the soft RLIMIT_MEMLOCK in bytes; ok is false when it
// cannot be read. unlimited is true for RLIM_INFINITY.
func memlockLimit() (limit uint64, unlimited, ok bool) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, false, false
	}
	return r.Cur, r.Cur == unix.RLIM_INFINITY, true
}
