package zinf

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/internal/probe"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
)

// BandwidthProbeTimeout bounds a probe of one path at Open: a drive slower
// than zinf.bandwidth.probe_bytes per few seconds is planned with the
// defaults (and a warning) rather than holding Open up.
const BandwidthProbeTimeout = 5 * time.Second

// The NVMe bandwidth a plan uses (package plan has the types).
type (
	// Bandwidth is the NVMe bandwidth a plan uses, per path (plan.Bandwidth).
	Bandwidth = plan.Bandwidth
	// PathBandwidth is one NVMe path's bandwidth and its source.
	PathBandwidth = plan.PathBandwidth
	// BandwidthSource says where a path's bandwidth figure came from.
	BandwidthSource = plan.BandwidthSource
)

// The sources of a path's bandwidth, in the order they are tried, and the
// defaults (see plan.BandwidthSource).
const (
	BandwidthFromConfig = plan.BandwidthFromConfig
	BandwidthFromFile   = plan.BandwidthFromFile
	BandwidthFromCache  = plan.BandwidthFromCache
	BandwidthFromProbe  = plan.BandwidthFromProbe
	BandwidthDefault    = plan.BandwidthDefault
	DefaultNVMeReadBps  = plan.DefaultNVMeReadBps
	DefaultNVMeWriteBps = plan.DefaultNVMeWriteBps
)

// BandwidthOptions adjust NVMeBandwidth.
type BandwidthOptions struct {
	// NoProbe never probes, whatever zinf.bandwidth.probe says (tests,
	// and tools that must not write to the paths).
	NoProbe bool
	// Engine moves the probe's bytes. Default: one built from the config
	// for the probe and closed after it.
	Engine aio.Engine
	// Logger receives warnings (a probe that failed, a cache file that
	// cannot be used). Default slog.Default().
	Logger *slog.Logger
}

// NVMeBandwidth returns each NVMe path's bandwidth for cfg, from the first
// source that has it (see config.Bandwidth): the config's figures, the
// zinf.bandwidth.file result, the probe cache in the path, a probe of at
// most zinf.bandwidth.probe_bytes and BandwidthProbeTimeout (unless
// disabled; not on a path with less than twice that free, whose space the
// swap files need), the defaults. A probe that fails (a path that does
// not exist yet, a read-only one) is not an error: the path gets the
// defaults, and a warning when the path exists. An unreadable or malformed
// zinf.bandwidth.file is an error naming the key, as is a cancelled ctx.
func NVMeBandwidth(ctx context.Context, cfg *config.Config, opts BandwidthOptions) (Bandwidth, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	bw, _, err := measureBandwidth(ctx, plan.BandwidthSettingsOf(cfg, log), opts.Engine, opts.NoProbe, false, log)
	return bw, err
}

// pendingProbe is a measurement not yet written to its path's cache.
type pendingProbe struct {
	path string
	r    probe.Result
}

// storeProbes writes the measurements measureBandwidth deferred to their
// paths' cache files (see probe.Store).
func storeProbes(pending []pendingProbe, log *slog.Logger) {
	for _, p := range pending {
		probe.Store(p.path, p.r, probe.Options{Logger: log})
	}
}

// measureBandwidth is NVMeBandwidth from the config's bandwidth settings s;
// engine, when not nil, moves the probe's bytes. With deferCache it
// measures without writing the probe cache and returns the measurements
// to cache: Open and PlanModel write them (storeProbes) only once the
// config is accepted, so that a refused config leaves nothing in the NVMe
// path.
func measureBandwidth(ctx context.Context, s plan.BandwidthSettings, engine aio.Engine, noProbe, deferCache bool, log *slog.Logger) (Bandwidth, []pendingProbe, error) {
	s.Engine.Logger = log // a probe's engine logs where the caller does
	bw := s.Config
	var out Bandwidth
	var pending []pendingProbe
	var results map[string]probe.PathResult
	file := s.File
	if file != "" && bw.ReadBytesPerSec == 0 {
		var err error
		if results, err = probe.ReadResults(file); err != nil {
			return Bandwidth{}, nil, fmt.Errorf("zinf: zinf.bandwidth.file %q: %w (write it with `zinf tune --path DIR --bandwidth-file FILE`)", bw.File, err)
		}
	}
	given := engine
	defer func() {
		if engine != nil && given == nil {
			engine.Close()
		}
	}()
	popts := probe.Options{Bytes: int64(bw.ProbeBytes), Logger: log, NoStore: deferCache}
	for _, path := range s.Paths {
		pb := PathBandwidth{Path: path}
		if bw.ReadBytesPerSec > 0 {
			pb.ReadBps, pb.WriteBps, pb.Source = float64(bw.ReadBytesPerSec), float64(bw.WriteBytesPerSec), BandwidthFromConfig
			pb.Detail = "zinf.bandwidth.read_bytes_per_sec, write_bytes_per_sec"
			out.Paths = append(out.Paths, pb)
			continue
		}
		if key, r, ok := probe.LookupResult(results, path); ok {
			pb.ReadBps, pb.WriteBps, pb.Source = r.ReadBps, r.WriteBps, BandwidthFromFile
			pb.Detail = fmt.Sprintf("%s, entry %s, measured %s", file, key, r.Measured.Format(time.DateOnly))
			out.Paths = append(out.Paths, pb)
			continue
		}
		pb.ReadBps, pb.WriteBps, pb.Source = DefaultNVMeReadBps, DefaultNVMeWriteBps, BandwidthDefault
		if st, err := os.Stat(path); err != nil || !st.IsDir() {
			pb.Detail = "the path is not a directory yet"
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				pb.Detail = err.Error()
			}
			out.Paths = append(out.Paths, pb)
			continue
		}
		fsKey, _ := probe.FilesystemKey(path)
		if r, ok := memoized(fsKey); ok {
			pb.ReadBps, pb.WriteBps, pb.Source = r.ReadBps, r.WriteBps, BandwidthFromCache
			pb.Detail = "measured earlier by this process on the same filesystem, " + r.Measured.Local().Format("2006-01-02 15:04")
			out.Paths = append(out.Paths, pb)
			continue
		}
		probing := bw.Probe && !noProbe
		if !probing {
			if r, ok := probe.Cached(path, popts); ok {
				if fsKey != "" {
					memoize(fsKey, r)
				}
				pb.ReadBps, pb.WriteBps, pb.Source = r.ReadBps, r.WriteBps, BandwidthFromCache
				pb.Detail = cacheDetail(r)
			} else {
				pb.Detail = "no cached measurement, and probing is off (zinf.bandwidth.probe)"
			}
			out.Paths = append(out.Paths, pb)
			continue
		}
		if err := swapper.CheckFreeSpace([]string{path}, 2*int64(bw.ProbeBytes)); err != nil {
			// The probe would fill the disk the swap files need.
			pb.Detail = fmt.Sprintf("not probed: %v", err)
			out.Paths = append(out.Paths, pb)
			continue
		}
		if engine == nil {
			e, err := aio.New(s.Engine)
			if err != nil {
				pb.Detail = fmt.Sprintf("no I/O engine to probe with: %v", err)
				log.Warn("zinf: cannot probe the NVMe bandwidth; planning with the default figures", "path", path, "err", err)
				out.Paths = append(out.Paths, pb)
				continue
			}
			engine = e
		}
		pctx, cancel := context.WithTimeout(ctx, BandwidthProbeTimeout)
		r, err := probe.Bandwidth(pctx, path, engine, popts)
		cancel()
		if err == nil && fsKey != "" {
			memoize(fsKey, r)
		}
		switch {
		case err == nil && r.Cached:
			pb.ReadBps, pb.WriteBps, pb.Source = r.ReadBps, r.WriteBps, BandwidthFromCache
			pb.Detail = cacheDetail(r)
		case err == nil:
			pb.ReadBps, pb.WriteBps, pb.Source = r.ReadBps, r.WriteBps, BandwidthFromProbe
			pb.Detail = fmt.Sprintf("%s each way, cached in %s", units.FormatBytes(r.ProbeBytes), probe.CacheName)
			if deferCache {
				pending = append(pending, pendingProbe{path: path, r: r})
			}
		case ctx.Err() != nil:
			return Bandwidth{}, nil, fmt.Errorf("zinf: probing the bandwidth of %s: %w", path, ctx.Err())
		default:
			pb.Detail = fmt.Sprintf("the probe failed: %v", err)
			log.Warn("zinf: the NVMe bandwidth probe failed; planning with the default figures (set zinf.bandwidth.* to give them)", "path", path, "err", err)
		}
		out.Paths = append(out.Paths, pb)
	}
	return out, pending, nil
}

// The process keeps what it measured or read per filesystem, so that
// several ranks, or runtimes opened one after another on fresh
// directories of one filesystem, probe it once.
var (
	memoMu sync.Mutex
	memo   = map[string]probe.Result{}
)

func memoized(key string) (probe.Result, bool) {
	if key == "" {
		return probe.Result{}, false
	}
	memoMu.Lock()
	defer memoMu.Unlock()
	r, ok := memo[key]
	if !ok || time.Since(r.Measured) > probe.DefaultMaxAge {
		return probe.Result{}, false
	}
	return r, true
}

func memoize(key string, r probe.Result) {
	memoMu.Lock()
	memo[key] = r
	memoMu.Unlock()
}

// forgetBandwidths empties the process's memory of measurements (tests).
func forgetBandwidths() {
	memoMu.Lock()
	clear(memo)
	memoMu.Unlock()
}

func cacheDetail(r probe.Result) string {
	return fmt.Sprintf("%s in the path, measured %s", probe.CacheName, r.Measured.Local().Format("2006-01-02 15:04"))
}
