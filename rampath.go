package zinf

import (
	"log/slog"
	"os"
	"path/filepath"
	"sync"
)

// ramWarned holds the NVMe paths already warned about as RAM-backed, so
// that a process opening a runtime per rank says it once per path.
var (
	ramWarnedMu sync.Mutex
	ramWarned   = map[string]bool{}
)

// warnRAMPaths warns, once per path and process, about each NVMe path on
// a RAM filesystem (tmpfs, ramfs: /dev/shm, /run, often /tmp): swap files
// there take the memory that offloading is meant to spare, and are lost at
// reboot. It is a warning, not a refusal: tests and trials use such paths,
// and zinf.direct "required" refuses them already (they have no O_DIRECT).
func warnRAMPaths(paths []string, log *slog.Logger) {
	for _, p := range paths {
		dir := existingDir(p)
		fs := ramFilesystem(dir)
		if fs == "" {
			continue
		}
		ramWarnedMu.Lock()
		seen := ramWarned[filepath.Clean(p)]
		ramWarned[filepath.Clean(p)] = true
		ramWarnedMu.Unlock()
		if !seen {
			log.Warn("zinf: the NVMe path is on "+fs+", which is RAM, not NVMe: swap files there take the memory offloading is meant to spare", "path", p)
		}
	}
}

// existingDir is p, or its nearest ancestor that exists (where a path
// still to be created will live).
func existingDir(p string) string {
	for d := filepath.Clean(p); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || d == filepath.Dir(d) {
			return d
		}
	}
}
