//go:build unix

package swapper

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// noFollow keeps a lock-file open from following a symlink.
const noFollow = unix.O_NOFOLLOW

// tryLock takes an exclusive flock on f without blocking. It reports false
// when another open file description (a live store, in this process or
// another) holds it.
func tryLock(f *os.File) (bool, error) {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	return false, &os.PathError{Op: "flock", Path: f.Name(), Err: err}
}

// allocatedBytes is the disk space a file takes: its allocated blocks.
func allocatedBytes(info os.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
