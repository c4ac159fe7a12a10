package optimizer

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// benchMemory maps words float32s of anonymous memory (page aligned, as
// pool buffers are), on transparent huge pages when ZINF_BENCH_HUGEPAGES
// is 1, and returns them with the function that unmaps them.
func benchMemory(b *testing.B, words int) ([]float32, func()) {
	b.Helper()
	raw, err := unix.Mmap(-1, 0, 4*words, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		b.Fatalf("mmap %d bytes: %v", 4*words, err)
	}
	if os.Getenv("ZINF_BENCH_HUGEPAGES") == "1" {
		if err := unix.Madvise(raw, unix.MADV_HUGEPAGE); err != nil {
			b.Fatalf("madvise(MADV_HUGEPAGE): %v", err)
		}
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), words), func() { _ = unix.Munmap(raw) }
}

// cpuSeconds is the CPU time (user and system) this process has used, for
// benchmarks to report work per CPU-second: a figure per core that time
// slices taken by other processes on a shared machine do not dilute.
func cpuSeconds() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
