//go:build unix && !linux

package swapper

import "golang.org/x/sys/unix"

// freeSpace returns the filesystem of path (its device number) and the
// bytes free there for an unprivileged writer; reported is false where the
// filesystem reports no blocks at all.
func freeSpace(path string) (dev uint64, free int64, reported bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, false, err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, 0, false, err
	}
	if fs.Blocks == 0 {
		return uint64(st.Dev), 0, false, nil
	}
	return uint64(st.Dev), int64(fs.Bavail) * int64(fs.Bsize), true, nil
}
