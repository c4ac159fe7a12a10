package ckptbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/swapper"
)

// CompareOptions configure CompareSave.
type CompareOptions struct {
	// Dir is the directory written to (created if missing); the
	// checkpoints and fio's files are removed after each run.
	Dir string
	// SizeBytes is the checkpoint size. Default 4 GiB.
	SizeBytes int64
	// Rounds is the number of interleaved rounds. Default 3.
	Rounds int
	// Save configures the checkpoint writer (staging buffers, their size,
	// files written at once); defaults as in SaveOptions. fio runs the same
	// shape: Parallel jobs, each writing its own file sequentially in
	// StagingBytes blocks with StagingBuffers in flight.
	Save checkpoint.SaveOptions
	// Engine configures the writer's engine. With none of Backend (other
	// than auto), BlockSizeBytes, QueueDepth, IntraOpParallelism,
	// SingleSubmit or SerialEvents set, the saves use the Writer's and
	// Saver's own engine, as a user of the checkpoint package gets it
	// (checkpoint.WriterEngineOptions, its pinned memory registered with
	// it), and CompareSave fails unless that engine gets O_DIRECT on Dir:
	// the comparison is O_DIRECT against O_DIRECT. Otherwise this engine
	// does the writes, with Direct forced to required and zero fields as
	// WriterEngineOptions fills them.
	Engine aio.Options
	// FioPath is the fio binary; default "fio" from PATH. Fio is required
	// unless NoFio.
	FioPath string
	NoFio   bool
	// FioEngine is fio's ioengine; default io_uring (libaio where the
	// writer's backend is libaio).
	FioEngine string
	// Naive adds the naive Go writer (encoding/binary through bufio to an
	// os.File, then fsync) to each round; Async adds an asynchronous save
	// (Saver.SaveAsync, then Wait) to each round, timing how long it holds
	// the caller; Cold adds a one-shot checkpoint.Save, whose Writer makes
	// its engine and pinned memory within the call (what a job calling
	// checkpoint.Save or zinf.SaveCheckpoint each time pays).
	Naive, Async, Cold bool
	// PatternBytes is the size of the repeating source the synthetic
	// tensors are copied from; default 64 MiB, more than the CPU caches, so
	// copying a tensor reads DRAM as copying a real one would.
	PatternBytes int
	// Source is where the synthetic tensors live: "memory" (default:
	// produced by a copy, as from tensors in RAM; SaveAsync copies them
	// into its snapshot) or "store" (written first, untimed, into a
	// swapper.Store under Dir, as zinf's NVMe-tier tensors are: Save reads
	// them back from the disk it writes to, and SaveAsync pins their
	// versions instead of copying them).
	Source string
	// Progress receives a line per run (nil: silent).
	Progress io.Writer
}

// Sources of CompareOptions.Source.
const (
	SourceMemory = "memory"
	SourceStore  = "store"
)

// CompareResult holds every run of CompareSave. Bandwidths are in GB/s
// (1e9 bytes per second), times in seconds.
type CompareResult struct {
	Bytes      int64    `json:"bytes"`
	Source     string   `json:"source"`
	Rounds     int      `json:"rounds"`
	Backend    string   `json:"backend"`
	BlockBytes int      `json:"block_bytes"`
	QueueDepth int      `json:"queue_depth_per_file"`
	Files      int      `json:"files"`
	FioArgs    []string `json:"fio_args,omitempty"`
	When       string   `json:"when"`

	SaveGBps  []float64 `json:"save_gbps"`
	FioGBps   []float64 `json:"fio_gbps,omitempty"`
	NaiveGBps []float64 `json:"naive_gbps,omitempty"`
	// AsyncGBps is the asynchronous save's bandwidth until its commit;
	// AsyncStallSec the time SaveAsync held the caller (the snapshot).
	AsyncGBps     []float64 `json:"async_gbps,omitempty"`
	AsyncStallSec []float64 `json:"async_stall_s,omitempty"`
	SaveSec       []float64 `json:"save_s"`
	// ColdGBps is the one-shot checkpoint.Save's bandwidth (Cold).
	ColdGBps []float64 `json:"cold_gbps,omitempty"`
	// SaveOverFioRounds is zinf Save over fio per round; FioFirst says
	// which rounds ran fio first (the order alternates).
	SaveOverFioRounds []float64 `json:"save_over_fio_rounds,omitempty"`
	FioFirst          []bool    `json:"fio_first,omitempty"`

	SaveMedian       float64 `json:"save_gbps_median"`
	ColdMedian       float64 `json:"cold_gbps_median,omitempty"`
	FioMedian        float64 `json:"fio_gbps_median,omitempty"`
	NaiveMedian      float64 `json:"naive_gbps_median,omitempty"`
	AsyncMedian      float64 `json:"async_gbps_median,omitempty"`
	StallMedianSec   float64 `json:"async_stall_s_median,omitempty"`
	SaveOverFio      float64 `json:"save_over_fio,omitempty"`
	NaiveOverFio     float64 `json:"naive_over_fio,omitempty"`
	StallOverSaveSec float64 `json:"async_stall_over_save,omitempty"`
}

// CompareSave measures, in the same run and interleaved round by round,
// a synchronous Save of SizeBytes of synthetic float32 tensors, fio's
// sequential O_DIRECT write of the same number of bytes in the same shape
// on the same directory (with --end_fsync=1, fresh files each time, as a
// checkpoint is), and optionally the naive Go writer and an asynchronous
// save. Medians and ratios are filled in. Every variant ends durable
// (fdatasync or fsync), and each run's files are removed before the next.
func CompareSave(ctx context.Context, o CompareOptions) (*CompareResult, error) {
	if o.Dir == "" {
		return nil, errorf("CompareOptions.Dir is required")
	}
	if o.SizeBytes == 0 {
		o.SizeBytes = 4 << 30
	}
	if o.SizeBytes < 0 {
		return nil, errorf("SizeBytes %d must be positive", o.SizeBytes)
	}
	if o.Rounds == 0 {
		o.Rounds = 3
	}
	if o.PatternBytes == 0 {
		o.PatternBytes = 64 << 20
	}
	switch o.Source {
	case "":
		o.Source = SourceMemory
	case SourceMemory, SourceStore:
	default:
		return nil, errorf("Source %q (allowed: %s, %s)", o.Source, SourceMemory, SourceStore)
	}
	opts := o.Save
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.Overwrite, opts.KeepLast = true, 0
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	eo := o.Engine
	custom := eo.Backend != "" && eo.Backend != aio.BackendAuto || eo.BlockSizeBytes != 0 || eo.QueueDepth != 0 ||
		eo.IntraOpParallelism != 0 || eo.SingleSubmit || eo.SerialEvents
	def := checkpoint.WriterEngineOptions(opts)
	if eo.BlockSizeBytes == 0 {
		eo.BlockSizeBytes = def.BlockSizeBytes
	}
	if eo.QueueDepth == 0 {
		eo.QueueDepth = def.QueueDepth
	}
	if eo.IntraOpParallelism == 0 {
		eo.IntraOpParallelism = def.IntraOpParallelism
	}
	eo.Direct = aio.DirectRequired
	// eng does the writes when custom; otherwise it only stands for the
	// writers' own engines (same options, O_DIRECT required) to check
	// O_DIRECT and name the backend.
	eng, err := aio.New(eo)
	if err != nil {
		return nil, fmt.Errorf("ckptbench: the writer's engine (O_DIRECT required): %w", err)
	}
	defer eng.Close()
	if custom {
		opts.Engine = eng
	} else if !aioDirect(eng, o.Dir) {
		return nil, fmt.Errorf("ckptbench: %s does not take O_DIRECT writes; the comparison with fio is O_DIRECT against O_DIRECT", o.Dir)
	}
	fioPath := o.FioPath
	if !o.NoFio {
		if fioPath == "" {
			fioPath = "fio"
		}
		if fioPath, err = exec.LookPath(fioPath); err != nil {
			return nil, fmt.Errorf("ckptbench: fio not found (apt-get install -y fio, or NoFio): %w", err)
		}
	}
	fioEngine := o.FioEngine
	if fioEngine == "" {
		fioEngine = "io_uring"
		if eng.Name() == aio.BackendLibaio {
			fioEngine = "libaio"
		}
	}
	res := &CompareResult{Bytes: o.SizeBytes, Source: o.Source, Rounds: o.Rounds, Backend: eng.Name(), BlockBytes: opts.StagingBytes,
		QueueDepth: opts.StagingBuffers, Files: opts.Parallel, When: time.Now().UTC().Format(time.RFC3339)}
	progress := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, format, args...)
		}
	}

	state := benchStateWith(o.SizeBytes, opts.Parallel, o.PatternBytes)
	var naive [][]float32
	if o.Naive {
		naive = naiveTensors(state)
	}
	if o.Source == SourceStore {
		progress("writing %d bytes of tensors into a swap store under %s (untimed)\n", o.SizeBytes, o.Dir)
		st, closeStore, err := storeState(ctx, o.Dir, state, opts.Logger)
		if err != nil {
			return nil, err
		}
		defer closeStore()
		state = st
	}
	w := checkpoint.NewWriter()
	defer w.Close()
	var saver *checkpoint.Saver
	if o.Async {
		saver = checkpoint.NewSaver(checkpoint.SaverOptions{Logger: opts.Logger})
		defer saver.Close()
	}
	// Warm-ups, untimed: the engine's rings, the Writer's and the Saver's
	// pinned memory are set up once, as in a training job that keeps them.
	warm := filepath.Join(o.Dir, "zinf-ckptbench-warmup")
	if _, err := w.Save(ctx, warm, benchStateWith(int64(opts.Parallel)*int64(opts.StagingBytes), opts.Parallel, o.PatternBytes), opts); err != nil {
		return nil, err
	}
	os.RemoveAll(warm)
	if saver != nil {
		// The Saver's pool is as large as the checkpoint: map it now.
		h, err := saver.SaveAsync(ctx, warm, state, opts)
		if err != nil {
			return nil, err
		}
		if _, err := h.Wait(); err != nil {
			return nil, err
		}
		os.RemoveAll(warm)
	}
	target := filepath.Join(o.Dir, "zinf-ckptbench")
	// The bytes fio writes: the checkpoint's, known after the warm-up
	// from the plan (the same state every round).
	ckptBytes := int64(0)
	for round := 1; round <= o.Rounds; round++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var saveGBps, fioGBps float64
		zinfSave := func() error {
			t0 := time.Now()
			m, err := w.Save(ctx, target, state, opts)
			secs := time.Since(t0).Seconds()
			if err != nil {
				return err
			}
			n := manifestBytes(m)
			os.RemoveAll(target)
			res.Bytes, ckptBytes = n, n
			saveGBps = float64(n) / secs / 1e9
			res.SaveGBps = append(res.SaveGBps, saveGBps)
			res.SaveSec = append(res.SaveSec, secs)
			progress("round %d/%d  zinf save   %.3f GB/s (%.2f s)\n", round, o.Rounds, saveGBps, secs)
			return nil
		}
		fio := func() error {
			n := ckptBytes
			if n == 0 {
				n = o.SizeBytes
			}
			gbps, args, err := fioWrite(ctx, fioPath, o.Dir, fioEngine, n, opts)
			if err != nil {
				return err
			}
			res.FioArgs = args
			fioGBps = gbps
			res.FioGBps = append(res.FioGBps, gbps)
			progress("round %d/%d  fio write   %.3f GB/s\n", round, o.Rounds, gbps)
			return nil
		}
		// The order alternates, so neither side always follows the other
		// on a disk whose speed drifts.
		fioFirst := !o.NoFio && round%2 == 0
		first, second := zinfSave, fio
		if fioFirst {
			first, second = fio, zinfSave
		}
		if err := first(); err != nil {
			return nil, err
		}
		if !o.NoFio {
			if err := second(); err != nil {
				return nil, err
			}
		}
		if !o.NoFio {
			res.FioFirst = append(res.FioFirst, fioFirst)
			res.SaveOverFioRounds = append(res.SaveOverFioRounds, saveGBps/fioGBps)
		}
		if o.Cold {
			coldOpts := opts
			coldOpts.Engine = opts.Engine // nil unless custom: the one-shot Writer makes its own
			t0 := time.Now()
			m, err := checkpoint.Save(ctx, target, state, coldOpts)
			secs := time.Since(t0).Seconds()
			if err != nil {
				return nil, err
			}
			os.RemoveAll(target)
			g := float64(manifestBytes(m)) / secs / 1e9
			res.ColdGBps = append(res.ColdGBps, g)
			progress("round %d/%d  zinf one-shot checkpoint.Save %.3f GB/s (%.2f s)\n", round, o.Rounds, g, secs)
		}
		if saver != nil {
			t0 := time.Now()
			h, err := saver.SaveAsync(ctx, target, state, opts)
			stall := time.Since(t0).Seconds()
			if err != nil {
				return nil, err
			}
			m, err := h.Wait()
			total := time.Since(t0).Seconds()
			if err != nil {
				return nil, err
			}
			os.RemoveAll(target)
			res.AsyncGBps = append(res.AsyncGBps, float64(manifestBytes(m))/total/1e9)
			res.AsyncStallSec = append(res.AsyncStallSec, stall)
			progress("round %d/%d  zinf async  %.3f GB/s (%.2f s), SaveAsync held the caller %.3f s\n", round, o.Rounds, float64(manifestBytes(m))/total/1e9, total, stall)
		}
		if naive != nil {
			dir := filepath.Join(o.Dir, "zinf-ckptbench-naive")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			t0 := time.Now()
			nb, err := naiveWrite(filepath.Join(dir, "naive.safetensors"), naive)
			secs := time.Since(t0).Seconds()
			os.RemoveAll(dir)
			if err != nil {
				return nil, err
			}
			res.NaiveGBps = append(res.NaiveGBps, float64(nb)/secs/1e9)
			progress("round %d/%d  naive Go    %.3f GB/s\n", round, o.Rounds, float64(nb)/secs/1e9)
		}
	}
	res.SaveMedian = median(res.SaveGBps)
	res.ColdMedian = median(res.ColdGBps)
	res.FioMedian = median(res.FioGBps)
	res.NaiveMedian = median(res.NaiveGBps)
	res.AsyncMedian = median(res.AsyncGBps)
	res.StallMedianSec = median(res.AsyncStallSec)
	if res.FioMedian > 0 {
		res.SaveOverFio = res.SaveMedian / res.FioMedian
		res.NaiveOverFio = res.NaiveMedian / res.FioMedian
	}
	if s := median(res.SaveSec); s > 0 && len(res.AsyncStallSec) > 0 {
		res.StallOverSaveSec = res.StallMedianSec / s
	}
	return res, nil
}

// WriteTable prints the medians and ratios.
func (r *CompareResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "checkpoint of %d bytes in %d files, tensors in %s, %d rounds interleaved; writer: backend %s, O_DIRECT, %d-byte writes, %d in flight per file\n",
		r.Bytes, r.Files, r.Source, r.Rounds, r.Backend, r.BlockBytes, r.QueueDepth)
	if len(r.FioArgs) > 0 {
		fmt.Fprintf(w, "fio: %s\n", joinArgs(r.FioArgs))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\tmedian GB/s\t(min..max)\tvs fio")
	row := func(name string, v []float64, ratio float64) {
		if len(v) == 0 {
			return
		}
		lo, hi := slices.Min(v), slices.Max(v)
		rs := "-"
		if ratio > 0 {
			rs = fmt.Sprintf("%.2fx", ratio)
		}
		fmt.Fprintf(tw, "%s\t%.3f\t(%.3f..%.3f)\t%s\n", name, median(v), lo, hi, rs)
	}
	row("fio write", r.FioGBps, 0)
	row("zinf Save", r.SaveGBps, r.SaveOverFio)
	if r.FioMedian > 0 {
		row("zinf one-shot checkpoint.Save", r.ColdGBps, r.ColdMedian/r.FioMedian)
	} else {
		row("zinf one-shot checkpoint.Save", r.ColdGBps, 0)
	}
	if r.FioMedian > 0 {
		row("zinf SaveAsync (to commit)", r.AsyncGBps, r.AsyncMedian/r.FioMedian)
	} else {
		row("zinf SaveAsync (to commit)", r.AsyncGBps, 0)
	}
	row("naive Go (bufio+binary+fsync)", r.NaiveGBps, r.NaiveOverFio)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.SaveOverFioRounds) > 0 {
		fmt.Fprintf(w, "zinf Save / fio per round (order alternating): median %.2fx (min %.2f, max %.2f)\n",
			median(r.SaveOverFioRounds), slices.Min(r.SaveOverFioRounds), slices.Max(r.SaveOverFioRounds))
	}
	if len(r.AsyncStallSec) > 0 {
		_, err := fmt.Fprintf(w, "SaveAsync held the caller: median %.3f s (min %.3f, max %.3f) = %.2f%% of the synchronous save (median %.3f s)\n",
			r.StallMedianSec, slices.Min(r.AsyncStallSec), slices.Max(r.AsyncStallSec), 100*r.StallOverSaveSec, median(r.SaveSec))
		return err
	}
	return nil
}

func joinArgs(a []string) string {
	var b bytes.Buffer
	for i, s := range a {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s)
	}
	return b.String()
}

// fioWrite runs fio shaped like the checkpoint writer: Parallel jobs, each
// writing a fresh file of size/Parallel sequentially in StagingBytes
// blocks, StagingBuffers deep, O_DIRECT, fsync'ed at the end, the files
// unlinked afterwards. It returns the aggregate bandwidth (the group's
// bytes over its runtime, which is the slowest job's and includes the
// end_fsync).
func fioWrite(ctx context.Context, fio, dir, engine string, size int64, opts checkpoint.SaveOptions) (float64, []string, error) {
	per := size / int64(opts.Parallel) / int64(opts.StagingBytes) * int64(opts.StagingBytes)
	if per == 0 {
		per = int64(opts.StagingBytes)
	}
	args := []string{"--name=zinf-ckptbench", "--directory=" + dir, "--rw=write",
		"--bs=" + strconv.Itoa(opts.StagingBytes), "--iodepth=" + strconv.Itoa(opts.StagingBuffers),
		"--numjobs=" + strconv.Itoa(opts.Parallel), "--size=" + strconv.FormatInt(per, 10),
		"--direct=1", "--ioengine=" + engine, "--end_fsync=1", "--fallocate=none", "--unlink=1",
		"--group_reporting", "--output-format=json"}
	rep, err := iobench.RunFio(ctx, fio, args)
	if err != nil {
		return 0, args, err
	}
	if gbps := rep.Write.GBps(); gbps > 0 {
		return gbps, args, nil
	}
	return 0, args, errors.New("fio reported no write bandwidth")
}

func manifestBytes(m *checkpoint.Manifest) int64 {
	var n int64
	for _, rm := range m.RankManifests {
		for _, f := range rm.Files {
			n += f.Bytes
		}
	}
	return n
}

// naiveTensors materializes state's tensors as []float32 in the Go heap,
// as the naive writer holds them.
func naiveTensors(st checkpoint.State) [][]float32 {
	var out [][]float32
	for _, f := range st.Ranks[0].Files {
		for _, t := range f.Tensors {
			v := make([]float32, t.Bytes/4)
			_ = t.Read(context.Background(), buffers.AsBytes(v), 0)
			out = append(out, v)
		}
	}
	return out
}

func median(v []float64) float64 {
	return stats.Median(v)
}

// storeState writes st's tensors into a new swap store under dir and
// returns the same state with FromStore tensors, and a function that
// closes (and removes) the store.
func storeState(ctx context.Context, dir string, st checkpoint.State, log *slog.Logger) (checkpoint.State, func(), error) {
	eng, err := aio.New(aio.Options{Backend: aio.BackendAuto, Direct: aio.DirectOptional, IntraOpParallelism: 2, Logger: log})
	if err != nil {
		return checkpoint.State{}, nil, err
	}
	store, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: eng, Name: "ckptbench", Logger: log})
	if err != nil {
		eng.Close()
		return checkpoint.State{}, nil, err
	}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 2 * benchTensorBytes, MinBufferBytes: int(max(store.Alignment(), 4096)), Logger: log})
	closeAll := func() {
		if pool != nil {
			pool.Close()
		}
		store.Close()
		eng.Close()
	}
	if err != nil {
		closeAll()
		return checkpoint.State{}, nil, err
	}
	out := checkpoint.State{Step: st.Step}
	for _, r := range st.Ranks {
		nr := checkpoint.RankState{Rank: r.Rank}
		for _, f := range r.Files {
			nf := checkpoint.TensorFile{Name: f.Name}
			for _, t := range f.Tensors {
				b, err := pool.Acquire(ctx, int(store.PaddedLen(t.Bytes)), buffers.PurposeCheckpoint)
				if err != nil {
					closeAll()
					return checkpoint.State{}, nil, err
				}
				err = t.Read(ctx, b.Bytes()[:t.Bytes], 0)
				if err == nil {
					err = store.Write(ctx, t.Name, b.Bytes()[:t.Bytes])
				}
				b.Release()
				if err != nil {
					closeAll()
					return checkpoint.State{}, nil, err
				}
				nf.Tensors = append(nf.Tensors, checkpoint.FromStore(store, t.Name, t.DType, t.Shape))
			}
			nr.Files = append(nr.Files, nf)
		}
		out.Ranks = append(out.Ranks, nr)
	}
	return out, closeAll, nil
}
