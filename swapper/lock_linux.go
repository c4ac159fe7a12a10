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

// freeSpace returns the filesystem of path (its device number) and the
// bytes free there for an unprivileged writer; reported is false where the
// filesystem does not report free space (ramfs says 0 of 0).
func freeSpace(path string) (dev uint64, free int64, reported bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, false, err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, 0, false, err
	}
	if fs.Type == unix.RAMFS_MAGIC || fs.Blocks == 0 {
		return uint64(st.Dev), 0, false, nil
	}
	return uint64(st.Dev), int64(fs.Bavail) * fs.Bsize, true, nil
}
