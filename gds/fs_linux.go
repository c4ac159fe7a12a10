package gds

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Filesystem magic numbers (statfs f_type) for the filesystems whose GDS
// support is known. Values from linux/magic.h and the vendors' headers.
const (
	magicLustre = 0x0BD00BD0
	magicGPFS   = 0x47504653
	magicBeeGFS = 0x19830326
	magicWekaFS = 0x65656565
	magicZFS    = 0x2FC12FC1
)

// fsNames names the filesystems Available reports on.
var fsNames = map[int64]string{
	unix.EXT4_SUPER_MAGIC:      "ext4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.NFS_SUPER_MAGIC:       "nfs",
	magicLustre:                "lustre",
	magicGPFS:                  "gpfs",
	magicBeeGFS:                "beegfs",
	magicWekaFS:                "wekafs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.RAMFS_MAGIC:           "ramfs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlayfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.FUSE_SUPER_MAGIC:      "fuse",
	unix.SQUASHFS_MAGIC:        "squashfs",
	magicZFS:                   "zfs",
}

// unsupportedFS are filesystems GPUDirect Storage cannot do direct I/O on
// (no O_DIRECT, or no GDS support in the kernel driver).
var unsupportedFS = map[int64]bool{
	unix.TMPFS_MAGIC:           true,
	unix.RAMFS_MAGIC:           true,
	unix.OVERLAYFS_SUPER_MAGIC: true,
	unix.BTRFS_SUPER_MAGIC:     true,
	unix.FUSE_SUPER_MAGIC:      true,
	unix.SQUASHFS_MAGIC:        true,
	magicZFS:                   true,
}

// statfsType is unix.Statfs's f_type; tests replace it.
var statfsType = func(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Type), nil
}

func filesystemName(path string) (string, error) {
	t, err := statfsType(path)
	if err != nil {
		return "", err
	}
	if n, ok := fsNames[t]; ok {
		return n, nil
	}
	return fmt.Sprintf("0x%x", t), nil
}

// filesystemSupported says whether GPUDirect Storage can work on path's
// filesystem: nil, or why not. Filesystems not known to be unsupported pass;
// cuFileHandleRegister has the last word.
func filesystemSupported(path string) error {
	t, err := statfsType(path)
	if err != nil {
		return fmt.Errorf("gds: cannot check the filesystem of %s: %w", path, err)
	}
	if unsupportedFS[t] {
		return fmt.Errorf("gds: %s is on %s, which GPUDirect Storage does not support (use ext4 or xfs on local NVMe, or a GDS-enabled distributed filesystem such as Lustre, GPFS, WekaFS, BeeGFS or NFS over RDMA)",
			path, fsNames[t])
	}
	return nil
}

// registrationFd returns the descriptor to hand cuFileHandleRegister for
// the file open as fd, and the extra file it opened for that, if any (the
// caller closes it after deregistering). cuFile refuses a descriptor whose
// status flags hold O_NOFOLLOW ("fd opened with unsupported flags",
// CU_FILE_INVALID_FILE_OPEN_FLAG, seen with cuFile 1.15 on an H200), and
// zinf opens its swap and benchmark files with O_NOFOLLOW so that a link
// planted at their path is never followed. Reopening through
// /proc/self/fd names the open file itself, not a path, so the reopened
// descriptor is the same file the first open checked; it keeps the access
// mode and O_DIRECT and drops only O_NOFOLLOW.
func registrationFd(fd int) (int, *os.File, error) {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return -1, nil, fmt.Errorf("fcntl(F_GETFL) on fd %d: %w", fd, err)
	}
	if fl&unix.O_NOFOLLOW == 0 {
		return fd, nil, nil
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), fl&(unix.O_ACCMODE|unix.O_DIRECT)|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, fmt.Errorf("reopening fd %d without O_NOFOLLOW for cuFile: %w", fd, err)
	}
	return int(f.Fd()), f, nil
}
