package doctor

import "golang.org/x/sys/unix"

// ramBacked names the RAM-backed filesystem sfs describes ("ramfs",
// "tmpfs"), or is empty.
func ramBacked(sfs *unix.Statfs_t) string {
	switch sfs.Type {
	case unix.RAMFS_MAGIC:
		return "ramfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	}
	return ""
}
