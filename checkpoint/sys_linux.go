//go:build linux

package checkpoint

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// tryLock takes an exclusive flock on f without blocking. It reports false
// when another open file description (another writer, in this process or
// another) holds it. The kernel drops the lock when its holder dies, even by
// SIGKILL, which is what tells a live writer's temporary directory from a
// crashed one's.
func tryLock(f *os.File) (bool, error) {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	return false, &os.PathError{Op: "flock", Path: f.Name(), Err: err}
}

// renameNoReplace renames from to to, failing with an error matching
// os.ErrExist if to exists. Where the filesystem lacks RENAME_NOREPLACE it
// falls back to a check then rename(2), which refuses a non-empty target.
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		if _, serr := os.Lstat(to); serr == nil {
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: os.ErrExist}
		}
		return os.Rename(from, to)
	}
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: os.ErrExist}
	}
	return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
}

// renameExchange atomically swaps from and to (both exist). It reports
// false, without error, when the filesystem cannot exchange; the caller
// then replaces in two steps.
func renameExchange(from, to string) (bool, error) {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_EXCHANGE)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return false, nil
	}
	return false, &os.LinkError{Op: "rename-exchange", Old: from, New: to, Err: err}
}
