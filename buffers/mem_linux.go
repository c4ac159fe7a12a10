package buffers

import "golang.org/x/sys/unix"

// hugePageBytes is the transparent huge page size mapArena aligns arenas
// to (2 MiB on x86-64 and arm64 with 4 KiB pages).
const hugePageBytes = 2 << 20

// adviseArena keeps the arena out of child processes: a fork would otherwise
// copy-on-write pinned pages a device may be DMA-ing into (the reason CUDA
// and RDMA stacks set MADV_DONTFORK on registered memory). It also asks for
// transparent huge pages (MADV_HUGEPAGE; honoured where
// /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or "always"):
// faulting in and pinning the arena then takes one fault per 2 MiB instead
// of per 4 KiB page, which measured 3-13 ms instead of 21-104 ms for 64
// MiB on a 2-vCPU virtual machine, a fixed cost every pool creation pays
// (a one-shot checkpoint save makes its pool per call). Best effort.
func adviseArena(mem []byte) {
	_ = unix.Madvise(mem, unix.MADV_DONTFORK)
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
}

// memlockLimit returns the soft RLIMIT_MEMLOCK in bytes; ok is false when it
// cannot be read. unlimited is true for RLIM_INFINITY.
func memlockLimit() (limit uint64, unlimited, ok bool) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, false, false
	}
	return r.Cur, r.Cur == unix.RLIM_INFINITY, true
}
