//go:build unix && !linux

package doctor

import "golang.org/x/sys/unix"

// ramBacked names a RAM-backed filesystem ("tmpfs"), or is empty. BSD and
// macOS statfs carry the filesystem's name.
func ramBacked(sfs *unix.Statfs_t) string {
	if unix.ByteSliceToString(sfs.Fstypename[:]) == "tmpfs" {
		return "tmpfs"
	}
	return ""
}
