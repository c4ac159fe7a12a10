package gds

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFilesystemSupported(t *testing.T) {
	old := statfsType
	defer func() { statfsType = old }()
	for _, c := range []struct {
		magic int64
		ok    bool
		name  string
	}{
		{unix.EXT4_SUPER_MAGIC, true, "ext4"},
		{unix.XFS_SUPER_MAGIC, true, "xfs"},
		{unix.TMPFS_MAGIC, false, "tmpfs"},
		{unix.OVERLAYFS_SUPER_MAGIC, false, "overlayfs"},
		{0x12345, true, "0x12345"},
	} {
		statfsType = func(string) (int64, error) { return c.magic, nil }
		err := filesystemSupported("/data/swap")
		if (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
		if err != nil && (!strings.Contains(err.Error(), "/data/swap is on "+c.name) || !strings.Contains(err.Error(), "does not support")) {
			t.Errorf("%s: message %q", c.name, err)
		}
		if n, _ := filesystemName("/x"); n != c.name {
			t.Errorf("name %q, want %q", n, c.name)
		}
	}
}
