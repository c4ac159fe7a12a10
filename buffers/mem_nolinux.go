//go:build !linux

package buffers

func adviseArena([]byte) {}

// hugePageBytes is 0: no transparent huge pages to align arenas for.
const hugePageBytes = 0

// memlockLimit is only read on Linux; elsewhere the warning says "unknown".
func memlockLimit() (limit uint64, unlimited, ok bool) { return 0, false, false }
