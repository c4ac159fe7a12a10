// Package regfile opens a file that a command reads whole (a config, a
// trace) only when it is a regular file. Opening a named pipe blocks until
// a writer comes, which may be never, and reading a device (/dev/zero, a
// tape) never ends or has side effects; neither is what a user meant by
// "the config file". Open refuses them before it opens anything, and
// checks again on the descriptor it opened (the path may have been
// replaced in between), so it never blocks. It is public so that commands
// outside this module (the GoMLX adapter's zinf-generate) apply the same
// rule to the files their flags name.
package regfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is matched (errors.Is) by Open's error for a path that is
// not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// NotRegularError says what kind of file a path is instead of a regular
// one.
type NotRegularError struct {
	Path string
	Kind string // "a directory", "a named pipe (FIFO)", ...
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file", e.Path, e.Kind)
}

// Is reports whether target is ErrNotRegular.
func (e *NotRegularError) Is(target error) bool { return target == ErrNotRegular }

// Kind names the kind of file mode describes, for messages.
func Kind(mode fs.FileMode) string {
	switch {
	case mode.IsRegular():
		return "a regular file"
	case mode.IsDir():
		return "a directory"
	case mode&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeCharDevice != 0:
		return "a character device"
	case mode&fs.ModeDevice != 0:
		return "a block device"
	case mode&fs.ModeSymlink != 0:
		return "a symbolic link"
	default:
		return "a special file (" + mode.Type().String() + ")"
	}
}

// Open opens path for reading when it is a regular file (a symbolic link
// to one is followed) and returns it with its FileInfo. Anything else is
// refused with a *NotRegularError and is not opened: the path is examined
// with stat first, then opened with O_NONBLOCK (so that a named pipe put
// there in between cannot block the open) and examined again through the
// descriptor. Other failures are *os.PathError.
func Open(path string) (*os.File, os.FileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, &NotRegularError{Path: path, Kind: Kind(st.Mode())}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	st, err = f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, &NotRegularError{Path: path, Kind: Kind(st.Mode())}
	}
	return f, st, nil
}
