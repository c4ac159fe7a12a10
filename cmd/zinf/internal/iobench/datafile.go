package iobench

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/swapper"
)

// dataFile is the file a measurement reads or writes, and what zinf knows
// about it. The directory it lives in may be shared with other users (a
// scratch mount, /tmp), and its name is predictable, so another user can
// plant a symbolic link or a file of that name before zinf runs. Every open
// is therefore O_NOFOLLOW, a new file is created with O_EXCL, a file that
// was there before is only ever read, and nothing is removed unless zinf
// created it in this run and the name still refers to that file.
type dataFile struct {
	path string
	// created: zinf created the file in this run (or it lies in a private
	// directory zinf created in this run), so it may write and remove it.
	created bool
	// overwrite: the file was there before and the user asked to rewrite
	// it (Options.Overwrite): zinf writes it but never removes it.
	overwrite bool
	// dev and ino identify the file claimed, so that a name swapped for
	// another file between two opens is noticed instead of used.
	dev, ino uint64
	// size is the file's size when it was claimed.
	size int64
}

// errNotOurs is matched by the errors that refuse a file zinf did not
// create.
var errNotOurs = errors.New("zinf writes and removes only files it created in this run")

// claimDataFile creates path exclusively, or, when a regular file of that
// name already exists, takes it for reading only: op "read" reuses it
// read-only when it holds at least size bytes; any other case is an error
// that says what is there and what to do. private says the file lies in a
// directory zinf created in this run, where an existing file is one an
// earlier pass of the same run made and may be rewritten. overwrite lets a
// write rewrite an existing file when it is a regular file (not a link)
// owned by the user running zinf (Options.Overwrite).
func claimDataFile(path, op string, size int64, private, overwrite bool) (*dataFile, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err == nil {
		defer unix.Close(fd)
		d := &dataFile{path: path, created: true}
		if err := d.identify(fd); err != nil {
			os.Remove(path) // created by the open above, so it is ours to remove
			return nil, err
		}
		return d, nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return nil, &os.PathError{Op: "create", Path: path, Err: err}
	}
	// Something is there already. Look at the name itself, not what it
	// points to.
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, fmt.Errorf("%s is a symbolic link: zinf does not follow links for its data file (it could overwrite the link's target); remove the link or choose another --file or --path: %w", path, errNotOurs)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s exists and is not a regular file: remove it or choose another --file or --path: %w", path, errNotOurs)
	}
	if private {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
		defer unix.Close(fd)
		d := &dataFile{path: path, created: true}
		return d, d.identify(fd)
	}
	if op != "read" {
		if overwrite {
			return overwriteDataFile(path, &st)
		}
		return nil, fmt.Errorf("%s already exists and zinf did not create it in this run, so it will not overwrite it: remove it, choose another --file or --path, or give --overwrite to rewrite it (a regular file of yours): %w", path, errNotOurs)
	}
	if st.Size < size {
		return nil, fmt.Errorf("%s already exists with %d bytes, fewer than --size %d, and zinf did not create it in this run, so it will not write to it: remove it, or run --op write --keep on a free name first: %w",
			path, st.Size, size, errNotOurs)
	}
	return &dataFile{path: path, dev: uint64(st.Dev), ino: st.Ino, size: st.Size}, nil
}

// overwriteDataFile takes the existing regular file at path, whose lstat
// is st, for rewriting: only when the user running zinf owns it. It is
// opened without following a link and without blocking (a name swapped
// for a pipe cannot hold the open), and the descriptor must be the file
// st describes. The file is written in place and never removed.
func overwriteDataFile(path string, st *unix.Stat_t) (*dataFile, error) {
	if uid := uint32(os.Geteuid()); st.Uid != uid {
		return nil, fmt.Errorf("%s belongs to uid %d, not to the user running zinf (uid %d): --overwrite rewrites only your own files: %w", path, st.Uid, uid, errNotOurs)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if fst.Mode&unix.S_IFMT != unix.S_IFREG || fst.Dev != st.Dev || fst.Ino != st.Ino || fst.Uid != st.Uid {
		return nil, fmt.Errorf("%s was replaced while zinf examined it; nothing was written: %w", path, errNotOurs)
	}
	return &dataFile{path: path, overwrite: true, dev: uint64(fst.Dev), ino: fst.Ino, size: fst.Size}, nil
}

// identify records the identity of the open file fd.
func (d *dataFile) identify(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: d.path, Err: err}
	}
	d.dev, d.ino, d.size = uint64(st.Dev), st.Ino, st.Size
	return nil
}

// openFlags are the flags to open the claimed file with: read-write for a
// file zinf created or was asked to overwrite, read-only for one it reuses;
// never following a link.
func (d *dataFile) openFlags() int {
	if d.created || d.overwrite {
		return os.O_RDWR | unix.O_NOFOLLOW
	}
	return os.O_RDONLY | unix.O_NOFOLLOW
}

// check verifies that fd, opened by name after the claim, is the claimed
// file: a name swapped in between is refused rather than used.
func (d *dataFile) check(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: d.path, Err: err}
	}
	if uint64(st.Dev) != d.dev || st.Ino != d.ino {
		return fmt.Errorf("%s was replaced by another file while zinf was using it; nothing was written to the new one", d.path)
	}
	return nil
}

// openRead opens the claimed file for reading, checked as check does.
func (d *dataFile) openRead() (*os.File, error) {
	f, err := os.OpenFile(d.path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if err := d.check(int(f.Fd())); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openEngine opens the claimed file through e and checks that the
// descriptor is the file claimed.
func (d *dataFile) openEngine(e aio.Engine) (*aio.File, error) {
	f, err := e.Open(d.path, d.openFlags(), 0o600)
	if err != nil {
		return nil, err
	}
	if err := d.check(f.Fd()); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// remove deletes the file if zinf created it and the name still refers to
// it; anything else is left alone.
func (d *dataFile) remove() {
	if !d.created {
		return
	}
	var st unix.Stat_t
	if unix.Lstat(d.path, &st) != nil || uint64(st.Dev) != d.dev || st.Ino != d.ino {
		return
	}
	os.Remove(d.path)
}

// privateDir makes a directory only this user can enter inside dir, for
// runs that rewrite one file many times (tune, bench-io): nobody else can
// plant anything in it. It is a swapper.RunDir named for the tool, locked
// while the run lives: the next run in dir (or any swap store opened
// there) removes one a killed run left, and zinf doctor counts it. The
// caller closes it, which removes it.
func privateDir(dir, name string, log *slog.Logger) (*swapper.RunDir, error) {
	d, err := swapper.NewRunDir(dir, name, log)
	if err != nil {
		return nil, fmt.Errorf("--path %q: creating a private directory for the data file: %w", dir, err)
	}
	return d, nil
}
