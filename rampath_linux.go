package zinf

import "golang.org/x/sys/unix"

// ramFilesystem names the RAM-backed filesystem dir is on ("tmpfs",
// "ramfs"), or is empty.
func ramFilesystem(dir string) string {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return ""
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.RAMFS_MAGIC:
		return "ramfs"
	}
	return ""
}
