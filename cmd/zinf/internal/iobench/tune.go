package iobench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
)

// TuneOptions describe a sweep, like DeepNVMe's ds_nvme_tune.
type TuneOptions struct {
	Dir        string
	SizeBytes  int64 // per run; default 256 MiB
	Loops      int   // timed loops per run; default 3
	Backends   []string
	BlockSizes []int // default 128 KiB, 256 KiB, 1 MiB, 4 MiB
	Depths     []int // default 4, 8, 32, 64
	Parallel   []int // default 1, 2
	Direct     aio.DirectPolicy
	// Progress receives a line per run with an estimate of the time left.
	Progress io.Writer
	// Logger receives engine warnings (default slog.Default()).
	Logger *slog.Logger
}

// TuneRow is one configuration's read and write medians.
type TuneRow struct {
	Backend      string
	BlockSize    int
	QueueDepth   int
	Parallel     int
	SingleSubmit bool
	Overlap      bool
	ReadGBps     float64
	WriteGBps    float64
}

// Score is the geometric mean of read and write bandwidth: a configuration
// must be good at both to win.
func (r TuneRow) Score() float64 { return math.Sqrt(r.ReadGBps * r.WriteGBps) }

// TuneResult is the sweep's table and its best row.
type TuneResult struct {
	Rows []TuneRow
	Best TuneRow
}

func (t *TuneOptions) defaults() {
	if t.SizeBytes == 0 {
		t.SizeBytes = 256 << 20
	}
	if t.Loops == 0 {
		t.Loops = 3
	}
	if len(t.Backends) == 0 {
		for _, b := range aio.Backends {
			if aio.Available(b) == nil {
				t.Backends = append(t.Backends, b)
			}
		}
	}
	if len(t.BlockSizes) == 0 {
		t.BlockSizes = []int{128 << 10, 256 << 10, 1 << 20, 4 << 20}
	}
	if len(t.Depths) == 0 {
		t.Depths = []int{4, 8, 32, 64}
	}
	if len(t.Parallel) == 0 {
		t.Parallel = []int{1, 2}
	}
}

// Check validates the whole sweep before anything is written: the path,
// the size, the loops and every value of the grid (backends known and
// available here, block sizes valid and multiples of the path's O_DIRECT
// alignment, queue depths and parallelism in range), reporting every
// problem at once. Zero fields are checked with their defaults.
func (t *TuneOptions) Check() error {
	c := *t
	c.defaults()
	var errs []error
	if c.Loops < 0 {
		errs = append(errs, fmt.Errorf("--loops %d is invalid: it must be at least 1", c.Loops))
	}
	for _, b := range c.Backends {
		switch b {
		case aio.BackendAuto, aio.BackendUring, aio.BackendLibaio, aio.BackendPosix:
			if err := aio.Available(b); err != nil {
				errs = append(errs, fmt.Errorf("--backends: %s: %w", b, err))
			}
		default:
			errs = append(errs, fmt.Errorf("--backends: %q is unknown (allowed: %s)", b, strings.Join(aio.Backends, ", ")))
		}
	}
	for _, bs := range c.BlockSizes {
		if bs > 1<<30 {
			errs = append(errs, fmt.Errorf("--block-sizes: %d is too large (at most 1GiB)", bs))
		} else if err := (&aio.Options{Backend: aio.BackendAuto, BlockSizeBytes: bs, QueueDepth: 1, IntraOpParallelism: 1}).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--block-sizes: %w", err))
		}
	}
	for _, qd := range c.Depths {
		if qd < 1 || qd > aio.MaxQueueDepth {
			errs = append(errs, fmt.Errorf("--queue-depths: %d is invalid (allowed: 1..%d)", qd, aio.MaxQueueDepth))
		}
	}
	for _, p := range c.Parallel {
		if p < 1 || p > aio.MaxIntraOpParallelism {
			errs = append(errs, fmt.Errorf("--parallel: %d is invalid (allowed: 1..%d)", p, aio.MaxIntraOpParallelism))
		}
	}
	// The path, the size and the direct policy, without the block size
	// (checked against the alignment below, each one by name).
	probe := Options{Dir: c.Dir, SizeBytes: c.SizeBytes, Op: "read", Engine: aio.Options{Backend: aio.BackendPosix, Direct: aio.DirectOff}}
	if err := probe.Check(); err != nil {
		errs = append(errs, err)
	} else if c.Direct != aio.DirectOff {
		align, _, err := aio.ProbeDir(c.Dir, c.Direct)
		switch {
		case err != nil:
			errs = append(errs, err)
		case align > 1:
			if c.SizeBytes%int64(align) != 0 {
				errs = append(errs, fmt.Errorf("--size %d must be a multiple of the O_DIRECT alignment %d of %s (or use --direct off)", c.SizeBytes, align, c.Dir))
			}
			for _, bs := range c.BlockSizes {
				if bs > 0 && bs%align != 0 {
					errs = append(errs, fmt.Errorf("--block-sizes: %d must be a multiple of the O_DIRECT alignment %d of %s (or use --direct off)", bs, align, c.Dir))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Tune sweeps in two stages: block size x queue depth per backend (one
// worker, batched submits, overlapped events), then, for each backend's
// best, parallelism x single-submit x overlap-events. Each run measures a
// read and a write of SizeBytes.
func Tune(ctx context.Context, t TuneOptions) (*TuneResult, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	t.defaults()
	type cfg struct {
		backend       string
		bs, qd, par   int
		single, noOvl bool
	}
	// Stage 2 measures 4 submit/overlap variants per parallelism value, less
	// the one stage 1 already measured when the list holds 1.
	stage2 := 0
	for _, p := range t.Parallel {
		stage2 += 4
		if p == 1 {
			stage2--
		}
	}
	total := len(t.Backends)*len(t.BlockSizes)*len(t.Depths) + len(t.Backends)*stage2
	done := 0
	start := time.Now()
	res := &TuneResult{}
	// Every configuration rewrites the file, so it lives in a directory
	// only this user can enter, created (and removed) by this run.
	rd, err := privateDir(t.Dir, "tune", t.Logger)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	pdir := rd.Path()
	const file = "zinf-tune.dat"
	measure := func(c cfg) (TuneRow, error) {
		row := TuneRow{Backend: c.backend, BlockSize: c.bs, QueueDepth: c.qd, Parallel: c.par, SingleSubmit: c.single, Overlap: !c.noOvl}
		for _, op := range []string{"write", "read"} {
			o := Options{Dir: pdir, private: true, SizeBytes: t.SizeBytes, Op: op, Loops: t.Loops, Warmup: 1, Keep: true, FileName: file, Logger: t.Logger,
				Engine: aio.Options{Backend: c.backend, BlockSizeBytes: c.bs, QueueDepth: c.qd, IntraOpParallelism: c.par,
					SingleSubmit: c.single, SerialEvents: c.noOvl, Direct: t.Direct}}
			r, err := Run(ctx, o)
			if err != nil {
				return row, fmt.Errorf("%s bs=%d qd=%d par=%d: %w", c.backend, c.bs, c.qd, c.par, err)
			}
			if op == "read" {
				row.ReadGBps = r.GBpsMedian
			} else {
				row.WriteGBps = r.GBpsMedian
			}
		}
		done++
		if t.Progress != nil {
			el := time.Since(start)
			left := time.Duration(float64(el) / float64(done) * float64(total-done))
			fmt.Fprintf(t.Progress, "[%3d/%d] %-6s bs=%-7d qd=%-3d par=%d single=%-5v overlap=%-5v read %6.3f GB/s  write %6.3f GB/s  (about %s left)\n",
				done, total, c.backend, c.bs, c.qd, c.par, c.single, !c.noOvl, row.ReadGBps, row.WriteGBps, left.Round(time.Second))
		}
		res.Rows = append(res.Rows, row)
		return row, nil
	}
	for _, b := range t.Backends {
		var best TuneRow
		for _, bs := range t.BlockSizes {
			for _, qd := range t.Depths {
				row, err := measure(cfg{backend: b, bs: bs, qd: qd, par: 1})
				if err != nil {
					return nil, err
				}
				if row.Score() > best.Score() {
					best = row
				}
			}
		}
		for _, par := range t.Parallel {
			for _, single := range []bool{false, true} {
				for _, noOvl := range []bool{false, true} {
					if par == 1 && !single && !noOvl {
						continue // measured in stage 1
					}
					if _, err := measure(cfg{backend: b, bs: best.BlockSize, qd: best.QueueDepth, par: par, single: single, noOvl: noOvl}); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	for _, r := range res.Rows {
		if r.Score() > res.Best.Score() {
			res.Best = r
		}
	}
	return res, nil
}

// WriteTable prints the rows, best first.
func (r *TuneResult) WriteTable(w io.Writer) error {
	rows := append([]TuneRow(nil), r.Rows...)
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Score() > rows[j].Score() })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tblock\tqd\tparallel\tsingle_submit\toverlap_events\tread GB/s\twrite GB/s\tscore\t")
	for _, x := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%v\t%v\t%.3f\t%.3f\t%.3f\t\n", x.Backend, x.BlockSize, x.QueueDepth, x.Parallel, x.SingleSubmit, x.Overlap, x.ReadGBps, x.WriteGBps, x.Score())
	}
	return tw.Flush()
}

// ConfigSection renders the config that reproduces the best row: the
// DeepSpeed "aio" section plus zinf's backend choice, with exact keys and
// JSON types.
func (r *TuneResult) ConfigSection() ([]byte, error) {
	b := r.Best
	a := config.Default().AIO
	a.BlockSize = config.Size(b.BlockSize)
	a.QueueDepth = b.QueueDepth
	a.IntraOpParallelism = b.Parallel
	a.SingleSubmit = b.SingleSubmit
	a.OverlapEvents = b.Overlap
	sec, err := config.AIOSection(a)
	if err != nil {
		return nil, err
	}
	var sections map[string]json.RawMessage
	if err := json.Unmarshal(sec, &sections); err != nil {
		return nil, err
	}
	raw := fmt.Sprintf(`{"aio": %s, "zinf": {"backend": %q}}`, sections["aio"], b.Backend)
	var out bytes.Buffer
	if err := json.Indent(&out, []byte(raw), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
