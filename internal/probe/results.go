package probe

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A results file records measured bandwidths per swap path, the figures
// `zinf tune --bandwidth-file` writes and the config key
// zinf.bandwidth.file points to:
//
//	{
//	  "format": "zinf-bandwidth",
//	  "version": 1,
//	  "paths": {
//	    "/nvme0": {"read_bytes_per_sec": 3.2e9, "write_bytes_per_sec": 2.1e9,
//	               "measured": "2025-03-01T12:00:00Z", "method": "zinf tune: ..."}
//	  }
//	}
//
// Paths are absolute and clean; a swap path uses the entry of the nearest
// directory at or above it (see LookupResult).
const (
	resultsFormat  = "zinf-bandwidth"
	resultsVersion = 1
	// MaxResultsBytes bounds what is read of a results file: an entry
	// takes about 200 bytes, so a larger file is not a results file.
	MaxResultsBytes = 1 << 20
	// maxResultsPaths bounds the entries of a results file.
	maxResultsPaths = 4096
)

// PathResult is one path's entry in a results file.
type PathResult struct {
	ReadBps  float64   `json:"read_bytes_per_sec"`
	WriteBps float64   `json:"write_bytes_per_sec"`
	Measured time.Time `json:"measured"`
	// Method says how the figures were measured, for people.
	Method string `json:"method,omitempty"`
}

type resultsFile struct {
	Format  string                `json:"format"`
	Version int                   `json:"version"`
	Paths   map[string]PathResult `json:"paths"`
}

// ReadResults reads a results file: at most MaxResultsBytes of a regular
// file, of the format above, every figure plausible (above 0, at most
// 100 GB/s) and every path absolute. Any other content is an error that
// says what is wrong.
func ReadResults(file string) (map[string]PathResult, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", file)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxResultsBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxResultsBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a bandwidth results file", file, MaxResultsBytes)
	}
	return parseResults(file, data)
}

func parseResults(file string, data []byte) (map[string]PathResult, error) {
	var r resultsFile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%s is not a bandwidth results file: %v", file, err)
	}
	if r.Format != resultsFormat || r.Version != resultsVersion {
		return nil, fmt.Errorf("%s is not a bandwidth results file: format %q version %d, want %q version %d (written by zinf tune --bandwidth-file)",
			file, r.Format, r.Version, resultsFormat, resultsVersion)
	}
	if len(r.Paths) > maxResultsPaths {
		return nil, fmt.Errorf("%s lists %d paths, more than %d", file, len(r.Paths), maxResultsPaths)
	}
	var problems []string
	for p, e := range r.Paths {
		switch {
		case !filepath.IsAbs(p) || filepath.Clean(p) != p:
			problems = append(problems, fmt.Sprintf("path %q is not absolute and clean", p))
		case !plausible(e.ReadBps) || !plausible(e.WriteBps):
			problems = append(problems, fmt.Sprintf("path %q: read %g, write %g bytes/s (allowed: above 0, at most %g)", p, e.ReadBps, e.WriteBps, maxPlausibleBps))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("%s: %s", file, strings.Join(problems, "; "))
	}
	if r.Paths == nil {
		r.Paths = map[string]PathResult{}
	}
	return r.Paths, nil
}

// LookupResult returns the entry of results for path: the entry of path
// itself or of the nearest directory above it (a figure measured on /nvme
// holds for /nvme/run1). key is the entry's path.
func LookupResult(results map[string]PathResult, path string) (key string, r PathResult, ok bool) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", PathResult{}, false
	}
	for p := abs; ; p = filepath.Dir(p) {
		if r, ok := results[p]; ok {
			return p, r, true
		}
		if p == filepath.Dir(p) {
			return "", PathResult{}, false
		}
	}
}

// WriteResult records r for path in the results file, keeping the other
// paths' entries. The file is created when absent; an existing file must
// be a results file (it is not overwritten otherwise, nor when it is a
// symbolic link), and is replaced atomically: the new content goes to a
// fresh file under a unique name (O_EXCL) that is synced and renamed over
// it.
func WriteResult(file, path string, r PathResult) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if !plausible(r.ReadBps) || !plausible(r.WriteBps) {
		return fmt.Errorf("probe: implausible bandwidth for %s: read %g, write %g bytes/s", abs, r.ReadBps, r.WriteBps)
	}
	results := map[string]PathResult{}
	switch fi, err := os.Lstat(file); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link: not replacing it (give the file's own path)", file)
	default:
		if results, err = ReadResults(file); err != nil {
			return fmt.Errorf("not replacing %s: %w", file, err)
		}
	}
	if _, ok := results[abs]; !ok && len(results) >= maxResultsPaths {
		return fmt.Errorf("%s already lists %d paths", file, len(results))
	}
	r.Measured = r.Measured.UTC()
	results[abs] = r
	data, err := json.MarshalIndent(resultsFile{Format: resultsFormat, Version: resultsVersion, Paths: results}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(file, append(data, '\n'))
}
