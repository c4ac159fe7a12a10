//go:build unix

package swapper

import (
	"os"

	"golang.org/x/sys/unix"
)

// sameFile reports whether f is the file open as descriptor fd (the same
// device and inode).
func sameFile(fd int, f *os.File) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(fd, &a); err != nil {
		return false, err
	}
	if err := unix.Fstat(int(f.Fd()), &b); err != nil {
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}
