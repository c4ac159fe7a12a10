//go:build unix

package swapper

import "golang.org/x/sys/unix"

// accessWrite reports whether the directory can be written, read-only
// mounts included (root ignores permission bits but not EROFS).
func accessWrite(p string) error { return unix.Access(p, unix.W_OK) }
