//go:build darwin || freebsd

package aio

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openTmpDirect fails: unnamed files (O_TMPFILE) exist on Linux only, so
// ProbeDir uses a named probe file here.
func openTmpDirect(string) (int, error) { return -1, unix.EOPNOTSUPP }

// tmpfileFlag is 0: there is no O_TMPFILE here.
const tmpfileFlag = 0

// fallocate fails with EOPNOTSUPP: neither macOS nor FreeBSD offers a
// fallocate that x/sys/unix exposes, so Allocate falls back to Truncate.
func fallocate(int, int64) error { return unix.EOPNOTSUPP }

// fsName returns the filesystem type name of dir, for messages.
func fsName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(st.Fstypename[:])
}

// directAlignment returns the alignment uncached transfers on fd are held
// to: the filesystem's block size. (macOS accepts unaligned F_NOCACHE
// transfers but serves them through the cache; FreeBSD's O_DIRECT wants
// whole blocks.)
func directAlignment(fd int, path string) (int, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return 0, &os.PathError{Op: "fstatfs", Path: path, Err: err}
	}
	if sfs.Bsize <= 0 || sfs.Bsize > 1<<20 {
		return 0, fmt.Errorf("aio: %s: cannot determine the direct-I/O alignment: the filesystem reports block size %d (allowed: 1 to %d)", path, sfs.Bsize, 1<<20)
	}
	return int(sfs.Bsize), nil
}
