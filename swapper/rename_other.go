//go:build !linux

package swapper

import "os"

// renameNoReplace renames from to to, failing with an error matching
// os.ErrExist when to exists: a check, then rename(2).
func renameNoReplace(from, to string) error {
	if _, err := os.Lstat(to); err == nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: os.ErrExist}
	}
	return os.Rename(from, to)
}
