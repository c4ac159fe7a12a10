package aio

import "golang.org/x/sys/unix"

// openDirect opens path with O_DIRECT. A filesystem that refuses it fails
// with EINVAL.
func openDirect(path string, flag int, perm uint32) (int, error) {
	return openFn(path, flag|unix.O_DIRECT, perm)
}

// syncData flushes fd's data to the device.
func syncData(fd int) error { return unix.Fsync(fd) }

// syncName names syncData's system call in errors.
const syncName = "fsync"
