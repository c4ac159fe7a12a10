package aio

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// File is a file opened for tensor I/O. It stays open across requests and
// is safe for concurrent use. Close waits for no one: it marks the file
// closing, and the descriptor is released when the last in-flight request
// on it completes.
type File struct {
	fd     int
	path   string
	direct bool
	align  int

	mu       sync.Mutex
	refs     int  // in-flight requests
	closing  bool // Close called
	closed   bool // fd released
	closeErr error
	// watchers are the workers whose rings hold the file in their
	// fixed-file tables; each is told when the descriptor is closed, so
	// that it frees the slot (and the ring's reference to the file).
	watchers []*worker
}

// openFn is the open(2) used by OpenFile; tests replace it to simulate a
// filesystem without O_DIRECT.
var openFn = unix.Open

// OpenFile opens path (flag as os.OpenFile: os.O_RDWR|os.O_CREATE, ...;
// on Linux O_TMPFILE, path then naming the directory) applying the
// O_DIRECT policy. With DirectOptional, a filesystem that
// refuses O_DIRECT yields a buffered file and one warning on log (which may
// be nil). With DirectRequired it yields an error matching ErrNoDirect that
// names the path.
func OpenFile(path string, flag int, perm os.FileMode, policy DirectPolicy, log *slog.Logger) (*File, error) {
	if log == nil {
		log = slog.Default()
	}
	// The directory the file is in: for an unnamed file (O_TMPFILE),
	// path is that directory.
	dir := filepath.Dir(path)
	if tmpfileFlag != 0 && flag&tmpfileFlag == tmpfileFlag {
		dir = path
	}
	flag |= unix.O_CLOEXEC
	if policy == DirectOff {
		fd, err := openFn(path, flag, uint32(perm.Perm()))
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return &File{fd: fd, path: path, align: 1}, nil
	}
	fd, err := openDirect(path, flag, uint32(perm.Perm()))
	if err == nil {
		align, aerr := directAlignment(fd, path)
		if aerr != nil {
			unix.Close(fd)
			return nil, aerr
		}
		return &File{fd: fd, path: path, direct: true, align: align}, nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if policy == DirectRequired {
		if flag&unix.O_CREAT != 0 && flag&unix.O_EXCL != 0 {
			os.Remove(path) // created by the refused open (see below); nothing must be left
		}
		return nil, fmt.Errorf("aio: open %s: the filesystem (%s) refuses O_DIRECT and the policy is \"required\" (set it to \"optional\" to fall back to buffered I/O, or put the swap files on a filesystem with O_DIRECT such as ext4 or xfs): %w",
			path, fsName(dir), ErrNoDirect)
	}
	// Some filesystems create the file before refusing O_DIRECT. With
	// O_EXCL the refused open proves the file did not exist before, so the
	// file there now is ours: open it without O_EXCL.
	fd, err = openFn(path, flag&^unix.O_EXCL, uint32(perm.Perm()))
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	warnNoDirectOnce(log, dir)
	return &File{fd: fd, path: path, align: 1}, nil
}

var noDirectWarned sync.Map // noDirectKey -> struct{}

// noDirectKey names dir's filesystem (its device number), so that the
// fallback warning is given once per filesystem per process, not once per
// directory: each swap store makes its own run directory, and a run on
// ramfs used to print the same warning once per store and rank.
func noDirectKey(dir string) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "dir " + dir
	}
	return fmt.Sprintf("dev %d", uint64(st.Dev))
}

func warnNoDirectOnce(log *slog.Logger, dir string) {
	if _, loaded := noDirectWarned.LoadOrStore(noDirectKey(dir), struct{}{}); loaded {
		return
	}
	log.Warn("aio: filesystem refuses O_DIRECT; falling back to buffered I/O (policy \"optional\"); throughput will include page-cache copies",
		"dir", dir, "fs", fsName(dir))
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Direct reports whether the file was opened with O_DIRECT.
func (f *File) Direct() bool { return f.direct }

// Alignment returns the alignment O_DIRECT transfers need (1 when not
// O_DIRECT): offsets, lengths and buffer addresses must be multiples of it.
func (f *File) Alignment() int { return f.align }

// Fd returns the descriptor, for backends and diagnostics. It is valid until
// Close.
func (f *File) Fd() int { return f.fd }

// Size returns the file's current size.
func (f *File) Size() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return 0, &os.PathError{Op: "fstat", Path: f.path, Err: err}
	}
	return st.Size, nil
}

// Allocate reserves size bytes of disk for the file (fallocate on Linux),
// so later writes cannot fail for lack of space. It falls back to Truncate
// where the filesystem or the system has no such call (which sets the size
// without reserving the blocks).
func (f *File) Allocate(size int64) error {
	err := fallocate(f.fd, size)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return f.Truncate(size)
	}
	return &os.PathError{Op: "fallocate", Path: f.path, Err: err}
}

// Truncate sets the file's size.
func (f *File) Truncate(size int64) error {
	if err := unix.Ftruncate(f.fd, size); err != nil {
		return &os.PathError{Op: "truncate", Path: f.path, Err: err}
	}
	return nil
}

// Sync flushes the file's data to the device (fdatasync on Linux, fsync
// elsewhere, F_FULLFSYNC on macOS, whose fsync leaves the drive's cache).
func (f *File) Sync() error {
	if err := syncData(f.fd); err != nil {
		return &os.PathError{Op: syncName, Path: f.path, Err: err}
	}
	return nil
}

// acquire takes a reference for an in-flight request.
func (f *File) acquire() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return ErrClosed
	}
	f.refs++
	return nil
}

// release drops a reference; the last one after Close releases the fd.
func (f *File) release() {
	f.mu.Lock()
	f.refs--
	var watchers []*worker
	if f.refs == 0 && f.closing && !f.closed {
		watchers = f.closeLocked()
	}
	f.mu.Unlock()
	notifyClosed(f, watchers)
}

// closeLocked releases the descriptor and returns the workers to tell.
func (f *File) closeLocked() []*worker {
	f.closed = true
	f.closeErr = unix.Close(f.fd)
	w := f.watchers
	f.watchers = nil
	return w
}

func notifyClosed(f *File, watchers []*worker) {
	for _, w := range watchers {
		w.fileClosed(f)
	}
}

// watch records that w's ring holds f in its fixed-file table; it reports
// false when f is already closed.
func (f *File) watch(w *worker) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.watchers = append(f.watchers, w)
	return true
}

// Close marks the file closed. The descriptor is released now if no request
// is in flight, else when the last one completes. Close is idempotent.
func (f *File) Close() error {
	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		return nil
	}
	f.closing = true
	if f.refs > 0 {
		f.mu.Unlock()
		return nil
	}
	watchers := f.closeLocked()
	err := f.closeErr
	f.mu.Unlock()
	notifyClosed(f, watchers)
	if err != nil {
		return &os.PathError{Op: "close", Path: f.path, Err: err}
	}
	return nil
}

// ProbeDir returns the O_DIRECT alignment files in dir get under policy,
// and whether O_DIRECT works there. It opens an unnamed O_TMPFILE where the
// filesystem supports it, else a named probe file that is removed, so
// nothing is left behind (unnamed files exist on Linux only). With
// DirectOff it returns 1, false.
func ProbeDir(dir string, policy DirectPolicy) (align int, direct bool, err error) {
	if policy == DirectOff {
		return 1, false, nil
	}
	if fd, err := openTmpDirect(dir); err == nil {
		defer unix.Close(fd)
		a, err := directAlignment(fd, dir)
		return a, err == nil, err
	}
	p := filepath.Join(dir, fmt.Sprintf(".zinf-probe-%d", os.Getpid()))
	f, err := OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600, policy, slog.New(slog.DiscardHandler))
	// A filesystem may create the file before refusing O_DIRECT: remove
	// the probe whatever the outcome.
	defer os.Remove(p)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	return f.Alignment(), f.Direct(), nil
}
