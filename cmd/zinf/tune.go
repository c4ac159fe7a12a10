package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
	"github.com/zinfio/zinf/cmd/zinf/internal/plots"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/probe"
)

func init() {
	register("tune", "sweep I/O settings on a path and emit the best config section (like ds_nvme_tune)", runTune)
}

func runTune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("tune", stderr)
	var (
		t                       iobench.TuneOptions
		backends, bss, qds, pps string
		direct, plotPath        string
	)
	fs.StringVar(&t.Dir, "path", "", "directory on the device to tune (required)")
	sizeVar(fs, &t.SizeBytes, "size", 256<<20, "bytes per run")
	fs.IntVar(&t.Loops, "loops", 3, "timed loops per run")
	fs.StringVar(&backends, "backends", "", "comma-separated backends (default: every available one)")
	fs.StringVar(&bss, "block-sizes", "128KiB,256KiB,1MiB,4MiB", "comma-separated block sizes")
	fs.StringVar(&qds, "queue-depths", "4,8,32,64", "comma-separated queue depths")
	fs.StringVar(&pps, "parallel", "1,2", "comma-separated intra-op parallelism values")
	fs.StringVar(&direct, "direct", "optional", "O_DIRECT policy: required, optional, off")
	var bwFile string
	fs.StringVar(&bwFile, "bandwidth-file", "", "also record the best read/write bandwidth for --path in this results file (created, or updated when it is one), for zinf.bandwidth.file")
	fs.StringVar(&plotPath, "plot", "", "also draw read and write GB/s by block size and queue depth into this new .svg or .png file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// The picture's name is checked before minutes of sweeping.
	if err := checkNewPicture("--plot", plotPath); err != nil {
		return err
	}
	var err error
	if t.Direct, err = aio.ParseDirectPolicy(direct); err != nil {
		return fmt.Errorf("--direct: %w", err)
	}
	if backends != "" {
		for _, b := range strings.Split(backends, ",") {
			t.Backends = append(t.Backends, strings.TrimSpace(b))
		}
	}
	if t.BlockSizes, err = parseList(bss, "--block-sizes", config.ParseSize); err != nil {
		return err
	}
	atoi := func(s string) (int64, error) { n, err := strconv.Atoi(s); return int64(n), err }
	if t.Depths, err = parseList(qds, "--queue-depths", atoi); err != nil {
		return err
	}
	if t.Parallel, err = parseList(pps, "--parallel", atoi); err != nil {
		return err
	}
	// Zero would silently mean "the default" below the command line.
	if t.SizeBytes <= 0 {
		return fmt.Errorf("--size %d is invalid: it must be positive (e.g. 256MiB)", t.SizeBytes)
	}
	if t.Loops <= 0 {
		return fmt.Errorf("--loops %d is invalid: it must be at least 1", t.Loops)
	}
	// The whole grid is checked before the first run, not when a bad value
	// is reached minutes later.
	if err := t.Check(); err != nil {
		return err
	}
	if err := checkBandwidthFile(bwFile); err != nil {
		return err
	}
	if err := errors.Join(checkMemory("--size", t.SizeBytes, nextPow2(max(t.SizeBytes, 1<<20)), "each run's buffer (one pinned buffer of --size, in a pool rounded up to a power of two)"),
		checkDisk("--size", t.SizeBytes, t.SizeBytes, t.Dir)); err != nil {
		return err
	}
	t.Progress = stderr
	t.Logger = cliLogger(stderr)
	fmt.Fprintf(stderr, "tuning %s: this runs a read and a write of %s per configuration and takes minutes\n", t.Dir, config.Size(t.SizeBytes))
	res, err := iobench.Tune(ctx, t)
	if err != nil {
		return err
	}
	if err := res.WriteTable(stdout); err != nil {
		return err
	}
	b := res.Best
	fmt.Fprintf(stdout, "\nbest: backend %s, block %d, queue depth %d, parallel %d, single_submit %v, overlap_events %v: read %.3f GB/s, write %.3f GB/s\n\n",
		b.Backend, b.BlockSize, b.QueueDepth, b.Parallel, b.SingleSubmit, b.Overlap, b.ReadGBps, b.WriteGBps)
	sec, err := res.ConfigSection()
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "config section that reproduces it:")
	if _, err = stdout.Write(sec); err != nil {
		return err
	}
	if plotPath != "" {
		title := fmt.Sprintf("zinf tune %s (%s per run)", t.Dir, config.Size(t.SizeBytes))
		if err := writePicture("--plot", plotPath, func(w io.Writer, format string) error { return plots.Tune(w, format, res, title) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "plot: %s\n", plotPath)
	}
	if bwFile == "" {
		return nil
	}
	r := probe.PathResult{ReadBps: b.ReadGBps * 1e9, WriteBps: b.WriteGBps * 1e9, Measured: time.Now(),
		Method: fmt.Sprintf("zinf tune: backend %s, block %d, queue depth %d, parallel %d, %s per run, median of %d loops",
			b.Backend, b.BlockSize, b.QueueDepth, b.Parallel, config.Size(t.SizeBytes), t.Loops)}
	if err := probe.WriteResult(bwFile, t.Dir, r); err != nil {
		return fmt.Errorf("--bandwidth-file %s: %w", bwFile, err)
	}
	abs, _ := filepath.Abs(bwFile)
	fmt.Fprintf(stdout, "\nbandwidth of %s recorded in %s; point a config at it so the planner uses it:\n  \"zinf\": {\"bandwidth\": {\"file\": %q}}\n", t.Dir, bwFile, abs)
	return nil
}

// checkBandwidthFile refuses, before minutes of tuning, a --bandwidth-file
// that could not be written at the end: one in a directory that does not
// exist, or an existing file that is not a results file (zinf does not
// overwrite what it did not write).
func checkBandwidthFile(name string) error {
	if name == "" {
		return nil
	}
	st, err := os.Stat(filepath.Dir(name))
	if err != nil || !st.IsDir() {
		return fmt.Errorf("--bandwidth-file %s: its directory %s does not exist", name, filepath.Dir(name))
	}
	fi, err := os.Lstat(name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--bandwidth-file %s: %w", name, err)
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("--bandwidth-file %s is a symbolic link: not replacing it (give the file's own path)", name)
	}
	if _, err := probe.ReadResults(name); err != nil {
		return fmt.Errorf("--bandwidth-file %s exists and zinf will not replace it: %w", name, err)
	}
	return nil
}

func parseList(s, flagName string, parse func(string) (int64, error)) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := parse(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive value", flagName, f)
		}
		out = append(out, int(n))
	}
	return out, nil
}
