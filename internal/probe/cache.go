package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
)

const (
	// CacheName is the cache file's name in a swap path.
	CacheName = ".zinf-bandwidth.json"
	// maxCacheBytes bounds what is read of a cache file: one entry takes
	// about 150 bytes and a path sees few filesystems, so a larger file
	// is not ours.
	maxCacheBytes = 64 << 10
	// maxEntries bounds the entries a cache keeps (oldest dropped).
	maxEntries = 32
	// DefaultMaxAge is how long a measurement is reused: drives and their
	// firmware change rarely, but a cache older than a week is cheap to
	// renew.
	DefaultMaxAge = 7 * 24 * time.Hour
	// maxPlausibleBps rejects cached figures no storage reaches (100 GB/s).
	maxPlausibleBps = 1e11
	cacheVersion    = 1
)

// Options configure Bandwidth.
type Options struct {
	// Bytes is the probe size. Default DefaultBytes.
	Bytes int64
	// MaxAge is how long a cached measurement is reused. Default
	// DefaultMaxAge; negative never reuses one (but still caches the new
	// measurement).
	MaxAge time.Duration
	// Logger, default slog.Default(): warnings about a cache file that was
	// ignored or could not be written.
	Logger *slog.Logger
	// Now, for tests; default time.Now.
	Now func() time.Time
	// NoStore measures without writing the cache file: the caller stores
	// the result with Store once it knows the run goes ahead, so that a
	// run refused after the probe leaves nothing in the path.
	NoStore bool
}

// Result is a path's bandwidth.
type Result struct {
	ReadBps  float64 `json:"read_bps"`
	WriteBps float64 `json:"write_bps"`
	// ProbeBytes is how many bytes the measurement moved each way.
	ProbeBytes int64 `json:"probe_bytes"`
	// Measured is when the measurement was taken.
	Measured time.Time `json:"measured"`
	// Key names the filesystem: its device number and type.
	Key string `json:"-"`
	// Cached reports that the result came from the cache file.
	Cached bool `json:"-"`
}

type cacheFile struct {
	Version int               `json:"version"`
	Entries map[string]Result `json:"entries"`
}

// Bandwidth returns path's read and write bandwidth: the cached
// measurement for path's filesystem when CacheName in path holds one no
// older than MaxAge, else a fresh Measure, which it then stores there
// (atomically: written under a temporary name and renamed). A cache file
// that is larger than 64 KiB, not a regular file, not JSON of the expected
// shape, or that holds implausible figures is ignored with a warning, and
// is not replaced: zinf cannot tell that it wrote it. Failing to write the
// cache only warns.
func Bandwidth(ctx context.Context, path string, engine aio.Engine, opts Options) (Result, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultMaxAge
	}
	key, err := fsKey(path)
	if err != nil {
		return Result{}, fmt.Errorf("probe: %s: %w", path, err)
	}
	cachePath := filepath.Join(path, CacheName)
	cache, writable := readCache(cachePath, opts.Logger)
	now := opts.Now()
	if r, ok := fresh(cache, key, now, opts.MaxAge); ok {
		return r, nil
	}
	bytes := opts.Bytes
	if bytes == 0 {
		bytes = DefaultBytes
	}
	rd, wr, err := Measure(ctx, path, engine, bytes)
	if err != nil {
		return Result{}, err
	}
	res := Result{ReadBps: rd, WriteBps: wr, ProbeBytes: (bytes + requestBytes - 1) / requestBytes * requestBytes, Measured: now.UTC(), Key: key}
	if writable && !opts.NoStore {
		if err := store(cachePath, cache, res); err != nil {
			opts.Logger.Warn("probe: could not cache the measured bandwidth; the next run measures again", "path", cachePath, "err", err)
		}
	}
	return res, nil
}

// Store caches r, a measurement of path that Bandwidth took with NoStore,
// in CacheName there, as Bandwidth would have: the file is read again
// first, and one that Bandwidth would ignore (not ours) is left as it is.
// A failure only warns, as in Bandwidth.
func Store(path string, r Result, opts Options) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if r.Cached || r.Key == "" {
		return // nothing new to store
	}
	cachePath := filepath.Join(path, CacheName)
	cache, writable := readCache(cachePath, opts.Logger)
	if !writable {
		return
	}
	if err := store(cachePath, cache, r); err != nil {
		opts.Logger.Warn("probe: could not cache the measured bandwidth; the next run measures again", "path", cachePath, "err", err)
	}
}

// store adds r to cache under its key and writes the cache to cachePath.
func store(cachePath string, cache cacheFile, r Result) error {
	if cache.Entries == nil {
		cache.Entries = map[string]Result{}
	}
	cache.Version = cacheVersion
	cache.Entries[r.Key] = r
	trim(cache.Entries)
	return writeCache(cachePath, cache)
}

// Cached returns the measurement Bandwidth would reuse for path without
// measuring: the entry for path's filesystem in CacheName when it is no
// older than opts.MaxAge. It reports false when there is none, when the
// cache file cannot be used (with Bandwidth's warning) or when path cannot
// be examined.
func Cached(path string, opts Options) (Result, bool) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultMaxAge
	}
	key, err := fsKey(path)
	if err != nil {
		return Result{}, false
	}
	cache, _ := readCache(filepath.Join(path, CacheName), opts.Logger)
	return fresh(cache, key, opts.Now(), opts.MaxAge)
}

// fresh returns the cache's entry for key when it is no older than maxAge
// (and not from the future).
func fresh(cache cacheFile, key string, now time.Time, maxAge time.Duration) (Result, bool) {
	r, ok := cache.Entries[key]
	if !ok || maxAge <= 0 || r.Measured.After(now) || now.Sub(r.Measured) > maxAge {
		return Result{}, false
	}
	r.Key, r.Cached = key, true
	return r, true
}

// FilesystemKey names path's filesystem as the cache does (device number
// and filesystem type): measurements under one key hold for every path
// there.
func FilesystemKey(path string) (string, error) { return fsKey(path) }

// fsKey names path's filesystem: device number and filesystem type, so a
// cache follows a path that is remounted elsewhere no further than the
// device it measured.
func fsKey(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return "", err
	}
	return fmt.Sprintf("dev=%d:%d fs=0x%x", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), uint64(sfs.Type)), nil
}

// readCache reads the cache file. writable says whether Bandwidth may
// replace it: it is absent, or it was read whole as ours.
func readCache(path string, log *slog.Logger) (c cacheFile, writable bool) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return cacheFile{}, true
	}
	ignore := func(why string, args ...any) (cacheFile, bool) {
		log.Warn("probe: ignoring the bandwidth cache file and leaving it as it is (remove it to let zinf cache again): "+fmt.Sprintf(why, args...), "path", path)
		return cacheFile{}, false
	}
	if err != nil {
		return ignore("%v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ignore("%v", err)
	}
	if !st.Mode().IsRegular() {
		return ignore("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, maxCacheBytes+1))
	if err != nil {
		return ignore("%v", err)
	}
	if len(data) > maxCacheBytes {
		return ignore("larger than %d bytes", maxCacheBytes)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return ignore("malformed: %v", err)
	}
	if c.Version != cacheVersion {
		return ignore("version %d, want %d", c.Version, cacheVersion)
	}
	if len(c.Entries) > maxEntries {
		return ignore("%d entries, more than %d", len(c.Entries), maxEntries)
	}
	for k, r := range c.Entries {
		if !plausible(r.ReadBps) || !plausible(r.WriteBps) || r.Measured.IsZero() || r.ProbeBytes < 0 {
			return ignore("entry %q holds implausible figures (read %g, write %g bytes/s)", k, r.ReadBps, r.WriteBps)
		}
	}
	return c, true
}

func plausible(bps float64) bool {
	return bps > 0 && bps <= maxPlausibleBps && !math.IsNaN(bps) && !math.IsInf(bps, 0)
}

// trim keeps the newest maxEntries entries.
func trim(m map[string]Result) {
	for len(m) > maxEntries {
		var oldest string
		for k, r := range m {
			if oldest == "" || r.Measured.Before(m[oldest].Measured) {
				oldest = k
			}
		}
		delete(m, oldest)
	}
}

// writeCache writes c to path atomically (writeFileAtomic).
func writeCache(path string, c cacheFile) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(data, '\n'))
}

// writeFileAtomic replaces path with data: a new file under a unique
// temporary name beside it (O_EXCL, never through a symbolic link),
// synced, then renamed over path; the temporary file is removed on
// failure.
func writeFileAtomic(path string, data []byte) error {
	tmp := fmt.Sprintf("%s.%d.%d.tmp", path, os.Getpid(), time.Now().UnixNano())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
