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

	"github.com/zinfio/zinf/internal/base/testhook"
)

// Names in the checkpoint root. A writer's temporary directory is
// <root>/.tmp-zinf-ckpt-<name>-<12 hex digits>, next to its lock file
// <dir>.lock (created as <dir>.lock.init); retention and a replacing commit
// move victims to <root>/.tmp-zinf-ckpt-del-<name>-<12 hex digits>, with a
// lock file of their own, before removing them. Everything starting with
// ".tmp-" is invisible to Latest and List, but only names of exactly this
// shape whose lock file this package wrote are ever removed by a sweep: the
// root may be shared with files that are not ours, and a directory a user
// happened to name ".tmp-something" is theirs.
const (
	tmpPrefix   = ".tmp-zinf-ckpt-"
	delTag      = "del-"
	lockSuffix  = ".lock"
	initSuffix  = ".init" // a lock file being created: <dir>.lock.init
	randomChars = 12      // hex digits of the random suffix
	// lockMagic opens every lock file this package writes, so a sweep can
	// tell its own lock files from a stranger's file of a similar name.
	lockMagic = "zinf-checkpoint-lock v1\n"
)

// tempName is the base name of a new temporary entry for the checkpoint
// name (a writer's directory, or with delTag prepended, a victim's).
func tempName(name string) (string, error) {
	suffix, err := randomSuffix()
	if err != nil {
		return "", err
	}
	return tmpPrefix + name + "-" + suffix, nil
}

// ownTempDirName reports whether base has exactly the shape of a temporary
// directory name this package makes: the prefix, a non-empty name that
// does not start with a dot, a dash and 12 lowercase hex digits.
func ownTempDirName(base string) bool {
	rest, ok := strings.CutPrefix(base, tmpPrefix)
	if !ok || len(rest) < randomChars+2 || rest[0] == '.' || strings.ContainsAny(rest, "/\\") {
		return false
	}
	if rest[len(rest)-randomChars-1] != '-' {
		return false
	}
	for _, c := range rest[len(rest)-randomChars:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ownLockName reports whether base is the name of a lock file this package
// makes (<dir>.lock or <dir>.lock.init for an own temporary directory
// name), and returns that directory name.
func ownLockName(base string) (dir string, init bool, ok bool) {
	if d, found := strings.CutSuffix(base, lockSuffix+initSuffix); found && ownTempDirName(d) {
		return d, true, true
	}
	if d, found := strings.CutSuffix(base, lockSuffix); found && ownTempDirName(d) {
		return d, false, true
	}
	return "", false, false
}

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
	base, err := tempName(name)
	if err != nil {
		return nil, err
	}
	t := &txn{root: root, name: name, final: final, overwrite: overwrite, log: log,
		tmp: filepath.Join(root, base)}
	lf, err := createLock(t.tmp + lockSuffix)
	if err != nil {
		return nil, &Error{Op: "save", Path: root, Err: fmt.Errorf("creating the writer lock: %w", err)}
	}
	t.lock, t.lockPath = lf, t.tmp+lockSuffix
	testhook.Hit("checkpoint/locked")
	if err := os.Mkdir(t.tmp, 0o755); err != nil {
		t.unlock(true)
		return nil, &Error{Op: "save", Path: t.tmp, Err: err}
	}
	return t, nil
}

// createLock creates the lock file path already flock'ed and holding
// lockMagic. On Linux the file is made unnamed, locked and written, then
// linked to path (createNamed), so a crash leaves nothing half made.
// Elsewhere it is created and locked under the name path+".init" and then
// renamed to path, so no other writer ever sees path unlocked while its
// owner lives. (Created directly, a cleaner could lock and remove it
// between our create and our flock.) A sweep removes a ".init" file only
// once it holds the lock and has read lockMagic in it, i.e. never between
// our create and our write; an empty one a crash left there stays (nothing
// in it says it is ours).
func createLock(path string) (*os.File, error) {
	// Where the system can, the lock file appears whole: named only once
	// it is locked and holds lockMagic, so a crash leaves nothing half made.
	if lf, ok, err := createNamed(path, writeLockMagic); ok || err != nil {
		return lf, err
	}
	init := path + initSuffix
	lf, err := os.OpenFile(init, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	// A sweep may hold the lock for a moment (it locks, finds the file
	// empty, lets go): retry briefly before calling it a conflict.
	var ok bool
	for try := 0; err == nil && !ok && try < 100; try++ {
		if try > 0 {
			time.Sleep(time.Millisecond)
		}
		ok, err = tryLock(lf)
	}
	if err == nil && !ok {
		err = errors.New("a fresh lock file is locked by someone else")
	}
	if err == nil {
		err = writeLockMagic(lf)
	}
	if err == nil {
		// Fails (ENOENT) only if something removed the .init file; the
		// save then fails rather than run unprotected.
		err = os.Rename(init, path)
	}
	if err != nil {
		lf.Close()
		os.Remove(init)
		return nil, err
	}
	return lf, nil
}

// writeLockMagic writes a lock file's content: lockMagic, then who holds
// it (for an operator reading it).
func writeLockMagic(f *os.File) error {
	host, _ := os.Hostname()
	_, err := fmt.Fprintf(f, "%spid=%d host=%s started=%s\n", lockMagic, os.Getpid(), host, time.Now().UTC().Format(time.RFC3339Nano))
	return err
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
	testhook.Hit("checkpoint/before-rename")
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
			// No RENAME_EXCHANGE: move the old one aside, to a victim's
			// name with a lock of its own (a crash here leaves it to a
			// later sweep, with the new checkpoint complete in our own
			// temporary directory; the name is briefly absent).
			aside, al, lerr := lockedTemp(t.root, delTag+t.name)
			if lerr != nil {
				return &Error{Op: "commit", Path: t.final, Err: lerr}
			}
			if err = os.Rename(t.final, aside); err == nil {
				err = os.Rename(t.tmp, t.final)
				if err != nil {
					// Put the old one back. Should that fail too, it stays
					// under its hidden name without a lock file, which no
					// sweep removes: it may be the only copy.
					if perr := os.Rename(aside, t.final); perr != nil {
						t.log.Warn("checkpoint: could not put the replaced checkpoint back; it is kept under a hidden name", "path", aside, "want", t.final, "err", perr)
					}
					al.release(true)
				} else {
					removeLocked(aside, al, t.log)
				}
			} else {
				al.release(true)
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
	testhook.Hit("checkpoint/after-rename")
	if err := syncDir(t.root); err != nil {
		return &Error{Op: "commit", Path: t.root, Err: err}
	}
	if replaced {
		// t.tmp now holds the old checkpoint, still under our lock.
		if err := os.RemoveAll(t.tmp); err != nil {
			t.log.Warn("checkpoint: removing the replaced checkpoint failed; it is cleaned on the next save", "path", t.tmp, "err", err)
			t.unlock(false)
			return nil
		}
	}
	t.unlock(true)
	return nil
}

// abort removes the temporary directory of a failed save.
func (t *txn) abort() {
	if t.committed || t.lock == nil {
		return
	}
	if err := os.RemoveAll(t.tmp); err != nil {
		t.log.Warn("checkpoint: removing the temporary directory of a failed save failed; it is cleaned on the next save", "path", t.tmp, "err", err)
		t.unlock(false)
		return
	}
	t.unlock(true)
}

// unlock drops the flock, and removes the lock file when removeFile (the
// directory is gone). A directory that is still there keeps its lock file,
// unheld: that is what lets a later sweep prove it stale and remove it.
func (t *txn) unlock(removeFile bool) {
	if t.lock == nil {
		return
	}
	l := heldLock{f: t.lock, path: t.lockPath}
	l.release(removeFile)
	t.lock = nil
}

// heldLock is a lock file this package created and holds.
type heldLock struct {
	f    *os.File
	path string
}

// release drops the flock; removeFile removes the lock file first (only
// once what it guards is gone).
func (l *heldLock) release(removeFile bool) {
	if removeFile {
		os.Remove(l.path)
	}
	l.f.Close()
}

// lockedTemp picks a new temporary name under root for name and creates
// its lock file, held; the caller then creates (or renames something to)
// the returned path.
func lockedTemp(root, name string) (string, *heldLock, error) {
	base, err := tempName(name)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(root, base)
	lf, err := createLock(path + lockSuffix)
	if err != nil {
		return "", nil, fmt.Errorf("creating the lock of %s: %w", path, err)
	}
	return path, &heldLock{f: lf, path: path + lockSuffix}, nil
}

// removeLocked removes the directory dir guarded by l, then its lock; if
// the removal fails the lock file stays (unheld) so a later sweep retries.
func removeLocked(dir string, l *heldLock, log *slog.Logger) {
	if err := os.RemoveAll(dir); err != nil {
		log.Warn("checkpoint: removing a checkpoint failed; the next save retries", "path", dir, "err", err)
		l.release(false)
		return
	}
	l.release(true)
}

// lockState is what a sweep found about a lock file.
type lockState int

const (
	lockMissing lockState = iota // no such file
	lockHeld                     // a live process holds it
	lockForeign                  // not a regular file holding lockMagic
	lockStale                    // ours and not held: we hold it now
)

// claimLock tries to take over the lock file path. It returns lockStale,
// with the file open and locked (the caller closes it), only when path is
// a regular file that nobody holds, that starts with lockMagic, and that
// is still the file at path once locked (not replaced meanwhile).
func claimLock(path string) (*os.File, lockState) {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, lockMissing
	}
	if err != nil || !st.Mode().IsRegular() {
		return nil, lockForeign
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, lockForeign
	}
	ok, err := tryLock(f)
	if err != nil || !ok {
		f.Close()
		if err != nil {
			return nil, lockForeign
		}
		return nil, lockHeld
	}
	magic := make([]byte, len(lockMagic))
	n, _ := f.ReadAt(magic, 0)
	fst, ferr := f.Stat()
	pst, perr := os.Lstat(path)
	if n != len(magic) || string(magic) != lockMagic || ferr != nil || perr != nil || !os.SameFile(fst, pst) {
		f.Close()
		return nil, lockForeign
	}
	return f, lockStale
}

// Sweep removes from root what savers of this package left when they
// died (killed mid-save, mid-commit or mid-retention): exactly the entries
// described under "Crash safety" in the package documentation, and only
// once their lock is provably held by nobody. Every save does it first; a
// program that resumes and may not save again (its last checkpoint was
// already taken) calls it to leave the root clean. Problems are logged,
// not returned. A missing root has nothing to sweep.
func Sweep(root string, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	cleanStale(root, log)
}

// Prune deletes all but the newest keep committed checkpoints under root
// for which match returns true (every committed checkpoint when match is
// nil), crash-safely, as SaveOptions.KeepLast does after a save: each
// victim disappears from Latest and List at once and is removed under a
// lock of its own. keep < 1 deletes nothing. Problems are logged.
func Prune(root string, keep int, match func(Info) bool, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	retain(root, "", keep, match, log)
}

// cleanStale removes what writers that died left in root, and nothing
// else: an entry is removed only if its name has exactly the shape this
// package gives its temporary directories and lock files (see tempName)
// and its lock file, written by this package (lockMagic), is held by no
// live process (the kernel drops a dead process's flock, SIGKILL
// included). A live writer's directory is never touched; an entry of that
// shape without a usable lock file of ours is left and mentioned; any
// other entry (a user's ".tmp-notes", say) is not looked at. Problems are
// logged, not returned: they never fail a save.
func cleanStale(root string, log *slog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, tmpPrefix) {
			continue // not a name this package makes
		}
		path := filepath.Join(root, name)
		if ownTempDirName(name) {
			if !e.IsDir() {
				log.Info("checkpoint: left an entry with a temporary directory's name that is not a directory", "path", path)
				continue
			}
			f, state := claimLock(path + lockSuffix)
			switch state {
			case lockHeld:
				// A live writer's (or a retention in progress).
			case lockMissing, lockForeign:
				log.Info("checkpoint: left a temporary directory without a lock file of ours; remove it by hand if no writer uses it", "path", path)
			case lockStale:
				if err := os.RemoveAll(path); err != nil {
					log.Warn("checkpoint: removing a stale temporary directory failed", "path", path, "err", err)
					f.Close()
					continue
				}
				log.Info("checkpoint: removed the temporary directory of a writer that is gone", "path", path)
				os.Remove(path + lockSuffix)
				f.Close()
			}
			continue
		}
		dir, _, ok := ownLockName(name)
		if !ok {
			log.Debug("checkpoint: left an entry whose name is not one this package makes", "path", path)
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, dir)); err == nil {
			continue // handled with its directory
		}
		// A lock whose directory is gone (or was never made): removed
		// once it is provably ours and unheld.
		if f, state := claimLock(path); state == lockStale {
			os.Remove(path)
			f.Close()
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

// retain deletes all but the newest keep committed checkpoints under root
// for which match returns true (all when match is nil), never the one just
// written. Each victim is first renamed to a hidden
// victim's name (".tmp-zinf-ckpt-del-...") whose lock file is created and
// held first, so it disappears from Latest at once and a crash mid-removal
// leaves a directory with an unheld lock, which the next save's sweep
// removes.
func retain(root, justWritten string, keep int, match func(Info) bool, log *slog.Logger) {
	if keep <= 0 {
		return
	}
	all, err := List(root)
	if err != nil {
		log.Warn("checkpoint: retention could not list checkpoints", "root", root, "err", err)
		return
	}
	list := all[:0]
	for _, c := range all {
		if match == nil || match(c) {
			list = append(list, c)
		}
	}
	var victims []Info
	for i, c := range list {
		if i < len(list)-keep && c.Name != justWritten {
			victims = append(victims, c)
		}
	}
	type victim struct {
		dir  string
		lock *heldLock
	}
	var trash []victim
	for _, v := range victims {
		to, lock, err := lockedTemp(root, delTag+v.Name)
		if err != nil {
			log.Warn("checkpoint: retention could not remove a checkpoint", "path", v.Dir, "err", err)
			continue
		}
		if err := os.Rename(v.Dir, to); err != nil {
			lock.release(true)
			log.Warn("checkpoint: retention could not remove a checkpoint", "path", v.Dir, "err", err)
			continue
		}
		trash = append(trash, victim{to, lock})
	}
	if len(trash) == 0 {
		return
	}
	if err := syncDir(root); err != nil {
		log.Warn("checkpoint: fsync of the checkpoint root failed", "root", root, "err", err)
	}
	testhook.Hit("checkpoint/retain-renamed")
	for _, v := range trash {
		removeLocked(v.dir, v.lock, log)
	}
}
