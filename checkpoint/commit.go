package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Names in the checkpoint root. A writer's temporary directory is
// <root>/.tmp-<name>-<random>, next to its lock file <dir>.lock; retention
// moves victims to <root>/.tmp-del-<name>-<random> before removing them.
// Everything starting with ".tmp-" is invisible to Latest and List.
const (
	tmpPrefix  = ".tmp-"
	delPrefix  = ".tmp-del-"
	lockSuffix = ".lock"
	initSuffix = ".init" // a lock file being created: <dir>.lock.init
)

// testHookCommit, set only by tests (before any save starts), is called at
// the commit's stages, so a crash test can kill a writer inside them.
var testHookCommit func(stage string)

// txn is one checkpoint being written: the temporary directory, its lock,
// and the commit.
//
// The lock file is created and flock'ed before the directory exists and
// removed only after the directory is gone (renamed into place or removed),
// so a temporary directory without a lock file, or whose lock file nobody
// holds, belongs to a writer that died: the kernel drops a dead process's
// flock, SIGKILL included. cleanStale removes exactly those.
type txn struct {
	root, name string
	final, tmp string
	lock       *os.File
	lockPath   string
	overwrite  bool
	log        *slog.Logger
	committed  bool
}

// begin checks the target and creates the lock and the temporary directory.
func begin(root, name string, overwrite bool, log *slog.Logger) (*txn, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, &Error{Op: "save", Path: root, Err: fmt.Errorf("creating the checkpoint root: %w", err)}
	}
	final := filepath.Join(root, name)
	if err := checkTarget(final, overwrite); err != nil {
		return nil, err
	}
	suffix, err := randomSuffix()
	if err != nil {
		return nil, err
	}
	t := &txn{root: root, name: name, final: final, overwrite: overwrite, log: log,
		tmp: filepath.Join(root, tmpPrefix+name+"-"+suffix)}
	lf, err := createLock(t.tmp + lockSuffix)
	if err != nil {
		return nil, &Error{Op: "save", Path: root, Err: fmt.Errorf("creating the writer lock: %w", err)}
	}
	t.lock, t.lockPath = lf, t.tmp+lockSuffix
	if err := os.Mkdir(t.tmp, 0o755); err != nil {
		t.unlock()
		return nil, &Error{Op: "save", Path: t.tmp, Err: err}
	}
	return t, nil
}

// createLock creates the lock file path already flock'ed: it is created
// and locked under the name path+".init" (which cleanStale removes only
// when it can lock it) and then renamed to path, so no other writer ever
// sees path unlocked while its owner lives. (Created directly, a cleaner
// could lock and remove it between our create and our flock.)
func createLock(path string) (*os.File, error) {
	init := path + initSuffix
	lf, err := os.OpenFile(init, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	ok, err := tryLock(lf)
	if err == nil && !ok {
		err = errors.New("a fresh lock file is locked by someone else")
	}
	if err == nil {
		host, _ := os.Hostname()
		fmt.Fprintf(lf, "pid=%d host=%s started=%s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339Nano))
		// Fails (ENOENT) only if a cleaner removed the .init file before we
		// locked it; the save then fails rather than run unprotected.
		err = os.Rename(init, path)
	}
	if err != nil {
		lf.Close()
		os.Remove(init)
		return nil, err
	}
	return lf, nil
}

// checkTarget refuses to replace anything but a committed zinf checkpoint,
// and that only with overwrite.
func checkTarget(final string, overwrite bool) error {
	st, err := os.Lstat(final)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &Error{Op: "save", Path: final, Err: err}
	}
	if !st.IsDir() {
		return &Error{Op: "save", Path: final, Err: fmt.Errorf("%w: a file of that name exists; it is not replaced", ErrExists)}
	}
	if _, err := readIndex(final); err != nil {
		return &Error{Op: "save", Path: final, Err: fmt.Errorf("%w: the directory exists and is not a readable zinf checkpoint (%v); it is never replaced", ErrExists, err)}
	}
	if !overwrite {
		return &Error{Op: "save", Path: final, Err: fmt.Errorf("%w: a committed checkpoint of that name exists (set SaveOptions.Overwrite to replace it)", ErrExists)}
	}
	return nil
}

func randomSuffix() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// commit makes the temporary directory the checkpoint: fsync it, rename it
// into place (atomically exchanging with the old one under overwrite), then
// fsync the root so the rename itself is durable.
func (t *txn) commit() error {
	if err := syncDir(t.tmp); err != nil {
		return &Error{Op: "commit", Path: t.tmp, Err: err}
	}
	if testHookCommit != nil {
		testHookCommit("before-rename")
	}
	err := renameNoReplace(t.tmp, t.final)
	replaced := false
	if errors.Is(err, os.ErrExist) && t.overwrite {
		// Re-check: only a committed zinf checkpoint is ever replaced.
		if cerr := checkTarget(t.final, true); cerr != nil {
			return cerr
		}
		var ok bool
		ok, err = renameExchange(t.tmp, t.final)
		if err == nil && !ok {
			// No RENAME_EXCHANGE: move the old one aside (a ".tmp-" name
			// without a live lock: a crash here leaves it to cleanStale,
			// with the new checkpoint complete in the other ".tmp-"
			// directory; the name is briefly absent).
			var suffix string
			if suffix, err = randomSuffix(); err != nil {
				return &Error{Op: "commit", Path: t.final, Err: err}
			}
			aside := filepath.Join(t.root, delPrefix+t.name+"-"+suffix)
			if err = os.Rename(t.final, aside); err == nil {
				err = os.Rename(t.tmp, t.final)
				if err != nil {
					os.Rename(aside, t.final) // put the old one back
				} else {
					os.RemoveAll(aside)
				}
			}
		} else if err == nil {
			replaced = true // t.tmp now holds the old checkpoint
		}
	}
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return &Error{Op: "commit", Path: t.final, Err: fmt.Errorf("%w: another writer committed this name first", ErrExists)}
		}
		return &Error{Op: "commit", Path: t.final, Err: err}
	}
	t.committed = true
	if testHookCommit != nil {
		testHookCommit("after-rename")
	}
	if err := syncDir(t.root); err != nil {
		return &Error{Op: "commit", Path: t.root, Err: err}
	}
	if replaced {
		if err := os.RemoveAll(t.tmp); err != nil {
			t.log.Warn("checkpoint: removing the replaced checkpoint failed; it is cleaned on the next save", "path", t.tmp, "err", err)
		}
	}
	t.unlock()
	return nil
}

// abort removes the temporary directory of a failed save.
func (t *txn) abort() {
	if t.committed || t.lock == nil {
		return
	}
	if err := os.RemoveAll(t.tmp); err != nil {
		t.log.Warn("checkpoint: removing the temporary directory of a failed save failed; it is cleaned on the next save", "path", t.tmp, "err", err)
	}
	t.unlock()
}

// unlock removes the lock file (after the directory is gone) and drops
// the flock.
func (t *txn) unlock() {
	if t.lock == nil {
		return
	}
	os.Remove(t.lockPath)
	t.lock.Close()
	t.lock = nil
}

// cleanStale removes the temporary directories (and orphaned lock files)
// of writers that died: those whose lock file is missing or not held. A
// live writer's directory is never touched. Problems are logged, not
// returned: they never fail a save.
func cleanStale(root string, log *slog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	// unheld opens path and reports whether nobody holds its lock; the
	// caller closes f (which then holds it) when ok.
	unheld := func(path string) (*os.File, bool) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, false
		}
		if held, err := tryLock(f); err != nil || !held {
			f.Close()
			return nil, false
		}
		return f, true
	}
	remove := func(dir, why string) {
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("checkpoint: removing a stale temporary directory failed", "path", dir, "why", why, "err", err)
			return
		}
		log.Info("checkpoint: removed a stale temporary directory", "path", dir, "why", why)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, tmpPrefix) {
			continue
		}
		path := filepath.Join(root, name)
		switch {
		case e.IsDir():
			lockPath := path + lockSuffix
			if _, err := os.Lstat(lockPath); errors.Is(err, os.ErrNotExist) {
				// A retention victim, or a writer that died after
				// removing its lock (never happens) or whose cleaner died.
				remove(path, "no lock file")
				continue
			}
			if f, ok := unheld(lockPath); ok {
				remove(path, "its writer is gone (lock not held)")
				os.Remove(lockPath)
				f.Close()
			}
		case strings.HasSuffix(name, lockSuffix+initSuffix), strings.HasSuffix(name, lockSuffix):
			// A lock whose directory is gone (or not made yet): removed
			// once nobody holds it. One with a directory is handled with
			// the directory.
			if strings.HasSuffix(name, lockSuffix) {
				if _, err := os.Lstat(strings.TrimSuffix(path, lockSuffix)); err == nil {
					continue
				}
			}
			if f, ok := unheld(path); ok {
				os.Remove(path)
				f.Close()
			}
		}
	}
}

// syncDir fsyncs a directory so the entries created or renamed in it are
// durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Info is one committed checkpoint found by List.
type Info struct {
	Name      string // directory name
	Dir       string // full path
	Step      int64
	WorldSize int
	Created   time.Time
}

// List returns the committed checkpoints under root, oldest first: ordered
// by step, then creation time, then name. Hidden entries (temporary
// directories) and directories without a readable zinf checkpoint.json of
// this format version are skipped.
func List(root string) ([]Info, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, &Error{Op: "list", Path: root, Err: err}
	}
	var out []Info
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(root, e.Name())
		m, err := readIndex(dir)
		if err != nil {
			continue
		}
		out = append(out, Info{Name: e.Name(), Dir: dir, Step: m.Step, WorldSize: m.WorldSize, Created: m.Created})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Step != b.Step {
			return a.Step < b.Step
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Name < b.Name
	})
	return out, nil
}

// Latest returns the directory of the newest committed checkpoint under
// root (highest step; see List), or an error wrapping ErrNoCheckpoint when
// there is none. Only committed checkpoints are candidates: a save that was
// interrupted never has its final name, so it is never returned. Latest
// reads only checkpoint.json; Open or Verify check the rest.
func Latest(root string) (string, error) {
	list, err := List(root)
	if err != nil {
		return "", err
	}
	if len(list) == 0 {
		return "", &Error{Op: "latest", Path: root, Err: ErrNoCheckpoint}
	}
	return list[len(list)-1].Dir, nil
}

// retain deletes all but the newest keep committed checkpoints under root,
// never the one just written. Each victim is first renamed to a hidden
// ".tmp-del-" name, so it disappears from Latest at once and a crash
// mid-removal leaves only a directory the next save cleans.
func retain(root, justWritten string, keep int, log *slog.Logger) {
	if keep <= 0 {
		return
	}
	list, err := List(root)
	if err != nil {
		log.Warn("checkpoint: retention could not list checkpoints", "root", root, "err", err)
		return
	}
	var victims []Info
	for i, c := range list {
		if i < len(list)-keep && c.Name != justWritten {
			victims = append(victims, c)
		}
	}
	var trash []string
	for _, v := range victims {
		suffix, err := randomSuffix()
		if err != nil {
			return
		}
		to := filepath.Join(root, delPrefix+v.Name+"-"+suffix)
		if err := os.Rename(v.Dir, to); err != nil {
			log.Warn("checkpoint: retention could not remove a checkpoint", "path", v.Dir, "err", err)
			continue
		}
		trash = append(trash, to)
	}
	if len(trash) == 0 {
		return
	}
	if err := syncDir(root); err != nil {
		log.Warn("checkpoint: fsync of the checkpoint root failed", "root", root, "err", err)
	}
	for _, d := range trash {
		if err := os.RemoveAll(d); err != nil {
			log.Warn("checkpoint: retention could not remove a checkpoint; the next save retries", "path", d, "err", err)
		}
	}
}
