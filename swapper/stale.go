package swapper

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A store's run directory is named runDirPrefix + Name + "-" + pid + "-" +
// a random number (made by makeRunDir), and holds lockName, a file carrying
// lockMagic that the store keeps flock'ed for its whole life. The kernel
// drops a dead process's flock, SIGKILL included, so a run directory whose
// lock file nobody holds belongs to a run that is gone: its swap files hold
// scratch data no later run can read (the tensor map lived in the dead
// process's memory), and only waste space.
const (
	runDirPrefix = "zinf-"
	lockName     = "zinf-swap.lock"
	lockMagic    = "zinf swap store lock v1\n"
	// maxLockBytes bounds what is read from a lock file: ours hold one
	// short line after the magic.
	maxLockBytes = 4096
)

// runDirPattern matches the names OpenStore gives run directories;
// initDirPattern the names they have while being made (makeRunDir), before
// their lock file is in place.
var (
	runDirPattern  = regexp.MustCompile(`^zinf-(.+)-([0-9]{1,10})-([0-9]{1,20})$`)
	initDirPattern = regexp.MustCompile(`^\.zinf-init-(.+)-([0-9]{1,10})-([0-9]{1,20})$`)
)

// initDirPrefix begins the name a run directory has while it is made.
const initDirPrefix = ".zinf-init-"

// IncompleteGrace is how old a run directory without a lock file must be
// (its modification time) before FindStale lists it and a sweep removes
// it: one holding nothing, or only a lock file being written that nobody
// holds, is what a process killed while making it leaves (makeRunDir takes
// microseconds), and a younger one may be another process's being made.
const IncompleteGrace = 10 * time.Minute

// makeRunDir creates and locks a run directory named for name in parent:
// it is made under a temporary name (".zinf-init-" + name + "-" + pid +
// "-" + a random number), its lock file is created in it, and only then is
// it renamed to its final name ("zinf-" + the rest), so a run directory
// under its final name always holds its lock file. A process killed in
// between leaves a temporary directory, empty or holding a lock nobody
// holds, which the sweeps remove (scanStale).
func makeRunDir(parent, name string) (string, *os.File, error) {
	tmp, err := os.MkdirTemp(parent, fmt.Sprintf("%s%s-%d-", initDirPrefix, name, os.Getpid()))
	if err != nil {
		return "", nil, err
	}
	lock, err := createLock(tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("creating the run lock in %s: %w", tmp, err)
	}
	dir := filepath.Join(parent, runDirPrefix+strings.TrimPrefix(filepath.Base(tmp), initDirPrefix))
	if err := renameNoReplace(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		lock.Close()
		return "", nil, err
	}
	return dir, lock, nil
}

// StaleRun is the swap space of a store whose process is gone, found by
// FindStale.
type StaleRun struct {
	// Dir is the run directory.
	Dir string `json:"dir"`
	// Name is the store's name (StoreOptions.Name) from the directory name.
	Name string `json:"name"`
	// PID is the process that created it, as its lock file records (0 when
	// the record is unreadable).
	PID int `json:"pid,omitempty"`
	// Host is the host its lock file records. A run from another host is
	// reported but never removed: flock does not reach across hosts on
	// every network filesystem, so its owner may still be alive.
	Host string `json:"host,omitempty"`
	// Started is when the store was opened, as its lock file records.
	Started time.Time `json:"started,omitzero"`
	// Bytes is the disk space its files take (allocated blocks, so sparse
	// and preallocated files count what they really use).
	Bytes int64 `json:"bytes"`
	// Incomplete is set for a directory whose making was interrupted (a
	// process killed between creating the directory and its lock file): it
	// holds no lock file, only possibly one being written that nobody
	// holds, and is older than IncompleteGrace. PID then comes from its
	// name, and Host and Started are unknown.
	Incomplete bool `json:"incomplete,omitempty"`
}

// FindStale lists the run directories in swap path path that a store of
// any name left and whose process is gone: a directory is listed only when
// its name has exactly the shape OpenStore gives run directories and it
// holds a lock file written by a store that no live process holds. Nothing
// else in path is looked into, and nothing is changed. A missing path has
// no stale runs.
func FindStale(path string) ([]StaleRun, error) {
	var out []StaleRun
	err := scanStale(path, func(r StaleRun, lock *os.File) {
		out = append(out, r)
	})
	return out, err
}

// scanStale calls found for every stale run in path while holding the
// run's lock (so no other cleaner acts on it meanwhile); found must not
// keep lock.
func scanStale(path string, found func(r StaleRun, lock *os.File)) error {
	entries, err := os.ReadDir(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("swapper: listing swap path %s: %w", path, err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	for _, e := range entries {
		m := runDirPattern.FindStringSubmatch(e.Name())
		if m == nil {
			m = initDirPattern.FindStringSubmatch(e.Name())
		}
		if m == nil || !e.IsDir() { // IsDir from the dirent: a symlink is not followed
			continue
		}
		dir := filepath.Join(path, e.Name())
		lock, rec, ok := claimStaleLock(filepath.Join(dir, lockName))
		if !ok {
			// No lock file (or one not ours, or held): a directory whose
			// making was interrupted, if it holds nothing else.
			lock, ok = claimIncomplete(dir)
			if !ok {
				continue
			}
			pid, _ := strconv.Atoi(m[2])
			found(StaleRun{Dir: dir, Name: m[1], PID: pid, Bytes: diskUsage(dir), Incomplete: true}, lock)
			if lock != nil {
				lock.Close()
			}
			continue
		}
		r := StaleRun{Dir: dir, Name: m[1], PID: rec.pid, Host: rec.host, Started: rec.started, Bytes: diskUsage(dir)}
		found(r, lock)
		lock.Close()
	}
	return nil
}

// claimIncomplete reports whether run directory dir is what a process
// killed while making it leaves: no lock file, nothing in it but possibly
// the lock file being written (lockName + ".init", a regular file nobody
// holds; the caller then holds it until it closes the returned file, nil
// when there is none), and a modification time older than IncompleteGrace
// (a younger one may be a live process's being made).
func claimIncomplete(dir string) (*os.File, bool) {
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() || time.Since(st.ModTime()) < IncompleteGrace {
		return nil, false
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) > 1 {
		return nil, false
	}
	if len(entries) == 0 {
		return nil, true
	}
	if entries[0].Name() != lockName+".init" || !entries[0].Type().IsRegular() {
		return nil, false
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName+".init"), os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, false
	}
	if ok, err := tryLock(f); err != nil || !ok {
		f.Close() // held: its maker is alive
		return nil, false
	}
	return f, true
}

// removeIncomplete removes a directory claimIncomplete accepted: its lock
// file being written, if any, then the directory, which must then be empty
// (os.Remove, not RemoveAll: nothing that appeared since is touched).
func removeIncomplete(dir string) error {
	if err := os.Remove(filepath.Join(dir, lockName+".init")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err // not empty (something appeared since): kept
	}
	return nil // removed, here or by another cleaner meanwhile
}

type lockRecord struct {
	pid     int
	host    string
	started time.Time
}

// claimStaleLock opens a run directory's lock file and takes its flock. It
// succeeds only when the file is a regular file (no symlink followed) that
// a store wrote (lockMagic) and that nobody holds; the caller then holds
// the lock until it closes the file.
func claimStaleLock(path string) (*os.File, lockRecord, bool) {
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, lockRecord{}, false
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, lockRecord{}, false
	}
	if ok, err := tryLock(f); err != nil || !ok {
		f.Close() // held: a live store's
		return nil, lockRecord{}, false
	}
	rec, ok := parseLock(io.LimitReader(f, maxLockBytes))
	if !ok {
		f.Close()
		return nil, lockRecord{}, false
	}
	return f, rec, true
}

// parseLock reads a lock file's record: the magic, then
// "pid=N host=H started=T". Fields it cannot read are left zero; only a
// missing magic makes the file not ours.
func parseLock(r io.Reader) (lockRecord, bool) {
	data, err := io.ReadAll(r)
	if err != nil || !bytes.HasPrefix(data, []byte(lockMagic)) {
		return lockRecord{}, false
	}
	var rec lockRecord
	sc := bufio.NewScanner(bytes.NewReader(data[len(lockMagic):]))
	if sc.Scan() {
		for _, field := range strings.Fields(sc.Text()) {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "pid":
				if n, err := strconv.Atoi(v); err == nil && n > 0 {
					rec.pid = n
				}
			case "host":
				rec.host = v
			case "started":
				if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
					rec.started = t
				}
			}
		}
	}
	return rec, true
}

// diskUsage sums the allocated bytes of the regular files under dir,
// without following symlinks.
func diskUsage(dir string) int64 {
	var total int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			total += allocatedBytes(info)
		}
		return nil
	})
	return total
}

// createLock creates dir's lock file already flock'ed and holding the
// record: it is written under a temporary name and renamed into place, so a
// cleaner never finds lockName unlocked while its store lives.
func createLock(dir string) (*os.File, error) {
	tmp := filepath.Join(dir, lockName+".init")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	ok, err := tryLock(f)
	if err == nil && !ok {
		err = errors.New("a fresh lock file is locked by someone else")
	}
	if err == nil {
		host, _ := os.Hostname()
		_, err = fmt.Fprintf(f, "%spid=%d host=%s started=%s\n", lockMagic, os.Getpid(), hostField(host), time.Now().UTC().Format(time.RFC3339Nano))
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, lockName))
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	return f, nil
}

// hostField keeps a host name to one field of the record.
func hostField(h string) string {
	if h == "" || strings.ContainsAny(h, " \t\n=") {
		return "unknown"
	}
	return h
}

// sweepStale reports every stale run in path, one log line each, and
// removes those written on this host unless keep is set.
func sweepStale(path string, keep bool, log *slog.Logger) {
	host, _ := os.Hostname()
	host = hostField(host)
	err := scanStale(path, func(r StaleRun, _ *os.File) {
		attrs := []any{"path", r.Dir, "name", r.Name, "bytes", r.Bytes, "pid", r.PID}
		switch {
		case keep:
			log.Warn("swapper: found the swap space of a run that is gone; kept (StoreOptions.KeepStale)", attrs...)
		case r.Host != "" && r.Host != host:
			log.Warn("swapper: found the swap space of a run from another host; kept, since its owner may be alive there (remove it by hand if not)", append(attrs, "host", r.Host)...)
		default:
			// The lock is held across the removal, so no other cleaner
			// acts on the directory meanwhile.
			remove := os.RemoveAll
			if r.Incomplete {
				remove = removeIncomplete
				attrs = append(attrs, "incomplete", true)
			}
			if err := remove(r.Dir); err != nil {
				log.Warn("swapper: removing the swap space of a run that is gone failed", append(attrs, "err", err)...)
				return
			}
			// A warning, not a note: it tells the user that a run died
			// (killed, crashed) and how much space it had held.
			log.Warn("swapper: removed the swap space of a run that is gone", attrs...)
		}
	})
	if err != nil {
		log.Warn("swapper: looking for stale swap space failed", "path", path, "err", err)
	}
}
