//go:build linux

package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/internal/base/testhook"
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

// createNamed creates the file path already holding what write puts in it
// and already flock'ed, in one visible step: the file is made unnamed
// (O_TMPFILE) in path's directory, locked and written there, then linked
// to path, which fails with an error matching os.ErrExist if path exists.
// A crash at any moment leaves either nothing or the whole file, so no
// half-made file of ours is ever left for a sweep to puzzle over. It
// reports ok false, having created nothing, where the filesystem or the
// kernel cannot make unnamed files or link them (the caller falls back to
// a create-then-rename).
func createNamed(path string, write func(*os.File) error) (f *os.File, ok bool, err error) {
	fd, err := unix.Open(filepath.Dir(path), unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			return nil, false, nil
		}
		return nil, false, &os.PathError{Op: "create unnamed", Path: filepath.Dir(path), Err: err}
	}
	f = os.NewFile(uintptr(fd), path)
	locked, err := tryLock(f) // nobody else can see the file yet
	if err == nil && !locked {
		err = errors.New("an unnamed file is locked by someone else")
	}
	if err == nil {
		err = write(f)
	}
	if err != nil {
		f.Close()
		return nil, false, err
	}
	testhook.Hit("checkpoint/lock-unnamed")
	// Linking by the /proc path needs no privilege; AT_EMPTY_PATH does
	// (CAP_DAC_READ_SEARCH), so it is the second try.
	err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		if err2 := unix.Linkat(fd, "", unix.AT_FDCWD, path, unix.AT_EMPTY_PATH); err2 == nil || errors.Is(err2, unix.EEXIST) {
			err = err2
		}
	}
	switch {
	case err == nil:
		return f, true, nil
	case errors.Is(err, unix.EEXIST):
		f.Close()
		return nil, false, &os.PathError{Op: "create", Path: path, Err: os.ErrExist}
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV):
		f.Close()
		return nil, false, nil // cannot link it here: fall back
	}
	f.Close()
	return nil, false, &os.LinkError{Op: "link", Old: "(unnamed)", New: path, Err: err}
}
