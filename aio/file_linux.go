package aio

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openDirect opens path with O_DIRECT. A filesystem that refuses O_DIRECT
// fails the open with EINVAL.
func openDirect(path string, flag int, perm uint32) (int, error) {
	return openFn(path, flag|unix.O_DIRECT, perm)
}

// tmpfileFlag is O_TMPFILE: OpenFile's path is then a directory.
const tmpfileFlag = unix.O_TMPFILE

// openTmpDirect opens an unnamed O_DIRECT file in dir (O_TMPFILE), which
// vanishes when closed.
func openTmpDirect(dir string) (int, error) {
	return openFn(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
}

// fallocate reserves size bytes from offset 0.
func fallocate(fd int, size int64) error { return unix.Fallocate(fd, 0, 0, size) }

// syncData flushes fd's data, and the metadata needed to read it back.
func syncData(fd int) error { return unix.Fdatasync(fd) }

// syncName names syncData's system call in errors.
const syncName = "fdatasync"

// fsName returns the filesystem type name of dir, for messages.
func fsName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	switch uint32(st.Type) {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.RAMFS_MAGIC:
		return "ramfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	}
	return fmt.Sprintf("0x%x", uint32(st.Type))
}

// directAlignment returns the alignment O_DIRECT transfers on fd need: the
// larger of statx's DIO offset and memory alignments where the kernel reports
// them, else the device's logical block size, else the filesystem block size.
func directAlignment(fd int, path string) (int, error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx); err == nil &&
		stx.Mask&unix.STATX_DIOALIGN != 0 && stx.Dio_offset_align > 0 {
		return int(max(stx.Dio_offset_align, stx.Dio_mem_align)), nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if n := logicalBlockSize(uint32(unix.Major(st.Dev)), uint32(unix.Minor(st.Dev))); n > 0 {
		return n, nil
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err == nil && sfs.Bsize > 0 {
		return int(sfs.Bsize), nil
	}
	return 0, fmt.Errorf("aio: %s: cannot determine O_DIRECT alignment (no statx DIO info, no block device, no statfs)", path)
}

// logicalBlockSize reads the device's logical block size from sysfs (for a
// partition, from its parent disk). It returns 0 when unknown.
func logicalBlockSize(maj, mnr uint32) int {
	base := fmt.Sprintf("/sys/dev/block/%d:%d", maj, mnr)
	for _, p := range []string{base + "/queue/logical_block_size", base + "/../queue/logical_block_size"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return n
		}
	}
	return 0
}
