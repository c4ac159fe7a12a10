//go:build !linux

package checkpoint

import "os"

// tryLock reports every lock as held where flock is not wired up, so a
// temporary directory with a lock file is never removed as stale (only
// those without one are); an operator removes crashed writers' leftovers.
func tryLock(f *os.File) (bool, error) { return false, nil }

// renameNoReplace is a check then rename(2), which refuses a non-empty
// target.
func renameNoReplace(from, to string) error {
	if _, err := os.Lstat(to); err == nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: os.ErrExist}
	}
	return os.Rename(from, to)
}

// renameExchange is not available: the caller replaces in two steps.
func renameExchange(from, to string) (bool, error) { return false, nil }

// createNamed is not available: the caller creates the file under a
// temporary name and renames it.
func createNamed(path string, write func(*os.File) error) (*os.File, bool, error) {
	return nil, false, nil
}
