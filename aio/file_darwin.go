package aio

import "golang.org/x/sys/unix"

// openDirect opens path and turns off the page cache for it with
// fcntl(F_NOCACHE), macOS's counterpart of O_DIRECT. A filesystem that
// refuses it fails with EINVAL, as Linux's open does for O_DIRECT, so
// OpenFile applies its policy the same way.
func openDirect(path string, flag int, perm uint32) (int, error) {
	fd, err := openFn(path, flag, perm)
	if err != nil {
		return -1, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_NOCACHE, 1); err != nil {
		unix.Close(fd)
		return -1, unix.EINVAL
	}
	return fd, nil
}

// syncData flushes fd's data to stable storage. fsync on macOS leaves the
// data in the drive's cache; F_FULLFSYNC flushes that too. Filesystems
// without it (some network ones) get fsync.
func syncData(fd int) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_FULLFSYNC, 0); err == nil {
		return nil
	}
	return unix.Fsync(fd)
}

// syncName names syncData's system call in errors.
const syncName = "fsync"
