package swapper

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/zinfio/zinf/internal/base/testhook"
)

// RunDir is a scratch directory of a run that is not a Store's: a tool's
// (zinf bench-io, tune, ckpt bench, bench-scale) data files. It is made
// and locked exactly as OpenStore makes a store's run directory (named
// "zinf-" + name + "-" + pid + "-" + a random number, holding a lock file
// flock'ed while the run lives), so a run killed before Close (SIGKILL, an
// OOM kill) leaves a directory that FindStale lists (zinf doctor counts it)
// and that the next NewRunDir or OpenStore in the same path removes.
// Only directories of that exact shape holding a lock file a live process
// does not hold, written on this host, are ever removed: nothing zinf did
// not create is.
type RunDir struct {
	path string
	lock *os.File
}

// NewRunDir removes what runs that are gone left in parent (as OpenStore
// does, reporting each to log; nil means slog.Default()), then creates and
// locks a run directory named for name in parent, private to this user
// (mode 0700). Close removes it.
func NewRunDir(parent, name string, log *slog.Logger) (*RunDir, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("swapper: run directory name %q must be non-empty, without a slash or NUL", name)
	}
	if log == nil {
		log = slog.Default()
	}
	if err := checkDir(parent); err != nil {
		return nil, err
	}
	sweepStale(parent, false, log)
	dir, lock, err := makeRunDir(parent, name)
	if err != nil {
		return nil, fmt.Errorf("swapper: creating a run directory in %s: %w", parent, err)
	}
	testhook.Hit("swapper/run-dir")
	return &RunDir{path: dir, lock: lock}, nil
}

// Path is the directory.
func (d *RunDir) Path() string { return d.path }

// Close removes the directory and everything in it, then releases its
// lock. It is called once.
func (d *RunDir) Close() error {
	if d == nil || d.lock == nil {
		return nil
	}
	err := os.RemoveAll(d.path)
	if err != nil {
		err = fmt.Errorf("swapper: removing run directory %s: %w", d.path, err)
	}
	// The lock goes last: a directory is never unlocked while it exists.
	d.lock.Close()
	d.lock = nil
	return err
}
