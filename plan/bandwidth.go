package plan

// The NVMe bandwidth a plan uses, and what measuring it reads of the
// config. Measuring (zinf.NVMeBandwidth) is the runtime's: this file reads
// no file and probes nothing.

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/base/units"
)

// Default NVMe bandwidths for a path nothing measured or configured:
// conservative figures for one datacenter NVMe drive. `zinf tune` and the
// probe at zinf.Open measure the real ones (see config.Bandwidth).
const (
	DefaultNVMeReadBps  = 2e9
	DefaultNVMeWriteBps = 1.5e9
)

// BandwidthSource says where a path's bandwidth figure came from.
type BandwidthSource string

// The sources, in the order they are tried.
const (
	// BandwidthFromConfig: zinf.bandwidth.read_bytes_per_sec and
	// write_bytes_per_sec.
	BandwidthFromConfig BandwidthSource = "config"
	// BandwidthFromFile: the path's entry in zinf.bandwidth.file (a `zinf
	// tune --bandwidth-file` result).
	BandwidthFromFile BandwidthSource = "tune file"
	// BandwidthFromCache: an earlier probe's result, cached in the path.
	BandwidthFromCache BandwidthSource = "probe cache"
	// BandwidthFromProbe: measured now.
	BandwidthFromProbe BandwidthSource = "probe"
	// BandwidthDefault: DefaultNVMeReadBps and DefaultNVMeWriteBps.
	BandwidthDefault BandwidthSource = "default"
)

// PathBandwidth is one NVMe path's sequential bandwidth and its source.
type PathBandwidth struct {
	Path              string
	ReadBps, WriteBps float64
	Source            BandwidthSource
	// Detail says more about the source: the file and entry, when the
	// probe measured, or why the default is used.
	Detail string
}

// Bandwidth is the NVMe bandwidth a plan uses: one entry per NVMe path of
// the config (config.Config.NVMePaths), in its order.
type Bandwidth struct {
	Paths []PathBandwidth
}

// ReadBps is the paths' read bandwidth added up (swap files are striped
// over them).
func (b Bandwidth) ReadBps() float64 {
	var s float64
	for _, p := range b.Paths {
		s += p.ReadBps
	}
	return s
}

// WriteBps is the paths' write bandwidth added up.
func (b Bandwidth) WriteBps() float64 {
	var s float64
	for _, p := range b.Paths {
		s += p.WriteBps
	}
	return s
}

// Source summarizes the paths' sources: the one source when they share
// it, else each with its count ("probe x1, default x1").
func (b Bandwidth) Source() string {
	count := map[BandwidthSource]int{}
	var order []BandwidthSource
	for _, p := range b.Paths {
		if count[p.Source] == 0 {
			order = append(order, p.Source)
		}
		count[p.Source]++
	}
	if len(order) == 1 {
		return string(order[0])
	}
	parts := make([]string, len(order))
	for i, s := range order {
		parts[i] = fmt.Sprintf("%s x%d", s, count[s])
	}
	return strings.Join(parts, ", ")
}

// String lists each path's figures and source, one per line.
func (b Bandwidth) String() string {
	var sb strings.Builder
	for _, p := range b.Paths {
		fmt.Fprintf(&sb, "  %s: read %s/s, write %s/s (%s", p.Path, units.FormatBytes(int64(p.ReadBps)), units.FormatBytes(int64(p.WriteBps)), p.Source)
		if p.Detail != "" {
			fmt.Fprintf(&sb, ": %s", p.Detail)
		}
		sb.WriteString(")\n")
	}
	return sb.String()
}

// StaticBandwidth is zinf.NVMeBandwidth without a file, a cache or a
// probe: the config's figures, else the defaults.
func StaticBandwidth(cfg *config.Config) Bandwidth {
	var bw Bandwidth
	z := cfg.Zinf.Bandwidth
	for _, p := range cfg.NVMePaths() {
		pb := PathBandwidth{Path: p, ReadBps: DefaultNVMeReadBps, WriteBps: DefaultNVMeWriteBps, Source: BandwidthDefault}
		if z.ReadBytesPerSec > 0 {
			pb.ReadBps, pb.WriteBps, pb.Source = float64(z.ReadBytesPerSec), float64(z.WriteBytesPerSec), BandwidthFromConfig
		}
		bw.Paths = append(bw.Paths, pb)
	}
	return bw
}

// BandwidthSettings is what measuring the NVMe bandwidth reads of a
// config: its paths, the zinf.bandwidth section, the tune file and the
// probe engine's options.
type BandwidthSettings struct {
	Paths  []string         // config.Config.NVMePaths
	Config config.Bandwidth // zinf.bandwidth
	File   string           // config.Config.BandwidthFile
	Engine aio.Options      // the probe's engine (EngineOptions, no fault hook)
}

// BandwidthSettingsOf is what measuring cfg's NVMe bandwidth reads of it;
// log goes to the probe's engine.
func BandwidthSettingsOf(cfg *config.Config, log *slog.Logger) BandwidthSettings {
	return BandwidthSettings{Engine: EngineOptions(cfg, log, nil), Config: cfg.Zinf.Bandwidth, File: cfg.BandwidthFile(), Paths: cfg.NVMePaths()}
}
