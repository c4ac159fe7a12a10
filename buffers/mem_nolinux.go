//go:build !linux

package buffers

func adviseArena([]byte) {}

// memlockLimit is only read on Linux; elsewhere the warning says "unknown".
func memlockLimit() (limit uint64, unlimited, ok bool) { return 0, false, false }
